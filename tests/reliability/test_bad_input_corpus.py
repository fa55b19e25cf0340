"""A corpus of broken pipeline files: `validate` and `run` both exit 2, name the field, print no traceback,
and leave an existing run directory byte-identical."""
from __future__ import annotations

import copy

import pytest
import yaml

from compress.cli import main
from tests.conftest import TINY

CORPUS = {
    "missing_image_folder": ({"data": {"name": "imagefolder", "path": "/nonexistent/images"}}, "data.path"),
    "unknown_model": ({"model": {"name": "no_such_model_xyz"}}, "model.name"),
    "unimportable_user_model": ({"model": {"name": "no_such_package.models:Net"}}, "model.name"),
    "missing_weights": ({"model": {"name": "resnet20", "weights": "/nonexistent/w.safetensors"}}, "model.weights"),
    "torchvision_on_grey_images": ({"model": {"name": "resnet18"}}, "model.name"),
    "negative_epochs": ({"stages": [{"name": "train", "kind": "train", "epochs": -1}]}, "stages[0].epochs"),
    "unknown_kind": ({"stages": [{"name": "train", "kind": "trian"}]}, "stages[0].kind"),
    "input_from_a_later_stage": ({"stages": [{"name": "prune", "kind": "prune", "inputs": {"model": "train"},
                                              "target": {"ratio": 0.5}}, dict(TINY["stages"][0])]},
                                 "stages[0].inputs.model"),
    "bad_fraction": ({"data": {"name": "digits", "val_fraction": 1.5}}, "data.val_fraction"),
    "unknown_top_level_field": ({"red_lines": {"max_drop": 1}}, "red_lines"),
    "bad_decision": ({"gate": {"decision": "maybe"}}, "gate.decision"),
}


@pytest.fixture(scope="module")
def existing_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    path = folder / "good.yaml"
    path.write_text(yaml.safe_dump(TINY))
    run_dir = folder / "run"
    assert main(["run", str(path), "--run-dir", str(run_dir)]) == 0
    return run_dir


@pytest.mark.parametrize("case", sorted(CORPUS))
def test_broken_file_is_refused_by_validate_and_run_alike(case, existing_run, tmp_path, capsys):
    change, field = CORPUS[case]
    config = {**copy.deepcopy(TINY), **change}
    path = tmp_path / f"{case}.yaml"
    path.write_text(yaml.safe_dump(config))
    before = {p: p.read_bytes() for p in existing_run.rglob("*") if p.is_file() and p.name != ".lock"}
    for command in (["validate", str(path)], ["run", str(path), "--run-dir", str(existing_run)]):
        assert main(command) == 2, command
        err = capsys.readouterr().err
        assert f": {field}" in err and "Traceback" not in err, err
    after = {p: p.read_bytes() for p in existing_run.rglob("*") if p.is_file() and p.name != ".lock"}
    assert after == before


def test_validate_says_what_it_does_not_check(capsys):
    with pytest.raises(SystemExit):
        main(["validate", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "Not checked (only running tells)" in out and "whether every image decodes" in out


def test_an_image_folder_is_checked_without_decoding(tmp_path, capsys):
    folder = tmp_path / "images"
    (folder / "cat").mkdir(parents=True)
    config = {**copy.deepcopy(TINY), "data": {"name": "imagefolder", "path": str(folder)}}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["validate", str(path)]) == 2
    assert "1 class folder(s); it needs at least two" in capsys.readouterr().err
    (folder / "dog").mkdir()
    assert main(["validate", str(path)]) == 2
    assert "no images" in capsys.readouterr().err
    for name in ("cat", "dog"):
        (folder / name / "a.png").write_bytes(b"not decoded by validate")
    assert main(["validate", str(path)]) == 0
    assert "not checked without running: whether every image decodes" in capsys.readouterr().out
