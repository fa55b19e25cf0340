"""Pipeline files: every problem reported at once, with its field path and line; overrides."""
from __future__ import annotations

import json

import pytest
import yaml

from compress.cli import main
from compress.errors import ConfigError
from compress.pipeline.pipeline_file import apply_override, load_pipeline
from compress.pipeline.schema import pipeline_json_schema
from tests.conftest import ROOT


def _write(tmp_path, text: str):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return path


BASE = "name: t\ndata: {name: digits}\nmodel: {name: resnet20}\n"


@pytest.mark.parametrize("stages, expected", [
    ("  - {name: train, kind: train, epochs: 0}\n",
     r"p\.yaml:5: stages\[0\]\.epochs: Input should be greater than or equal to 1, got 0"),
    ("  - {name: train, kind: train, optimiser: sgd}\n",
     r"stages\[0\]\.optimiser: unknown field; known fields: .*epochs.*optimizer"),
    ("  - {name: train, kind: trian}\n",
     r"stages\[0\]\.kind: unknown stage kind 'trian'; known kinds: bench, distill, export, .*train"),
    ("  - {name: a, kind: train, inputs: {model: ghost}}\n",
     r"stages\[0\]\.inputs\.model: refers to stage 'ghost', which is not an earlier stage; earlier stages: none"),
    ("  - {name: a, kind: train, inputs: {model: b}}\n  - {name: b, kind: train}\n",
     r"refers to stage 'b', which is not an earlier stage \(it runs later"),
    ("  - {name: a, kind: train}\n  - {name: a, kind: train}\n",
     r"p\.yaml:6: stages\[1\]\.name: duplicate stage name 'a' \(also stages\[0\]\)"),
    ("  - {name: a, kind: train, inputs: {teacher: a}}\n",
     r"stage kind 'train' takes no input 'teacher'; it takes: model"),
    ("  - {name: a, kind: train, amp: fp8}\n",
     r"stages\[0\]\.amp: Input should be 'auto', 'off', 'bf16' or 'fp16', got 'fp8'"),
])
def test_bad_stage_settings_are_reported_with_path_and_line(tmp_path, stages, expected):
    path = _write(tmp_path, BASE + "stages:\n" + stages)
    with pytest.raises(ConfigError, match=expected):
        load_pipeline(path)


def test_every_problem_is_reported_at_once(tmp_path):
    path = _write(tmp_path, "name: t\ndata: {name: digits, val_fraction: 1.5}\nmodel: {name: resnet20}\n"
                            "stages:\n  - {name: train, kind: train, epochs: -1, lr: 0}\n  - {name: x, kind: nope}\n")
    with pytest.raises(ConfigError) as info:
        load_pipeline(path)
    message = str(info.value)
    assert "4 problems" in message
    assert "p.yaml:2: data.val_fraction: Input should be less than 1, got 1.5" in message
    assert "stages[0].epochs" in message and "stages[0].lr" in message
    assert "p.yaml:6: stages[1].kind: unknown stage kind 'nope'" in message


@pytest.mark.parametrize("text, expected", [
    ("name: t\ndata: {name: digits\n", r"p\.yaml:\d+: not valid YAML"),
    ("- just\n- a list\n", r"must be a YAML mapping"),
    ("name: t\nmodel: {name: resnet20}\nstages: [{name: a, kind: train}]\n", r"data: Field required"),
    ("name: t\ndata: {name: imagefolder}\nmodel: {name: resnet20}\nstages: [{name: a, kind: train}]\n",
     r"data: data\.path is required for imagefolder"),
    ("name: t\ndata: {name: mnist}\nmodel: {name: resnet20}\nstages: [{name: a, kind: train}]\n",
     r"data\.name: Input should be 'digits', 'mnist5k', 'imagefolder', 'cifar10', 'synthetic', 'coco', 'shapes', 'masks', 'voc', 'coco_masks' or 'scenes', got 'mnist'"),
    ("name: t\ndata: {name: digits}\nmodel: {name: resnet20}\nstages: []\n", r"stages: List should have at least 1 item"),
    ("name: t\ndata: {name: digits, colour: red}\nmodel: {name: resnet20}\nstages: [{name: a, kind: train}]\n",
     r"data\.colour: unknown field; known fields: name, path, image_size"),    ("name: t\ndata: {name: digits}\nmodel: {name: resnet20}\nlatency: {measured_at: served}\n"
     "stages: [{name: a, kind: train}]\n", r"latency: .*measured_at served measures the p99 at target_qps through "
                                           r"the model server: add scenario: server and target_qps"),
])
def test_bad_files(tmp_path, text, expected):
    with pytest.raises(ConfigError, match=expected):
        load_pipeline(_write(tmp_path, text))


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.yaml: cannot read the pipeline file"):
        load_pipeline(tmp_path / "nope.yaml")


def test_overrides_address_stages_by_name_and_parse_yaml_values(tmp_path, tiny_config, write_pipeline):
    path = write_pipeline(tiny_config)
    pipeline = load_pipeline(path, ["stages.train.epochs=3", "seed=1", "stages.train.augment.pad=0",
                                    "data.image_size=16", "stages.0.lr=0.5"])
    train = pipeline.stage("train")
    assert (train.epochs, train.augment.pad, train.lr) == (3, 0, 0.5)
    assert pipeline.config.seed == 1 and pipeline.config.data.image_size == 16
    resolved = yaml.safe_load(pipeline.resolved_yaml())
    assert resolved["stages"][0]["epochs"] == 3 and resolved["seed"] == 1


@pytest.mark.parametrize("override, expected", [
    ("stages.nope.epochs=3", r"no stage named 'nope'; stages: train"),
    ("seed", r"write key=value"),
    ("seed.x=1", r"seed is a value, not a section"),
    ("stages.epochs=3", r"stages is a list; address a stage by name"),
])
def test_bad_overrides(tiny_config, override, expected):
    with pytest.raises(ConfigError, match=expected):
        apply_override(tiny_config, override)


def test_an_override_that_breaks_validation_is_reported_as_the_override(tiny_config, write_pipeline):
    with pytest.raises(ConfigError, match=r"\(override stages\.train\.epochs=0\): stages\[0\]\.epochs: "
                                          r"Input should be greater than or equal to 1, got 0"):
        load_pipeline(write_pipeline(tiny_config), ["stages.train.epochs=0"])
    with pytest.raises(ConfigError, match=r"\(override stages\.train\.lr=\[1, 2\]\): stages\[0\]\.lr"):
        load_pipeline(write_pipeline(tiny_config), ["stages.train.lr=[1, 2]"])


def test_validate_command_exit_codes(tmp_path, tiny_config, write_pipeline, capsys):
    assert main(["validate", str(write_pipeline(tiny_config))]) == 0
    assert "valid (1 stages: train)" in capsys.readouterr().out
    bad = _write(tmp_path, BASE + "stages:\n  - {name: train, kind: train, epochs: 0}\n")
    assert main(["validate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "stages[0].epochs" in err and "Traceback" not in err


def test_schema_lists_stage_settings(capsys):
    schema = pipeline_json_schema()
    kinds = {sub["title"]: sub for sub in schema["properties"]["stages"]["items"]["oneOf"]}
    train = kinds["TrainConfig"]
    assert {"formats", "precision", "opset", "parity", "tensorrt"} <= set(kinds["ExportConfig"]["properties"])
    assert {"epochs", "amp", "lr", "inputs"} <= set(train["properties"])
    assert main(["schema"]) == 0
    assert json.loads(capsys.readouterr().out)["title"] == "PipelineConfig"


def test_quickstart_pipeline_is_valid():
    pipeline = load_pipeline(ROOT / "pipelines" / "quickstart.yaml")
    assert pipeline.config.data.name == "mnist5k" and pipeline.stages[0].kind == "train"


@pytest.mark.parametrize("path", sorted(p.name for p in (ROOT / "pipelines").glob("*.yaml") if "search" not in p.name))
def test_every_reference_pipeline_is_valid(path):
    """The reference pipelines are documentation too: one that no longer validates is found here, not by a user."""
    pipeline = load_pipeline(ROOT / "pipelines" / path)
    assert pipeline.stages


def test_the_training_share_left_by_the_splits_is_what_is_refused_below_ten_percent():
    """val_fraction is a share of what the test split leaves: 0.5 and 0.5 leave 25% for training (accepted, though
    their sum is 1), 0.8 and 0.6 leave 8% (refused, with the share named)."""
    from compress.config import DataConfig

    assert DataConfig(name="digits", test_fraction=0.5, val_fraction=0.5).val_fraction == 0.5
    with pytest.raises(ValueError, match=r"leave 8% of the images for training; leave at least 10%"):
        DataConfig(name="digits", test_fraction=0.8, val_fraction=0.6)
