"""A measurement taken while another process keeps a core busy is flagged, and the interleaved INT8/fp32
ratio still holds within its interval."""
from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import yaml

from compress.cli import main
from serve_bench.machine_load import BUSY_SHARE
from tests.conftest import TINY

BENCH = {"name": "bench", "kind": "bench", "min_iters": 300, "min_samples": 300, "min_duration_s": 0.5,
         "warmup_iters": 5, "warmup_s": 0.0, "block_iters": 50, "block_s": 0.05, "threads": 1, "settle_s": 0.02}


def _burner():
    """A neighbour that keeps one core busy for as long as it lives."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def _report(run_dir):
    return json.loads((run_dir / "bench" / "report" / "report.json").read_text())


def _bench(path, run_dir, busy: bool):
    burner = _burner() if busy else None
    try:
        assert main(["run", str(path), "--run-dir", str(run_dir), "--force", "bench"]) == 0
    finally:
        if burner is not None:
            burner.kill()
            burner.wait()
    return _report(run_dir)


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    folder = tmp_path_factory.mktemp("busy")
    config = copy.deepcopy(TINY)
    config["latency"] = {"p99_budget_ms": 1000.0}
    config["gate"] = {"decision": "point"}
    config["stages"] += [{"name": "export", "kind": "export", "parity": {"samples": 32}}, dict(BENCH)]
    path = folder / "p.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, folder / "run"


@pytest.mark.slow  # two benches, one beside a CPU burner
def test_a_busy_neighbour_is_measured_and_flagged(measured):
    path, run_dir = measured
    quiet = _bench(path, run_dir, busy=False)
    busy = _bench(path, run_dir, busy=True)
    quiet_share = max(a["machine_load"]["other_share_mean"] for a in quiet["artifacts"])
    busy_share = min(a["machine_load"]["other_share_mean"] for a in busy["artifacts"])
    # One core of the machine's cores busy: on 2 cores about half of all CPU time, whatever else runs.
    assert busy_share > BUSY_SHARE and busy_share > quiet_share + 0.15
    assert any("the machine was busy with other work while measuring" in f for f in busy["flags"])
    md = (run_dir / "bench" / "report" / "report.md").read_text()
    assert "busy with other work" in md


@pytest.mark.slow
def test_the_interleaved_int8_to_fp32_ratio_holds_beside_a_busy_neighbour(tmp_path):
    config = copy.deepcopy(TINY)
    config["red_line"] = {"metric": "top1", "max_drop": 50.0}  # stay at the PTQ rung: the ratio is the point
    config["gate"] = {"decision": "point"}
    config["stages"] += [{"name": "export", "kind": "export", "parity": {"samples": 32}},
                         {"name": "quantize", "kind": "quantize", "flavours": ["cpu"],
                          "calibration": {"method": "minmax", "samples": 64}, "qat": {"epochs": 1}},
                         # settle_s at the harness default: torch eager runs in every round, and the 0.02 s of
                         # the fast bench above does not let its threads wind down before the next block (an
                         # AVX2 EPYC measured the INT8/fp32 ratio 6-8% apart quiet vs busy with 0.02 s)
                         dict(BENCH, min_iters=2000, min_samples=1000, min_duration_s=2.0, block_iters=100,
                              settle_s=0.2)]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(config))
    run_dir = tmp_path / "run"
    ratios = {}
    for busy in (False, True):
        report = _bench(path, run_dir, busy)
        int8 = next(a for a in report["artifacts"] if a.get("int8_vs_fp32"))
        ratios[busy] = int8["int8_vs_fp32"]["p50"]
    quiet, busy = ratios[False], ratios[True]
    # Measured on a 2-core AVX-512 EPYC: 1.581 [1.579, 1.585] quiet, 1.597 [1.594, 1.598] beside the burner.
    # With ~100 rounds on a quiet machine the intervals are a few tenths of a percent wide, and a neighbour
    # shifts the two runtimes slightly differently (1% there), so the floor is a 5% margin on the ratio
    # itself. On a noisy shared runner the intervals widen (a CI runner: 1.90 [1.60, 2.57] quiet,
    # 2.07 [1.63, 2.47] busy): there the margin is the wider interval's relative half-width, so the check
    # is still "the busy ratio lies where the quiet measurement said it could".
    half_width = max((r["ci"][1] - r["ci"][0]) / 2 / r["ratio"] for r in (quiet, busy))
    margin = max(0.05, half_width)
    assert margin < 0.5, (quiet, busy)  # an interval this wide measured nothing
    assert abs(busy["ratio"] / quiet["ratio"] - 1) <= margin, (quiet, busy, margin)
