"""A model is never judged on a split whose test images can be its own training images."""
from __future__ import annotations

import copy
import json

import pytest
import torch
import yaml

from compress.cli import main
from export.onnx_metadata import read_data_identity
from tests.conftest import TINY
from train.data import DataSpec, load_data
from train.model_io import read_description

FAST_BENCH = {"min_iters": 100, "min_samples": 100, "min_duration_s": 0.0, "warmup_iters": 2, "warmup_s": 0.0,
              "block_iters": 50, "threads": 1, "settle_s": 0.0, "block_s": 0.0, "profile_iters": 0, "runtimes": ["onnxruntime"]}


@pytest.fixture(scope="module")
def seed1_run(tmp_path_factory):
    """A digits model trained on split_seed 1, exported to ONNX."""
    folder = tmp_path_factory.mktemp("seed1")
    config = copy.deepcopy(TINY)
    config["data"] = {"name": "digits", "split_seed": 1}
    config["stages"] += [{"name": "export", "kind": "export", "parity": {"samples": 32}},
                         {"name": "bench", "kind": "bench", **FAST_BENCH}]
    path = folder / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["run", str(path), "--run-dir", str(folder / "run")]) == 0
    return path, folder / "run"


def test_the_default_split_really_holds_the_models_training_images(seed1_run):
    ours, default = load_data(DataSpec(name="digits", split_seed=1)), load_data(DataSpec(name="digits"))
    trained = set(ours.split_indices["train"].tolist())
    overlap = sum(i in trained for i in default.split_indices["test"].tolist())
    assert overlap / len(default.test) > 0.5  # what a silent evaluation on the default split would measure


def test_model_and_onnx_record_the_split_and_preprocessing(seed1_run):
    _, run_dir = seed1_run
    data = load_data(DataSpec(name="digits", split_seed=1))
    recorded = read_description(run_dir / "train" / "model")["data"]
    assert recorded == json.loads(json.dumps(data.identity()))
    assert read_data_identity(run_dir / "export" / "onnx" / "model.onnx") == recorded
    assert recorded["preprocessing"]["mean"] == data.mean and recorded["sizes"]["test"] == len(data.test)


def test_a_stage_alone_on_another_split_refuses_naming_both_digests(seed1_run, tmp_path, capsys):
    _, run_dir = seed1_run
    ours = load_data(DataSpec(name="digits", split_seed=1)).digest()
    default = load_data(DataSpec(name="digits")).digest()
    code = main(["stage", "quantize", "--data", "digits", "--input", f"model={run_dir / 'train' / 'model'}",
                 "--run-dir", str(tmp_path / "q")])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and f"split {ours[:12]}" in err and f"split {default[:12]}" in err
    assert "data.independent_test=true" in err
    assert not (tmp_path / "q" / "quantize").exists()  # refused before anything ran


def test_run_only_after_a_data_change_refuses_and_keeps_the_finished_run(seed1_run, capsys):
    path, run_dir = seed1_run
    before = (run_dir / "bench" / "report" / "report.json").read_text()
    assert main(["run", str(path), "--run-dir", str(run_dir), "--only", "bench", "data.split_seed=0"]) == 2
    assert "its test images can be images the model trained on" in " ".join(capsys.readouterr().err.split())
    assert (run_dir / "bench" / "report" / "report.json").read_text() == before


def test_told_independent_it_measures_but_another_preprocessing_is_refused_always(seed1_run, tmp_path, capsys):
    _, run_dir = seed1_run
    model = run_dir / "train" / "model"
    args = ["stage", "bench", "--data", "digits", "--input", f"artifact:model={model}",
            *[f"{k}={v}" for k, v in FAST_BENCH.items()]]
    # Another split normalises with its own statistics: refused even when told independent, with the fix.
    assert main([*args, "--run-dir", str(tmp_path / "c"), "data.independent_test=true"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    pre = read_description(model)["data"]["preprocessing"]
    assert "expects other input preprocessing" in err and f"data.mean: {pre['mean']}" in err
    pinned = [f"data.mean={pre['mean']}", f"data.std={pre['std']}"]
    assert main([*args, "--run-dir", str(tmp_path / "b"), "data.independent_test=true", *pinned]) == 0
    assert (tmp_path / "b" / "bench" / "report" / "report.json").is_file()


def test_an_onnx_without_a_record_is_refused_unless_declared_independent(seed1_run, tmp_path, capsys):
    from export.onnx_export import export_onnx
    from train.models import build_model

    model = build_model("resnet20", 10, 1, {"width": 4}).eval()
    export_onnx(model, torch.zeros(2, 1, 8, 8), tmp_path / "outside.onnx")  # made outside the pipeline
    args = ["stage", "bench", "--data", "digits", "--input", f"artifact:outside={tmp_path / 'outside.onnx'}",
            "--input", f"artifact:model={seed1_run[1] / 'train' / 'model'}", "data.split_seed=1",
            *[f"{k}={v}" for k, v in FAST_BENCH.items()]]
    assert main([*args, "--run-dir", str(tmp_path / "r")]) == 2
    assert "does not record the data split it was made on" in " ".join(capsys.readouterr().err.split())
