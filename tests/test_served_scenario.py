"""The served scenario on a real server (Ray Serve on loopback): the file measured through its server in rounds
alternating with itself in process, their p99s paired by round, the server's own count of what it answered equal
to the client's, and a server killed mid-measurement ending that file's served record with the reason while the
measurement returns; an INT8 file and its fp32 file share a server and their rounds. Each test starts a real server (about 15 s on 2 cores), so they are slow."""
from __future__ import annotations

import os
import signal
from contextlib import ExitStack

import numpy as np
import pytest

from serve_bench.latency import served as served_module
from serve_bench.latency.served import measure_served
from serve_bench.latency.worker import BenchWorker
from serve_bench.load.rounds import RoundsRule
from serve_bench.report_model.sections import Served
from tests.test_server_files import tiny_onnx

pytestmark = pytest.mark.slow

RATE = 25.0  # Ray Serve answers about 115 requests a second on 2 cores unloaded (a 17-ms round trip), far fewer
# beside another test: a rate near its limit leaves the busy periods too long to pair
SCENARIO = {"scenario": "server", "target_qps": RATE, "duration_s": 1.0, "min_queries": 200, "seed": 3,
            "target_latency_ms": 200.0, "warmup_s": 0.5, "min_tail_cycles": 20, "precision": 0.25,
            "max_queries": 2000, "expected_latency_ms": 1.0}
RULE = RoundsRule(min_rounds=3, max_queries=600, budget_ms=200.0, min_tail_cycles=20, precision=0.25)
# a ratio's 99% interval over 3 rounds has 2 degrees of freedom (t = 9.9): beside another test it was seen to reach
# 0; over 5 rounds t is 4.6, and the server's cost stands clear of 1
PAIR_RULE = RoundsRule(min_rounds=5, max_queries=1000, budget_ms=200.0, min_tail_cycles=20, precision=0.25)
SERVING = {"max_batch": 4, "max_queue_delay_us": 500, "instances": 1, "threads": 1}


def _measure(tmp_path, said: list[str], pair: bool = False) -> dict:
    """The tiny file's served record; with ``pair``, served beside a copy of itself standing for its INT8 file."""
    model = tiny_onnx(tmp_path / "model.onnx")
    names = ["tiny.onnx", "tiny-int8.onnx"] if pair else ["tiny.onnx"]
    files = {n: {"runtime": "onnxruntime", "path": str(model)} for n in names}
    pool = np.random.default_rng(0).normal(size=(64, 1, 8, 8)).astype(np.float32)
    with ExitStack() as stack:
        workers = {n: stack.enter_context(BenchWorker(n, "onnxruntime", str(model), {"threads": 1}, pool, 1))
                   for n in names}
        return measure_served(workers, files, scenario=SCENARIO, rule=PAIR_RULE if pair else RULE, budget_ms=200.0,
                              serving={n: SERVING for n in names}, service_ms={n: 0.5 for n in names}, pool=pool,
                              round_s=1.0, settle_s=0.0, say=said.append,
                              pairs={"tiny-int8.onnx": {"fp32": "tiny.onnx"}} if pair else None)


def test_an_int8_file_and_its_fp32_file_through_one_server_beside_themselves_in_process_paired_by_round(tmp_path):
    """Two files through one server, each beside itself in process, all four in the same rounds: the server's
    cost is paired per file, and the INT8 file's served p99 over its fp32 file's is paired too (here the same
    model twice, so that ratio's known answer is 1 while the server's is far above it)."""
    said: list[str] = []
    records = _measure(tmp_path, said, pair=True)
    for name, record in records.items():
        record = Served.model_validate(record)
        run, in_process, split = record.run, record.in_process, record.split
        assert record.failed is None and record.server == "ray-serve"
        assert record.settings["max_batch"] == 4 and record.settings["max_queue"] == 4 * 400  # budget / service, per batch
        assert run.steady_state.rounds == in_process.steady_state.rounds >= 5  # the same rounds, stopped together
        assert run.queries == in_process.queries  # the same arrivals, round by round
        assert run.paired is not None, (run.steady_state, run.sustainable_reason)  # pairs need complete busy periods
        ratio = run.paired["in_process"]
        assert ratio.reference == name
        # a 64×10 matrix product takes microseconds in process; through HTTP and the server's proxy it takes
        # milliseconds: the ratio's whole interval lies far above 1 (×3-5 on 2 cores, four turns a round)
        assert ratio.ci[0] > 1.5 and ratio.ratio > 2.5, ratio
        assert split.success + split.refused == run.queries and split.failed == 0  # the server's count is the client's
        assert split.queue_mean_ms > 0 and split.compute_mean_ms > 0 and split.rest_mean_ms > 0
        assert split.client_mean_ms == pytest.approx(split.queue_mean_ms + split.compute_mean_ms
                                                     + split.rest_mean_ms + split.client_wait_ms["mean"])
        assert 1.0 <= split.mean_batch <= 4.0
        assert 0.0 <= record.machine_load["other_share_mean"] <= 1.0 and record.machine_load["blocks"] >= 20
        assert record.limits["waiting_at_most"] == 4 * 400 and record.served_with == [n for n in records if n != name]
    int8 = Served.model_validate(records["tiny-int8.onnx"]).run
    fp32 = int8.paired["fp32"]
    assert fp32.reference == "tiny.onnx" and fp32.through == "served"  # named as the gate names its fp32 file
    assert 0.5 < fp32.ratio < 2 and fp32.ci[0] < 1.5  # the same model: no speed-up, nowhere near the server's ×3
    assert "fp32" not in (Served.model_validate(records["tiny.onnx"]).run.paired or {})
    assert any("served on ray-serve" in line and "beside" in line for line in said)


def test_a_server_killed_mid_measurement_ends_that_files_served_record_with_the_reason(tmp_path, monkeypatch):
    started = []
    real_make_server = served_module.make_server

    def capture(*args, **kwargs):
        server = real_make_server(*args, **kwargs)
        started.append(server)
        return server

    calls = {"turn": 0}
    real_call = served_module.ServedWorker.call

    def kill_before_the_second_turn(self, *command):
        if command[0] == "turn":
            calls["turn"] += 1
            if calls["turn"] == 2:
                os.killpg(started[0]._process.pid, signal.SIGKILL)  # the whole server, Ray's processes too
        return real_call(self, *command)

    monkeypatch.setattr(served_module, "make_server", capture)
    monkeypatch.setattr(served_module.ServedWorker, "call", kill_before_the_second_turn)
    said: list[str] = []
    record = _measure(tmp_path, said)["tiny.onnx"]
    assert calls["turn"] == 2, record  # it stopped at the turn that met the dead server, no later
    assert "run" not in record and "stopped answering" in record["failed"] or "gone" in record["failed"]
    assert any("served measurement stopped" in line for line in said)
    assert not started[0].alive()


def test_the_sweep_through_the_server_finds_the_load_it_sustains_on_the_servers_own_batcher(tmp_path):
    """One configuration swept through a real server: its offline ceiling read through HTTP, probes at fractions
    of it, every probe answered by the server started with that configuration and its queue limit."""
    from serve_bench.latency.served_sweep import sweep_served
    from serve_bench.latency.traffic import TrafficSettings, sweep_plan
    from serve_bench.load.serving_loop import ServingSettings
    from serve_bench.report_model.sections import Sweep

    model = tiny_onnx(tmp_path / "model.onnx")
    pool = np.random.default_rng(0).normal(size=(64, 1, 8, 8)).astype(np.float32)
    config = ServingSettings(**SERVING)
    # one probe, stopped at 400 queries (its p99 is not precise sooner at this rate), and the offline test sized by
    # a served request's time (about 20 ms), as the bench sizes it: about 75 s with the server's start
    settings = TrafficSettings(sweep=True, configs=[config], rates=[0.4], refine=0, confirm=False,
                               duration_s=1.0, sweep_min_queries=200, sweep_max_queries=400, warmup_s=0.5)
    said: list[str] = []
    found = sweep_served({"tiny.onnx": {"runtime": "onnxruntime", "path": str(model)}}, [config],
                         budget_ms=200.0, service_ms={"tiny.onnx": 0.5}, pool=pool,
                         settle_s=0.0, say=said.append,
                         plan=sweep_plan(settings, 200.0, "point", said.append, {"tiny.onnx": 20.0}))["tiny.onnx"]
    sweep = Sweep.model_validate(found)
    (swept,) = sweep.configs
    assert swept.failed is None and swept.max_queue == 4 * 400 and swept.serving.max_batch == 4
    assert swept.offline.completed_qps > 20  # the server's ceiling through HTTP, far under the file's own
    assert [round(r.offered_qps / swept.offline.completed_qps, 2) for r in swept.curve] == [0.4]
    assert all(r.serving.max_batch == 4 and r.sustainable for r in swept.curve)  # none refused at these rates
    assert all(r.steady_state.warmup_s == 0.5 for r in swept.curve)  # warmed apart, and recorded so
    assert found["configs"][0]["limits"]["waiting_at_most"] == 4 * 400  # Ray's two limits hold the queue limit
    assert swept.capacity.qps == swept.curve[-1].offered_qps and swept.capacity.censored
    assert sweep.best is not None and any("served sweep on ray-serve" in line for line in said)
