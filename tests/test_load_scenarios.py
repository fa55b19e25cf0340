"""Latency under traffic: a simulated model behind the serving loop, driven by MLPerf LoadGen (the plumbing, and
verdicts a busy machine cannot overturn); the capacity rules, the gate's server-scenario rule, the pipeline's
latency section. Timing claims with known answers are tested on a fake clock (tests/test_queue_simulation.py)."""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import yaml

from compress.cli import main
from compress.config import Latency
from serve_bench.limits import Limits
from serve_bench.report_model import Report
from tests.report_entries import as_entries, as_entry
from tests.report_invariants import untyped_keys
from serve_bench.gate import evaluate
from serve_bench.load.capacity import best_config, capacity, passes
from serve_bench.load.loadgen_scenarios import ScenarioSettings, run_scenario
from serve_bench.load.queue_growth import bounded
from serve_bench.load.serving_loop import ServingLoop, ServingSettings
from serve_bench.latency.sweep import batching_gain
from serve_bench.runners import make_runner, physical_cores
from tests.conftest import TINY

POOL = np.zeros((32, 1, 2, 2), dtype=np.float32)


def serve(scenario: ScenarioSettings, serving: ServingSettings | None = None, **model) -> dict:
    """One LoadGen test of the simulated model (options ``model``) behind a serving loop, in this process."""
    serving = serving or ServingSettings()
    copies = [make_runner("simulated", "-", **model).load() for _ in range(serving.instances)]
    loop = ServingLoop([c.infer for c in copies], POOL, serving, done=lambda tags: None)
    return run_scenario(loop, len(POOL), scenario)


def server(qps: float, seconds: float, budget_ms: float | None = 50.0, **model) -> dict:
    return serve(ScenarioSettings(scenario="server", target_qps=qps, duration_s=seconds, min_queries=1,
                                  target_latency_ms=budget_ms), **model)


# --- real LoadGen runs of a simulated model -------------------------------------------------------------------

def test_a_short_loadgen_run_reaches_the_serving_loop_and_back():
    """The plumbing, with assertions no busy neighbour can break: every query LoadGen scheduled was served once
    and answered, one at a time, the mean of its trace is LoadGen's own (the same queries), and the
    run records what it was asked. Timing claims (the p99 against load, a stall, batching) are tested on the fake
    clock in tests/test_queue_simulation.py and measured on real time by python -m serve_bench.load.traffic_check."""
    loop = ServingLoop([make_runner("simulated", "-", service_ms=1.0).load().infer], POOL, ServingSettings(),
                       done=lambda tags: None)
    stop, served = loop.stop, []
    loop.stop = lambda: served.append(stop()) or served[-1]
    run = run_scenario(loop, len(POOL), ScenarioSettings(scenario="server", target_qps=100, duration_s=0.5,
                                                         min_queries=50, target_latency_ms=50.0), keep_raw=True)
    assert run["scenario"] == "server" and run["offered_qps"] == 100 and run["loadgen"]["target_latency_ms"] == 50.0
    assert run["queries"] >= 50 and len(run["latencies_ms"]) == len(run["schedule_s"]) == run["queries"]
    assert len(served[0].queue_ns) == run["queries"] and not run["errors"]  # each scheduled query served once
    assert set(served[0].batch.tolist()) == {1} and run["mean_batch"] == 1.0
    assert run["latencies_ms"].mean() == pytest.approx(run["loadgen"]["mean_ms"], rel=1e-4)
    kept = run["queries"] - run["steady_state"]["discarded"]  # the open last busy period is not steady state
    assert run["steady_state"]["cycles"] >= 1 and kept <= run["queries"]
    assert np.all(run["latencies_ms"] > 0) and np.all(np.diff(run["schedule_s"]) >= 0)


def test_saturation_is_reported_as_not_sustainable():
    """ρ ≈ 1.7: the queue grows for as long as arrivals last. The margin holds on a machine 2× slower, or slower
    still: a sleep only overshoots, so a slower machine raises ρ, and a queue growing from empty climbs linearly
    whatever its slope (its last quarter's median about 7× its first's, against the 2× the rule asks); the
    completed rate is at most 500/800 of the scheduled one (a 2 ms sleep serves 500/s at most), and less the
    slower the service."""
    run = server(800, 1.0, service_ms=2.0)
    assert not run["sustainable"] and run["sustainable_reason"].startswith("not sustainable")
    assert run["completed_qps"] < 0.8 * run["scheduled_qps"]
    cap = capacity([{**run, "within_budget": None}], budget_ms=50.0)
    assert cap["qps"] is None and cap["status"] == "not_sustainable" and "not sustainable" in cap["reason"]


def test_a_run_too_short_for_a_p99_claim_is_refused_under_confident_and_said():
    tiny = server(100, 0.3, budget_ms=20.0, service_ms=1.0)  # ~30 queries: not even a verdict on the queue
    refused = evaluate(as_entries([artifact_with_run("a", tiny)]), Limits(max_drop=1.0, p99_budget_ms=20.0, decision="point"), accuracy_meaningful=False)
    assert tiny["sustainable"] is None and not refused["passed"] and "unknown" in refused["reasons"][-1]
    run = server(100, 1.5, budget_ms=20.0, service_ms=1.0)  # ~150 queries: no claim about a 99th percentile
    assert not run["loadgen"]["valid"]
    assert any("more queries" in line or "queries" in line for line in run["loadgen"]["early_stopping"]), \
        run["loadgen"]
    art = artifact_with_run("a", run)
    point = evaluate(as_entries([art]), Limits(max_drop=1.0, p99_budget_ms=20.0, decision="point"), accuracy_meaningful=False)
    sure = evaluate(as_entries([art]), Limits(max_drop=1.0, p99_budget_ms=20.0, decision="confident"), accuracy_meaningful=False)
    assert point["passed"] and point["release"] == "a"
    assert not sure["passed"] and "INVALID" in sure["reasons"][-1] and "queries" in sure["reasons"][-1]
    assert "server scenario at 100.0 queries/s" in sure["latency_basis"]


# --- the rules on known curves ---------------------------------------------------------------------------------

def run_at(qps: float, p99: float, ci: tuple[float, float], valid: bool = True, sustainable: bool = True) -> dict:
    return {"scenario": "server", "offered_qps": qps, "latency_ms": {"p50": p99 / 2, "p99": p99}, "p99_ci": list(ci),
            "loadgen": {"valid": valid, "invalid_reasons": [] if valid else ["Reduce target QPS"],
                        "early_stopping": []},
            "sustainable": sustainable, "sustainable_reason": "sustainable" if sustainable else
            "not sustainable: completed 90/s of 100/s offered (the queue grows without bound)"}


def artifact_with_run(name: str, run: dict, carried: float | None = None, curve: list[dict] | None = None) -> dict:
    """A report entry gated on ``run``; swept (judged at 2 ms, confident) where ``carried`` is given."""
    sweep = None if carried is None else {"best": {"capacity": {"qps": carried, "budget_ms": 2.0, "rule": "confident"}},
                                          "configs": [{"curve": curve or []}]}
    return {"name": name, "latency_ms": {"p99": 0.1, "p99_ci_blocks": [0.09, 0.11]},
            "traffic": {"scenario": "server", "at_target": run, "sweep": sweep}}


CURVE = [run_at(100, 1.0, (0.9, 1.1)), run_at(200, 1.5, (1.3, 1.8)), run_at(300, 1.9, (1.6, 2.3)),
         run_at(400, 2.6, (1.95, 3.0)), run_at(500, 9.0, (7.0, 12.0), sustainable=False)]


def test_capacity_is_the_highest_rate_within_the_budget_with_its_interval_from_the_same_runs():
    cap = capacity(CURVE, budget_ms=2.0)
    assert cap["qps"] == 300 and cap["bracket"] == [300, 400]
    assert cap["ci"] == [200, 400]  # 95%-sure up to 200/s (upper ends ≤ 2 ms); not excluded up to 400/s
    assert cap["status"] == "ok" and not cap["censored"]
    assert capacity(CURVE, budget_ms=2.0, decision="confident")["qps"] == 200
    assert capacity(CURVE[:3], budget_ms=2.0)["censored"]  # every probed rate passed: at least 300/s


def test_a_pass_above_a_failure_is_noise_not_capacity():
    noisy = [CURVE[0], run_at(200, 2.5, (2.1, 3.0)), CURVE[2]]
    assert capacity(noisy, budget_ms=2.0)["qps"] == 100


def test_no_rate_within_the_budget_is_a_result_not_a_number():
    cap = capacity([run_at(100, 5.0, (4.0, 6.0))], budget_ms=2.0)
    assert cap["qps"] is None and cap["status"] == "none_within_budget" and "none within budget" in cap["reason"]
    cap = capacity([run_at(100, 1.9, (1.5, 2.4))], budget_ms=2.0, decision="confident")
    assert cap["qps"] is None and cap["status"] == "not_confident" and "upper bound 2.400 ms" in cap["reason"]


def test_configurations_are_filtered_by_the_constraint_then_ranked_by_load():
    configs = [{"serving": {"max_batch": 1, "instances": 1}, "capacity": {"qps": 300.0, "ci": [200.0, 400.0]},
                "label": "b1"},
               {"serving": {"max_batch": 8, "instances": 1}, "capacity": {"qps": 900.0, "ci": [700.0, 1000.0]},
                "label": "b8"},
               {"serving": {"max_batch": 1, "instances": 2}, "capacity": {"qps": None, "ci": [None, None]},
                "label": "i2"}]
    assert best_config(configs)["label"] == "b8"
    gain = batching_gain(configs)
    assert gain["ratio"] == 3.0 and gain["ci"] == [pytest.approx(1.75), 5.0] and gain["over"] == "b1"
    assert best_config([configs[2]]) is None


def test_passing_rules():
    good, unsure = run_at(100, 1.0, (0.9, 1.1)), run_at(100, 1.9, (1.5, 2.2))
    assert passes(good, 2.0, "confident") and passes(unsure, 2.0, "point") and not passes(unsure, 2.0, "confident")
    assert passes(unsure, 2.0, "possible")
    assert passes(run_at(100, 1.0, (0.9, 1.1), valid=False), 2.0, "confident")  # a short probe: LoadGen not asked
    assert not passes(run_at(100, 1.0, (0.9, 1.1), sustainable=False), 2.0, "point")


def test_a_growing_queue_is_caught_and_one_slow_last_query_is_not():
    rng = np.random.default_rng(0)
    schedule = np.cumsum(rng.exponential(0.01, 2000))  # 100 arrivals/s for 20 s
    steady = rng.exponential(1.0, 2000)  # ms
    assert bounded(schedule, steady)[0]
    stuck = steady.copy()
    stuck[-100:] = 2000.0  # the server stopped answering for the last second of arrivals
    ok, why = bounded(schedule, stuck)
    assert ok is False and "still in the system" in why
    late = steady.copy()
    late[-1] = 500.0  # LoadGen's completed/s would read 20 s / 20.5 s = 0.976 of the offered rate for this alone
    assert bounded(schedule, late)[0]


def test_a_run_whose_model_failed_never_passes_and_says_so():
    failed = {**run_at(100, 0.01, (0.01, 0.02)), "errors": ["RunnerError: batch 8 > the engine's profile max 4"]}
    assert not passes(failed, 2.0, "point")
    cap = capacity([failed], budget_ms=2.0)
    assert cap["qps"] is None and cap["status"] == "model_failed" and "profile max 4" in cap["reason"]


def test_loadgen_validity_for_another_budget_is_not_taken_as_a_claim_about_this_one():
    run = run_at(100, 1.0, (0.9, 1.1), valid=False)
    run["loadgen"]["target_latency_ms"] = 0.5  # measured against a 0.5 ms budget: invalid for that claim
    art = artifact_with_run("a", run)
    assert not evaluate(as_entries([art]), Limits(max_drop=1.0, p99_budget_ms=0.5, decision="confident"), accuracy_meaningful=False)["passed"]
    # re-gated at 2 ms: LoadGen's claim was about 0.5 ms, so the p99 interval decides alone
    assert evaluate(as_entries([art]), Limits(max_drop=1.0, p99_budget_ms=2.0, decision="confident"), accuracy_meaningful=False)["passed"]


def test_the_gate_ranks_by_traffic_carried_when_every_candidate_was_swept():
    a = artifact_with_run("a", run_at(300, 1.0, (0.9, 1.1)), carried=400.0)
    b = artifact_with_run("b", run_at(300, 0.8, (0.7, 0.9)), carried=900.0)
    gate = evaluate(as_entries([a, b]), Limits(max_drop=1.0, p99_budget_ms=2.0, decision="confident"), accuracy_meaningful=False)
    assert gate["release"] == "b" and gate["ranked_by"].startswith("most traffic")
    # re-gated at 3 ms on point estimates: each configuration's capacity is judged again from its curve
    a = artifact_with_run("a", run_at(300, 1.0, (0.9, 1.1)), carried=400.0, curve=CURVE)  # 400/s within 3 ms
    b = artifact_with_run("b", run_at(300, 0.8, (0.7, 0.9)), carried=900.0, curve=CURVE[:2])  # only 200/s probed
    assert evaluate(as_entries([a, b]), Limits(max_drop=1.0, p99_budget_ms=3.0, decision="point"), accuracy_meaningful=False)["release"] == "a"
    late = artifact_with_run("late", run_at(300, 2.5, (2.2, 2.9)))
    stuck = artifact_with_run("stuck", run_at(300, 1.0, (0.9, 1.1), sustainable=False))
    gate = evaluate(as_entries([late, stuck]), Limits(max_drop=1.0, p99_budget_ms=2.0, decision="point"), accuracy_meaningful=False)
    assert not gate["passed"]
    assert any("p99 2.500 ms at 300.0 queries/s > budget 2 ms" in r for r in gate["reasons"])
    assert any("stuck: at 300.0 queries/s: not sustainable" in r for r in gate["reasons"])


def test_the_latency_section_names_the_traffic():
    assert Latency(p99_budget_ms=2.0, scenario="server", target_qps=300).target_qps == 300
    with pytest.raises(ValueError, match="needs target_qps"):
        Latency(scenario="server")
    with pytest.raises(ValueError, match="applies to the server scenario"):
        Latency(target_qps=100)


# --- the bench stage gating on the server scenario ------------------------------------------------------------

def test_a_pipeline_gated_on_the_server_scenario_reports_loadgen_and_the_harness_overhead(tmp_path, capsys):
    config = copy.deepcopy(TINY)
    config["latency"] = {"p99_budget_ms": 1000.0, "scenario": "server", "target_qps": 200}
    config["red_line"] = {"metric": "top1", "max_drop": 50.0}
    config["gate"] = {"decision": "point"}
    config["stages"] += [{"name": "export", "kind": "export", "parity": {"samples": 32}},
                         {"name": "bench", "kind": "bench", "min_iters": 200, "min_samples": 200,
                          "min_duration_s": 0.0, "warmup_iters": 5, "warmup_s": 0.0, "block_iters": 50, "threads": 1,
                          "settle_s": 0.0, "block_s": 0.0, "profile_iters": 5,
                          "traffic": {"duration_s": 0.6, "min_queries": 50, "warmup_s": 0.2,
                                      "max_queries": 500}}]
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["run", str(path), "--run-dir", str(tmp_path / "run")]) == 0
    folder = tmp_path / "run" / "bench" / "report"
    report = json.loads((folder / "report.json").read_text())
    assert report["gate"]["latency_basis"].startswith("server scenario at 200.0 queries/s")
    assert untyped_keys(Report, report) == []  # every key the traffic measurement writes is in the reference
    for art in report["artifacts"]:
        run = art["traffic"]["at_target"]
        assert run["scenario"] == "server" and run["offered_qps"] == 200 and run["queries"] >= 50
        assert run["sustainable"] and run["serving"]["max_batch"] == 1
        assert run["serving"]["threads"] == max(1, physical_cores() - 1)  # a core left to LoadGen and the batcher
        assert {"queue_ms", "compute_ms", "p99_ci", "loadgen"} <= set(run)
        assert run["loadgen"]["early_stopping"]  # LoadGen's own words, kept
        assert run["tests"] >= 2 and run["steady_state"]["rounds"] == run["tests"]  # the files took turns
        profile = art["operator_profile"]
        assert profile["ops"] and abs(sum(o["share"] for o in profile["ops"]) - 1) < 1e-6
    overhead = report["traffic"]["sut_overhead"]
    assert overhead["single-stream"]["latency_ms"]["p50"] < 1.0 and overhead["server"]["offered_qps"] == 200
    md = (folder / "report.md").read_text()
    assert "Latency under traffic" in md and "Harness overhead" in md and "Where the time goes" in md


def test_the_search_objective_for_the_most_traffic_ranks_by_load_carried():
    from compress.search.final_gate import _objective_key
    from compress.search.objective import MOST_TRAFFIC, rank_key, values

    busy, idle, none = ({"carried_qps": 900.0, "drop": 0.4, "p99_ratio": 0.5},
                        {"carried_qps": 300.0, "drop": 0.1, "p99_ratio": 0.2},
                        {"carried_qps": None, "drop": 0.0, "p99_ratio": 0.1})
    assert values(busy, MOST_TRAFFIC, "tpe") == [-900.0] and values(none, MOST_TRAFFIC, "tpe") == [0.0]
    assert sorted([idle, none, busy], key=lambda o: rank_key(o, MOST_TRAFFIC)) == [busy, idle, none]
    swept = {"accuracy_drop": 0.2, "traffic": {"sweep": {"best": {"capacity": {"qps": 700.0}}}}}
    assert _objective_key(as_entry(swept), MOST_TRAFFIC) == (-700.0, 0.2)


def test_loadgen_early_stopping_estimates_are_read_as_numbers():
    from serve_bench.load.loadgen_scenarios import early_stopping_estimates

    lines = ["Processed at least 662 queries (1263).", "Would discard 3 highest latency queries.",
             "Early stopping 99.0th percentile estimate: 5488736", "Early stopping 90.0th percentile estimate: 912000"]
    assert early_stopping_estimates(lines) == {"p99": 5.488736, "p90": 0.912}
    assert early_stopping_estimates(["Run unsuccessful.", "Processed 288 queries."]) == {}
