"""The served sweep's orchestration and its refusal rule, with the server and its client stood in for (the real
server runs in tests/test_served_scenario.py): one server per serving configuration, started with that
configuration, its threads and the queue limit a release would ship; a configuration whose server fails is
recorded with the reason while the others stand; a probe the server refused queries in is not sustainable."""
from __future__ import annotations

import numpy as np
import pytest

from serve_bench.latency import served_sweep as served
from serve_bench.latency.served import refusals_counted
from serve_bench.latency.served_sweep import sweep_served
from serve_bench.latency.traffic import TrafficSettings, sweep_plan
from serve_bench.load.capacity import passes
from serve_bench.load.serving_loop import ServingSettings
from serve_bench.report_model.sections import Sweep
from serve_bench.servers.base import ServerError
from tests.test_load_scenarios import run_at

BUDGET_MS = 10.0


class FakeServer:
    """Started with one configuration; its p99 reaches the budget at 100 queries/s × its max batch."""

    started: list = []

    def __init__(self, settings, fails: bool) -> None:
        self.settings, self.fails = settings, fails
        self.host, self.http_port, self.model = "127.0.0.1", 1, "m"

    def __enter__(self):
        FakeServer.started.append(self.settings)
        if self.fails:
            raise ServerError("Ray Serve stopped before it was ready (port in use)")
        return self

    def __exit__(self, *exc) -> None:
        pass

    def limits(self, model=None) -> dict:
        return {"waiting_at_most": self.settings.max_queue}


class FakeClient:
    offline_asked: list = []

    def __init__(self, name, host, port, model, pool, clients: int = 16, **kwargs) -> None:
        self.name, self.settings, self.clients = name, FakeServer.started[-1], clients

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def call(self, command, serving, scenario):
        assert command == "serve" and serving["max_batch"] == self.settings.max_batch
        capacity = 100.0 * self.settings.max_batch
        if scenario["scenario"] == "offline":
            FakeClient.offline_asked.append((scenario["target_qps"], self.clients))
            return {"scenario": "offline", "completed_qps": capacity * 1.25, "serving": serving,
                    "loadgen": {"valid": True}}
        qps = scenario["target_qps"]
        if self.settings.instances == 2 and qps > 0.6 * capacity:  # this server stops answering under load
            raise ServerError("the server stopped answering mid-test: connection refused")
        p99 = BUDGET_MS * qps / capacity
        return {**run_at(qps, p99, (p99 * 0.95, p99 * 1.05)), "serving": serving}


def test_each_configuration_gets_its_own_server_and_a_failed_one_is_recorded_while_the_others_stand(monkeypatch):
    FakeServer.started, FakeClient.offline_asked = [], []
    monkeypatch.setattr("serve_bench.latency.worker.serving_threads", lambda: 3)  # as the in-process worker resolves
    monkeypatch.setattr(served, "make_server", lambda path, runtime, settings, **kw: FakeServer(
        settings, fails=settings.max_batch == 4))
    monkeypatch.setattr(served, "ServedWorker", FakeClient)
    configs = [ServingSettings(), ServingSettings(max_batch=8, max_queue_delay_us=2000, instances=2),
               ServingSettings(max_batch=4, max_queue_delay_us=1000, threads=2),
               ServingSettings(max_batch=8, max_queue_delay_us=500)]
    settings = TrafficSettings(sweep=True, configs=configs, confirm=False, refine=3)
    said: list[str] = []
    found = sweep_served({"f.onnx": {"runtime": "onnxruntime", "path": "f.onnx"}}, configs,
                         budget_ms=BUDGET_MS, service_ms={"f.onnx": 0.5},
                         pool=np.zeros((4, 1, 8, 8), np.float32), settle_s=0.0, say=said.append,
                         plan=sweep_plan(settings, BUDGET_MS, "point", said.append, {"f.onnx": 20.0}))["f.onnx"]
    # threads left open resolved as in process; the queue limit from the file's own 0.5 ms service time
    assert [(s.max_batch, s.instances, s.threads, s.max_queue) for s in FakeServer.started] == [
        (1, 1, 3, 20), (8, 2, 3, 320), (4, 1, 2, 80), (8, 1, 3, 160)]
    # the offline test sized by the served request's 20 ms (LoadGen sends rate × duration queries at once), and
    # the client holding twice what the copies batch at once in flight, 16 at least
    assert FakeClient.offline_asked == [(50.0, 16), (50.0 * 4 * 2, 32), (50.0 * 4, 16)]
    one, two_copies, four, eight = found["configs"]
    assert four["capacity"] is None and four["failed"].startswith("ServerError: Ray Serve stopped")
    assert 0.8 * 100 <= one["capacity"]["qps"] <= 100 and 0.8 * 800 <= eight["capacity"]["qps"] <= 800
    # the server that stopped answering past 480/s: its probes below stand, the failed ones say why
    assert two_copies["capacity"]["qps"] <= 480 and two_copies["capacity"]["bracket"][1] > 480
    assert any("stopped answering" in (r.get("errors") or [""])[0] for r in two_copies["curve"])
    Sweep.model_validate(found)  # the report reads a failed probe as any other
    assert found["best"]["label"] == eight["label"] and eight["max_queue"] == 160
    assert found["batching_gain"]["ratio"] == pytest.approx(eight["capacity"]["qps"] / one["capacity"]["qps"])
    assert any("f.onnx@served: server at" in line for line in said)
    assert any("served sweep of batch≤4" in line and "stopped" in line for line in said)


def test_a_probe_the_server_refused_queries_in_is_not_sustainable_and_offline_counts_only_answers():
    probe = refusals_counted({**run_at(50.0, 2.0, (1.8, 2.2)), "queries": 400}, refused=3)
    assert probe["sustainable"] is False and "refused 3 of 400" in probe["sustainable_reason"]
    assert not passes(probe, BUDGET_MS, "point")
    offline = refusals_counted({"scenario": "offline", "completed_qps": 200.0, "queries": 1000}, refused=250)
    assert offline["completed_qps"] == pytest.approx(150.0) and offline.get("sustainable") is None
    clean = run_at(50.0, 2.0, (1.8, 2.2))
    assert refusals_counted(clean, 0) is clean
