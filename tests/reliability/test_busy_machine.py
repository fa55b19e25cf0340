"""A measurement taken while another process keeps a core busy is flagged; interleaving keeps a ratio true
while a neighbour slows the machine (a simulation with a known answer); and the benchmark that measures what
a neighbour does to the ratio on this machine runs and reports."""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
import torch
import yaml
from torch import nn

from compress.cli import main
from export.onnx_export import export_onnx
from serve_bench.latency import neighbour_check
from serve_bench.latency.harness import HarnessSettings, measure_interleaved
from serve_bench.stats.latency_intervals import paired_ratio
from serve_bench.latency.machine_load import BUSY_SHARE
from serve_bench.stats.summary import percentile
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
@pytest.mark.serial  # its quiet bench must be quiet: no other test process beside it
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


class _GrowingNeighbour:
    """Fake time, and a neighbour whose load grows with it: every request takes (1 + now / ramp_s) times its
    own time, times a seeded jitter of a few percent. It slows both files by the same factor at any moment,
    so a measurement that gives both the same moments finds the ratio of their own times."""

    def __init__(self, ramp_s: float) -> None:
        self.now, self.ramp_s = 0.0, ramp_s
        self.rng = np.random.default_rng(0)

    def take(self, ms: float) -> int:
        seconds = ms / 1000 * (1 + self.now / self.ramp_s) * float(self.rng.lognormal(0.0, 0.05))
        self.now += seconds
        return int(seconds * 1e9)


class _FakeWorker:
    def __init__(self, ms: float, neighbour: _GrowingNeighbour) -> None:
        self.ms, self.neighbour, self.process = ms, neighbour, SimpleNamespace(pid=os.getpid())

    def call(self, what, n, *args):
        start = self.neighbour.now
        latencies = np.array([self.neighbour.take(self.ms) for _ in range(max(1, n))], dtype=np.int64)
        return (len(latencies), self.neighbour.now - start) if what == "warmup" else (latencies,
                                                                                      self.neighbour.now - start)


def test_interleaving_keeps_the_true_ratio_while_a_neighbour_slows_the_machine_and_one_after_another_does_not():
    settings = HarnessSettings(warmup_iters=5, warmup_s=0.0, min_iters=400, min_duration_s=4.0, block_iters=20,
                               block_s=0.1, settle_s=0.0)
    true_ratio = 1.6
    neighbour = _GrowingNeighbour(ramp_s=8.0)  # the machine is about 2x slower by the end of the measurement
    measured = measure_interleaved({"reference": _FakeWorker(1.0, neighbour),
                                    "candidate": _FakeWorker(true_ratio, neighbour)}, settings)
    assert neighbour.now > 8.0  # the neighbour did double every request's time before the end
    for q in (50, 99):
        ratio = paired_ratio(measured["candidate"].blocked, measured["reference"].blocked, q)
        assert ratio.ci[0] <= true_ratio <= ratio.ci[1], (q, ratio)
        assert abs(ratio.ratio / true_ratio - 1) < 0.03, (q, ratio)
    # the figure the README quotes (the simulation is seeded and its clock is fake, so it is exact)
    p50 = paired_ratio(measured["candidate"].blocked, measured["reference"].blocked, 50)
    assert (round(p50.ratio, 3), round(p50.ci[0], 3), round(p50.ci[1], 3)) == (1.599, 1.573, 1.623)
    # The same files measured one after the other on the same slowing machine: the candidate, measured
    # later, pays for the neighbour's growth, and its p50 ratio is far from the truth.
    neighbour = _GrowingNeighbour(ramp_s=8.0)
    one = measure_interleaved({"reference": _FakeWorker(1.0, neighbour)}, settings)["reference"]
    two = measure_interleaved({"candidate": _FakeWorker(true_ratio, neighbour)}, settings)["candidate"]
    sequential = percentile(two.latencies_ms, 50) / percentile(one.latencies_ms, 50)
    assert sequential > 1.25 * true_ratio and round(sequential, 2) == 2.27


def test_the_phases_balance_quiet_and_busy_in_time_and_pair_each_busy_phase_with_its_quiet_neighbour():
    kinds = neighbour_check.phase_kinds(8)
    assert kinds == ["quiet", "busy", "busy", "quiet"] * 2
    positions = {k: np.mean([i for i, kind in enumerate(kinds) if kind == k]) for k in ("quiet", "busy")}
    assert positions["quiet"] == positions["busy"]
    assert neighbour_check.adjacent_pairs(kinds) == [(1, 0), (2, 3), (5, 4), (6, 7)]
    for count in (2, 3, 6):  # a phase unpaired, or the pairs' offsets unbalanced: a drift would read as a shift
        with pytest.raises(ValueError, match="multiple of 4"):
            neighbour_check.phase_kinds(count)


def _phases(ratios: list[float]) -> list[dict]:
    kinds = neighbour_check.phase_kinds(len(ratios))
    return [{"kind": kind, "ratio_p50": {"ratio": r}} for kind, r in zip(kinds, ratios)]


def test_the_shift_interval_cancels_a_linear_drift_and_covers_a_known_shift_at_its_level():
    # no noise, a drift of 3% per phase and a neighbour that raises the ratio by 10%: exactly 10%, every pair
    drift = [1.03 ** i for i in range(8)]
    ratios = [d * (1.10 if kind == "busy" else 1.0) for d, kind in zip(drift, neighbour_check.phase_kinds(8))]
    shift = neighbour_check.shift_interval(_phases(ratios))
    assert shift["pairs"] == 4 and shift["shift"] == pytest.approx(0.10, abs=1e-4)
    # with independent noise (5% per phase) and no drift, the 95% interval covers the true 10% in 95% of runs:
    # 4,000 runs put the rate within ±0.01 of it (3 binomial sd); an interval a sqrt(3/4) too narrow (the
    # spread without its degree-of-freedom correction) covers 93%, and one with a normal quantile 86%
    rng = np.random.default_rng(0)
    clean = [1.10 if kind == "busy" else 1.0 for kind in neighbour_check.phase_kinds(8)]
    runs, covered = 4000, 0
    for _ in range(runs):
        noisy = [r * float(np.exp(rng.normal(0.0, 0.05))) for r in clean]
        low, high = neighbour_check.shift_interval(_phases(noisy))["ci"]
        covered += low <= 0.10 <= high
    assert 0.94 <= covered / runs <= 0.96, covered / runs


@pytest.fixture(scope="module")
def onnx_pair(tmp_path_factory):
    """A small float convolution net and its static INT8 (QDQ) quantization."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    folder = tmp_path_factory.mktemp("pair")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10)).eval()
    export_onnx(net, torch.randn(2, 3, 16, 16), folder / "fp32.onnx")
    name = onnx.load(str(folder / "fp32.onnx")).graph.input[0].name
    rng = np.random.default_rng(1)
    calibration = iter([{name: rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(4)])

    class _Reader:
        def get_next(self):
            return next(calibration, None)

    quantize_static(str(folder / "fp32.onnx"), str(folder / "int8.onnx"), _Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    return folder


def test_the_neighbour_benchmark_alternates_quiet_and_busy_phases_and_reports_the_shift(onnx_pair, capsys,
                                                                                        monkeypatch):
    """The benchmark's bookkeeping: burners live exactly through the busy phases, each phase's ratio and the shift
    are computed from its own rounds. Whether a busy phase *shows* in the machine's load is a statement about real
    time that another test process beside this one (pytest-xdist, a neighbour) would break: the slow
    ``test_a_busy_neighbour_is_measured_and_flagged`` and the benchmark's own output make it."""
    started, stopped = [], []
    real_burners, real_stop = neighbour_check._burners, neighbour_check._stop

    def burners(count):
        running = real_burners(count)
        started.append([b.pid for b in running])
        return running

    def stop(running):
        real_stop(running)
        stopped.append([b.pid for b in running if b.returncode is not None])

    monkeypatch.setattr(neighbour_check, "_burners", burners)
    monkeypatch.setattr(neighbour_check, "_stop", stop)
    out = onnx_pair / "neighbour.json"
    assert neighbour_check.main([str(onnx_pair / "fp32.onnx"), str(onnx_pair / "int8.onnx"), "--phases", "4",
                                 "--min-duration", "0.3", "--min-iters", "50", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    phases = result["phases"]
    assert [p["kind"] for p in phases] == ["quiet", "busy", "busy", "quiet"]
    for phase in phases:
        ratio = phase["ratio_p50"]
        assert ratio["rounds"] >= 1  # how many depends on the machine's speed: one round under a busy neighbour
        # every round is shared, so the paired p50 ratio is the two files' own p50s over the phase
        assert ratio["ratio"] == pytest.approx(phase["p50_ms"]["candidate"] / phase["p50_ms"]["reference"], rel=2e-3)
    # one burner started for each busy phase and ended with it; none in a quiet phase
    assert [len(pids) for pids in started] == [1, 1] and stopped == [[], started[0], started[1], []], (started, stopped)
    assert all(0.0 <= p["machine_load"]["other_share_mean"] <= 1.0 for p in phases)
    summary = result["summary"]
    ratios = [p["ratio_p50"]["ratio"] for p in phases]
    shift = summary["ratio_shift"]  # busy phase 1 with quiet phase 0, busy 2 with quiet 3
    assert shift["pairs"] == 2 and shift["ci"][0] <= shift["shift"] <= shift["ci"][1]
    assert shift["shift"] == pytest.approx(np.sqrt(ratios[1] / ratios[0] * ratios[2] / ratios[3]) - 1, abs=1e-3)
    assert summary["quiet_ratio_spread"] == pytest.approx(max(ratios[0], ratios[3]) / min(ratios[0], ratios[3]) - 1,
                                                          abs=1e-3)
    assert "shift over 2 adjacent pair(s)" in capsys.readouterr().out


def test_the_neighbour_benchmark_refuses_a_missing_file_and_unbalanced_phases(onnx_pair, capsys):
    assert neighbour_check.main([str(onnx_pair / "nope.onnx"), str(onnx_pair / "int8.onnx")]) == 2
    assert "nope.onnx: no such file" in capsys.readouterr().err
    assert neighbour_check.main([str(onnx_pair / "fp32.onnx"), str(onnx_pair / "int8.onnx"), "--phases", "6"]) == 2
    assert "multiple of 4" in capsys.readouterr().err
