"""The README's promise, end to end: the quickstart trains to ≥ 97%, quantizes within the red line,
exports with parity, gates the INT8 file, and re-runs from cache."""
from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import ROOT, run_cli
from tests.quickstart_run import first_quickstart_run
from tests.report_invariants import points_outside_intervals
from train.precision import choose_amp


@pytest.mark.slow
def test_quickstart_reaches_97_percent_and_reruns_from_cache(tmp_path):
    run_dir = tmp_path / "quickstart"
    first_quickstart_run(run_dir)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    metrics = manifest["stages"]["train"]["metrics"]
    # amp: auto follows the hardware (bf16 only where native); the run's subprocess sees the same caps.
    expected = choose_amp("auto", torch.device("cpu"))
    assert metrics["test_top1"] >= 97.0 and metrics["precision"] == expected.name
    assert metrics["precision_reason"] == expected.reason
    parity = manifest["artifacts"]["export.onnx"]["meta"]["parity"]["results"]
    assert [r["batch_size"] for r in parity] == [1, 32] and all(r["rel_diff"] <= 1e-4 for r in parity)
    quantized = manifest["stages"]["quantize"]["metrics"]
    assert quantized["red_line"]["within"] and quantized["rungs"][0]["calibration"]["samples"] == 256
    report = json.loads((run_dir / "bench" / "report" / "report.json").read_text())
    assert "quantize.onnx_cpu" in [a["name"] for a in report["artifacts"]]  # the gate was evaluated on it
    assert points_outside_intervals(report) == []  # every figure inside its own interval, speed-up = 1/ratio
    again = run_cli("run", str(ROOT / "pipelines" / "quickstart.yaml"), "--run-dir", str(run_dir))
    assert again.returncode == 0
    stages = [s["name"] for s in manifest["stages"].values()]
    # Every stage skipped and nothing re-made: the records are the first run's (no wall-clock threshold).
    assert all(f"{name}: cached, skipped" in again.stderr for name in stages), again.stderr
    assert "running" not in again.stderr
    rerun = json.loads((run_dir / "manifest.json").read_text())
    started = {n: r["started"] for n, r in manifest["stages"].items()}
    assert {n: r["started"] for n, r in rerun["stages"].items()} == started
