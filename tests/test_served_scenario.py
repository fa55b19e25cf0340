"""The served scenario on a real server (Ray Serve on loopback): the file measured through its server in rounds
alternating with itself in process, their p99s paired by round, the server's own count of what it answered equal
to the client's, and a server killed mid-measurement ending that file's served record with the reason while the
measurement returns. Each test starts a real server (about 15 s on 2 cores), so they are slow."""
from __future__ import annotations

import os
import signal

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
SERVING = {"max_batch": 4, "max_queue_delay_us": 500, "instances": 1, "threads": 1}


def _measure(tmp_path, said: list[str]) -> dict:
    model = tiny_onnx(tmp_path / "model.onnx")
    pool = np.random.default_rng(0).normal(size=(64, 1, 8, 8)).astype(np.float32)
    with BenchWorker("tiny.onnx", "onnxruntime", str(model), {"threads": 1}, pool, 1) as worker:
        return measure_served({"tiny.onnx": worker}, {"tiny.onnx": {"runtime": "onnxruntime", "path": str(model)}},
                              scenario=SCENARIO, rule=RULE, budget_ms=200.0, serving={"tiny.onnx": SERVING},
                              service_ms={"tiny.onnx": 0.5}, pool=pool, round_s=1.0, settle_s=0.0,
                              say=said.append)["tiny.onnx"]


def test_a_file_measured_through_its_server_beside_itself_in_process_paired_by_round(tmp_path):
    said: list[str] = []
    record = Served.model_validate(_measure(tmp_path, said))
    run, in_process, split = record.run, record.in_process, record.split
    assert record.failed is None and record.server == "ray-serve"
    assert record.settings["max_batch"] == 4 and record.settings["max_queue"] == 4 * 400  # the budget over the service time, per batch
    assert run.steady_state.rounds == in_process.steady_state.rounds >= 3  # the same rounds, stopped together
    assert run.queries == in_process.queries  # the same arrivals, round by round
    assert run.paired is not None, (run.steady_state, run.sustainable_reason)  # pairs need complete busy periods
    ratio = run.paired["in_process"]
    assert ratio.reference == "tiny.onnx"
    # a 64×10 matrix product takes microseconds in process; through HTTP and the server's proxy it takes
    # milliseconds: the ratio's whole interval lies far above 1
    assert ratio.ci[0] > 3 and ratio.ratio > 3
    assert split.success + split.refused == run.queries and split.failed == 0  # the server's count is the client's
    assert split.queue_mean_ms > 0 and split.compute_mean_ms > 0 and split.rest_mean_ms > 0
    assert split.client_mean_ms == pytest.approx(split.queue_mean_ms + split.compute_mean_ms + split.rest_mean_ms
                                                 + split.client_wait_ms["mean"])
    assert 1.0 <= split.mean_batch <= 4.0
    assert any("served on ray-serve" in line for line in said)


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
    record = _measure(tmp_path, said)
    assert calls["turn"] == 2, record  # it stopped at the turn that met the dead server, no later
    assert "run" not in record and "stopped answering" in record["failed"] or "gone" in record["failed"]
    assert any("served measurement stopped" in line for line in said)
    assert not started[0].alive()


def test_the_sweep_through_the_server_finds_the_load_it_sustains_on_the_servers_own_batcher(tmp_path):
    """One configuration swept through a real server: its offline ceiling read through HTTP, probes at fractions
    of it, every probe answered by the server started with that configuration and its queue limit."""
    from serve_bench.latency.served import sweep_served
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
    assert swept.capacity.qps == swept.curve[-1].offered_qps and swept.capacity.censored
    assert sweep.best is not None and any("served sweep on ray-serve" in line for line in said)
