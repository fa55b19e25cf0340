"""``kind: nncf`` on the real digits: a checked Q/DQ file that agrees with the float model, its lineage, the cache,
and a clean exit 2 with the install command where nncf is missing."""
from __future__ import annotations

import copy
import importlib.util
import json
import shutil
import sys

import numpy as np
import onnx
import pytest
import torch
import yaml
from torch import nn

from compress.cli import main
from compress.pipeline.pipeline_file import load_pipeline
from compress.quantization import measure as int8_measure
from compress.quantization.nncf_ptq import NNCFSettings
from compress.stages.int8_records import split_arrays
from export.onnx_metadata import read_deployment
from tests.conftest import TINY
from train.data import DataSpec, load_data
from train.model_io import load_model


class DigitNet(nn.Module):
    """Two convolutions and a linear layer over the whole 4×4 map (no global pooling): on the 8×8 digits it
    separates the classes clearly within seconds, so INT8 rounding rarely flips a top-1 class."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, width: int = 16) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(2 * width), nn.ReLU())
        self.head = nn.Linear(2 * width * 16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


HAVE_NNCF = importlib.util.find_spec("nncf") is not None
needs_nncf = pytest.mark.skipif(not HAVE_NNCF, reason="nncf is not installed (pip install 'compress[cpu]')")
# No shift augmentation: on 8×8 images a 2-pixel shift costs more than it teaches (98% test top-1 in 3 epochs).
TRAIN = {"name": "train", "kind": "train", "epochs": 3, "batch_size": 64, "lr": 1e-2, "schedule": "wsd",
         "amp": "off", "checkpoint_every": 0, "augment": {"pad": 0}}
# Image-by-image agreement of the INT8 file's top-1 class with the float model's on the test split: measured
# 100% here; 95% leaves room for another CPU's rounding (and a NNCF release that calibrates differently).
MIN_AGREEMENT = 95.0


def _pipeline(folder, nncf: dict | None = None) -> str:
    config = copy.deepcopy(TINY)
    config["model"] = {"name": "tests.test_nncf_stage:DigitNet"}
    config["stages"] = [dict(TRAIN), {"name": "nncf", "kind": "nncf", "inputs": {"model": "train"},
                                      **(nncf or {})}]
    path = folder / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return str(path)


@pytest.fixture(scope="module")
def nncf_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("nncf")
    path = _pipeline(folder)
    run_dir = folder / "run"
    only = [] if HAVE_NNCF else ["--only", "train"]  # without nncf: the trained model the exit-2 test needs
    assert main(["run", path, "--run-dir", str(run_dir), *only]) == 0
    return path, run_dir


@needs_nncf
def test_the_file_is_a_checked_qdq_graph_that_agrees_with_the_float_model(nncf_run):
    _, run_dir = nncf_run
    path = run_dir / "nncf" / "onnx" / "model.onnx"
    onnx.checker.check_model(str(path), full_check=True)
    graph = onnx.load(str(path)).graph
    ops = [n.op_type for n in graph.node]
    assert ops.count("QuantizeLinear") > 0 and ops.count("DequantizeLinear") > 0
    producers = {out: n for n in graph.node for out in n.output}

    def dequantized(name: str) -> bool:  # through shape-only ops, which NNCF quantizes before
        node = producers.get(name)
        while node is not None and node.op_type in ("Reshape", "Flatten"):
            node = producers.get(node.input[0])
        return node is not None and node.op_type == "DequantizeLinear"

    compute = [n for n in graph.node if n.op_type in ("Conv", "Gemm", "MatMul")]
    assert len(compute) == 3 and all(dequantized(n.input[0]) and dequantized(n.input[1]) for n in compute)
    data = load_data(DataSpec(name="digits"))
    test_x, test_y = split_arrays(data, "test")
    model, _ = load_model(run_dir / "train" / "model")
    with torch.no_grad():
        float_pred = model.eval()(torch.from_numpy(test_x)).argmax(1).numpy()
    int8_pred = int8_measure.logits(path, test_x).argmax(1)
    agreement = 100.0 * float(np.mean(float_pred == int8_pred))
    assert agreement >= MIN_AGREEMENT, f"INT8 top-1 agrees with the float model on only {agreement:.1f}%"
    float_top1, int8_top1 = (100.0 * float(np.mean(p == test_y)) for p in (float_pred, int8_pred))
    assert float_top1 > 80 and abs(float_top1 - int8_top1) <= 100.0 - MIN_AGREEMENT


@needs_nncf
def test_the_manifest_records_lineage_method_and_both_accuracies(nncf_run):
    _, run_dir = nncf_run
    manifest = json.loads((run_dir / "manifest.json").read_text())
    art = manifest["artifacts"]["nncf.onnx"]
    meta = art["meta"]
    assert art["kind"] == "onnx" and art["made_from"] == ["train.model"] and art["path"] == "nncf/onnx"
    assert meta["file"] == "model.onnx" and meta["precision"] == "int8" and meta["source_model"] == "train.model"
    q = meta["quantization"]
    # samples left at its default (300, NNCF's) calibrates on all 256 images of the calib split
    assert q["method"] == "nncf-ptq" and q["preset"] == "performance" and q["samples"] == 256 and q["nncf_version"]
    assert meta["params"] == manifest["artifacts"]["train.model"]["meta"]["params"] and meta["opset"] == 18
    metrics = manifest["stages"]["nncf"]["metrics"]
    val = metrics["val"]
    assert val["fp32"]["n"] == val["int8"]["n"] > 0 and val["top1_agreement"] >= MIN_AGREEMENT
    assert val["drop"]["top1"] == pytest.approx(val["fp32"]["top1"] - val["int8"]["top1"], abs=1e-3)
    deployment = read_deployment(run_dir / "nncf" / "onnx" / "model.onnx")  # the file alone says how to feed it
    assert json.dumps(deployment).count("nncf-ptq") == 1 and "preprocessing" in json.dumps(deployment)
    assert not (run_dir / "nncf" / "work").exists()


@needs_nncf
def test_a_second_run_is_a_cache_hit(nncf_run, capsys):
    path, run_dir = nncf_run
    before = (run_dir / "nncf" / "onnx" / "model.onnx").stat().st_mtime_ns
    capsys.readouterr()
    assert main(["run", path, "--run-dir", str(run_dir)]) == 0
    err = capsys.readouterr()
    assert "cached, skipped" in err.out + err.err
    assert (run_dir / "nncf" / "onnx" / "model.onnx").stat().st_mtime_ns == before


def test_missing_nncf_is_exit_2_naming_the_stage_and_the_install(nncf_run, tmp_path, monkeypatch, capsys):
    path, run_dir = nncf_run
    copy_dir = tmp_path / "run"
    shutil.copytree(run_dir, copy_dir)
    monkeypatch.setitem(sys.modules, "nncf", None)  # `import nncf` now raises ImportError
    capsys.readouterr()
    assert main(["run", path, "--run-dir", str(copy_dir), "--only", "nncf", "--force", "nncf"]) == 2
    err = capsys.readouterr().err
    assert "stage 'nncf' (nncf)" in err and "pip install 'compress[cpu]'" in err and "Traceback" not in err


def test_settings_are_checked_before_anything_runs(tmp_path, capsys):
    path = _pipeline(tmp_path, {"preset": "fastest", "subset_size": 3})
    assert main(["validate", path]) == 2
    err = capsys.readouterr().err
    assert "preset" in err and "subset_size" in err and "unknown field" in err
    stage = load_pipeline(_pipeline(tmp_path, {"preset": "mixed"})).stage("nncf")
    assert (stage.samples, stage.preset, stage.fast_bias_correction, stage.opset) == (300, "mixed", True, 18)
    with pytest.raises(ValueError, match="preset must be one of"):
        NNCFSettings(preset="fastest")


@needs_nncf
def test_more_samples_than_calibration_images_is_refused(nncf_run, tmp_path, capsys):
    _, run_dir = nncf_run
    path = _pipeline(tmp_path, {"samples": 100_000})
    copy_dir = tmp_path / "run"
    shutil.copytree(run_dir, copy_dir)
    capsys.readouterr()
    assert main(["run", path, "--run-dir", str(copy_dir), "--only", "nncf"]) == 2
    assert "stages.nncf.samples: 100000 is more than the 256 calibration images" in capsys.readouterr().err
