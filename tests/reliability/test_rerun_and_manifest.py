"""Every re-run says why in one line; a damaged manifest is refused with how to recover, never guessed at."""
from __future__ import annotations

import copy
import json

import pytest
import yaml

from compress.cli import main
from tests.conftest import TINY


@pytest.fixture
def two_stage_run(tmp_path):
    config = copy.deepcopy(TINY)
    config["stages"].append({"name": "prune", "kind": "prune", "target": {"ratio": 0.5}, "deployed_latency": {"enabled": False},
                             "sparsity": {"epochs": 1, "amp": "off"}, "finetune": {"epochs": 1, "amp": "off"}})
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(config))
    run_dir = tmp_path / "run"
    assert main(["run", str(path), "--run-dir", str(run_dir)]) == 0
    return path, run_dir


def _flip_one_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_flipped_byte_is_named_when_the_stage_re_runs(two_stage_run, capsys):
    path, run_dir = two_stage_run
    capsys.readouterr()
    weights = run_dir / "prune" / "model" / "model.safetensors"
    _flip_one_byte(weights)
    assert main(["run", str(path), "--run-dir", str(run_dir)]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "train: cached, skipped" in err
    assert f"prune: running (prune): outputs changed ({run_dir / 'prune' / 'model'} changed since it was recorded" in err


def test_a_changed_setting_and_a_changed_input_are_named(two_stage_run, capsys):
    path, run_dir = two_stage_run
    capsys.readouterr()
    assert main(["run", str(path), "--run-dir", str(run_dir), "stages.prune.target.ratio=0.4"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "prune: running (prune): settings changed: stages.prune.target.ratio" in err
    assert main(["run", str(path), "--run-dir", str(run_dir), "stages.train.lr=0.02",
                 "stages.prune.target.ratio=0.4"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "train: running (train): settings changed: stages.train.lr" in err
    assert "prune: running (prune): input changed: train.model" in err
    assert main(["run", str(path), "--run-dir", str(run_dir), "--force", "prune", "stages.train.lr=0.02",
                 "stages.prune.target.ratio=0.4"]) == 0
    assert "prune: running (prune): asked to (--force / --from)" in " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize("damage", ["truncated", "edited", "not_a_manifest"])
def test_a_damaged_manifest_is_refused_with_how_to_recover(two_stage_run, capsys, damage):
    path, run_dir = two_stage_run
    manifest = run_dir / "manifest.json"
    text = manifest.read_text()
    if damage == "truncated":
        manifest.write_text(text[: len(text) // 2])
    elif damage == "edited":  # still valid JSON, still the schema: only the content digest tells
        data = json.loads(text)
        data["stages"]["train"]["cache_key"] = "0" * 64
        manifest.write_text(json.dumps(data, indent=2))
    else:
        data = json.loads(text)
        del data["content_sha256"], data["pipeline"]
        manifest.write_text(json.dumps(data))
    damaged = manifest.read_bytes()
    capsys.readouterr()
    assert main(["run", str(path), "--run-dir", str(run_dir)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    expected = {"truncated": "is not readable JSON, so it was truncated or written partly",
                "edited": "does not match the digest of its own content: it was edited by hand",
                "not_a_manifest": "is not a compress manifest"}[damage]
    assert expected in err and "nothing is guessed: move it away" in err and "--run-dir" in err
    assert manifest.read_bytes() == damaged and "Traceback" not in err
    assert main(["inspect", str(run_dir)]) == 2  # every reader refuses it alike
