"""Latency under traffic for every artifact of a bench run, the artifacts taking turns.

Each artifact's worker runs LoadGen against its own serving loop (one process per artifact, as
for the closed-loop blocks); the parent only says which test to run next, pauses before each so
the previous runtime's threads sleep, and records how busy the machine was meanwhile. Three
things can be asked for:
- the pipeline's scenario at its traffic (``at_target``: what the gate reads for the server scenario);
- a sweep (serve_bench.latency.sweep): per serving configuration, the latency–load curve and the highest load
  within the budget; under the served scenario, again through each served file's model server;
- the harness's own overhead: the same tests of a model that does nothing, reported beside every figure.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Callable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from serve_bench.load.capacity import within_budget
from serve_bench.load.loadgen_scenarios import Scenario
from serve_bench.load.rounds import RoundsRule
from serve_bench.load.serving_loop import ServingSettings
from serve_bench.runners import SimulatedRunner
from serve_bench.latency.machine_load import LoadSampler, load_summary
from serve_bench.latency.sweep import run_words, sweep
from serve_bench.latency.traffic_rounds import groups_of, measure_in_rounds, pair_runs
from serve_bench.latency.worker import BenchWorker
from train.progress import LiveBar

log = logging.getLogger(__name__)


def _default_configs() -> list[ServingSettings]:
    return [ServingSettings(), ServingSettings(max_batch=8, max_queue_delay_us=2000)]


class TrafficSettings(BaseModel):
    """How the bench measures latency under traffic (the scenario and its rate are the pipeline's ``latency``)."""

    model_config = ConfigDict(extra="forbid")
    loadgen: bool | None = Field(None, description="run the pipeline's scenario under MLPerf LoadGen for every "
                                                   "artifact; default: for the server scenario (single-stream is "
                                                   "the closed-loop harness's own measurement)")
    duration_s: float = Field(2.0, gt=0, description="LoadGen's minimum duration of each test")
    min_queries: int = Field(1000, ge=1, description="the queries of each file's first round at each at-target "
                                                     "and `loads` rate (LoadGen's verdict is that test's: its early "
                                                     "stopping needs about 700 queries with none past the budget to "
                                                     "claim a 99th percentile) and the most a later round holds")
    sweep_min_queries: int = Field(300, ge=1, description="the same for each probe of the sweep, so a slow model's "
                                                          "low rates do not take minutes")
    serving: ServingSettings = Field(default_factory=ServingSettings, description="the serving configuration of "
                                     "the at-target test (the one the gate reads)")
    sweep: bool = Field(False, description="find each artifact's highest load within the p99 budget for every "
                                           "configuration in `configs`")
    configs: list[ServingSettings] = Field(default_factory=_default_configs, min_length=1,
                                           description="the serving configurations the sweep compares (instances, "
                                                       "batching)")
    sweep_artifacts: list[str] | None = Field(None, description="the artifacts the sweep measures; default: all (a "
                                                                "slow baseline's low rates can take minutes)")
    rates: list[float] = Field([0.25, 0.5, 0.7, 0.85, 1.0], min_length=1,
                               description="sweep rates as fractions of the configuration's offline throughput")
    refine: int = Field(2, ge=0, description="bisection probes after the grid, between the last rate within the "
                                             "budget and the first past it")
    loads: list[float] = Field([], description="arrival rates (queries/s) every artifact is also measured at with "
                                               "the serving configuration above: a latency-at-load table whose "
                                               "rows compare at the same traffic")
    overhead: bool = Field(True, description="measure the harness on a model that does nothing, for the report")
    warmup_s: float = Field(1.0, ge=0, description="traffic at the test's rate for this long before each server "
                                                   "measurement, not counted (a first test of a worker was seen to "
                                                   "read a p99 4× its later ones at the same rate)")
    max_queries: int = Field(20000, ge=1, description="the at-target, `loads` and confirmation tests measure again "
                                                      "until their steady-state p99 is precise, up to this many "
                                                      "queries in all (then the report says so)")
    rounds: int = Field(5, ge=2, description="the at-target and `loads` tests take turns across the files, round "
                                             "after round (each round one test per file and rate, sized by "
                                             "`round_s`), at least this many rounds before a p99 may be called "
                                             "precise: its interval counts the differences between rounds (the "
                                             "machine's drift)")
    round_s: float = Field(2.0, gt=0, description="a round's test lasts this long at slow rates (200 queries at "
                                                  "least, `min_queries` at most, more near load): more, shorter "
                                                  "rounds narrow an interval that counts the machine's drift sooner")
    sweep_max_queries: int = Field(5000, ge=1, description="the same cap for each probe of the sweep")
    min_tail_cycles: int = Field(20, ge=0, description="busy periods reaching the p99 a precise figure rests on")
    precision: float = Field(0.25, gt=0, description="a precise p99's interval: its upper end within this fraction "
                                                     "of the point, or wholly on one side of the budget")
    confirm: bool = Field(True, description="after the sweep, measure each configuration at its capacity with the "
                                            "at-target test's length: the capacity's p99 and interval are that run's")
    seed: int = Field(0, ge=0, description="LoadGen's schedule seed")
    served: bool = Field(False, description="also measure each ONNX file through the model server it ships on "
                                            "(Ray Serve, on loopback), at the pipeline's rate in rounds alternating "
                                            "with the same file in process: what the server adds to the p99, with "
                                            "its interval, and where the time goes (the served scenario); with "
                                            "`sweep`, each served file is swept again on its server's own batcher, "
                                            "one server per configuration, for the load the server sustains")
    served_artifacts: list[str] | None = Field(None, description="the files the served scenario measures; default: "
                                                                 "every ONNX file a server here runs (each starts "
                                                                 "its own server, about 15 s)")


Progress = Callable[[str], None]


class _Turns:
    """Runs one worker command after the settle pause, recording other processes' share of the cores."""

    def __init__(self, workers: dict[str, BenchWorker], settle_s: float, bar: LiveBar | None = None) -> None:
        self.workers, self.settle_s, self.bar = workers, settle_s, bar
        self.sampler = LoadSampler([os.getpid(), *(w.process.pid for w in workers.values())])
        self.loads: dict[str, list] = {name: [] for name in workers}

    def __call__(self, name: str, *command, tests: int = 1) -> dict:
        time.sleep(self.settle_s)
        before = self.sampler.snapshot()
        result = self.workers[name].call(*command)
        self.loads[name].append(self.sampler.other_share(before))
        if self.bar is not None:
            self.bar.update(advance=tests, note=name)
        return result


def planned_tests(names: list[str], scenario: Scenario, settings: TrafficSettings) -> int:
    """How many LoadGen tests the traffic measurement plans (the rounds' least, the sweep's most: it stops a file's
    grid early once two rates miss the budget): the bar's total."""
    swept = [n for n in names if settings.sweep_artifacts is None or n in settings.sweep_artifacts]
    per_config = 1 + len(settings.rates) + settings.refine + (1 if settings.confirm else 0)
    in_rounds = (scenario == "server" and runs_loadgen(settings, scenario)) + len(settings.loads)
    return (len(names) * ((runs_loadgen(settings, scenario) and scenario != "server") + in_rounds * settings.rounds)
            + (len(settings.configs) * len(swept) * per_config if settings.sweep else 0))


def _scenario(kind: Scenario, settings: TrafficSettings, budget_ms: float | None, qps: float | None = None,
              expected_ms: float = 1.0, probe: bool = False) -> dict:
    out = {"scenario": kind, "target_qps": qps, "duration_s": settings.duration_s,
           "min_queries": settings.sweep_min_queries if probe else settings.min_queries,
           "target_latency_ms": budget_ms, "seed": settings.seed, "expected_latency_ms": max(expected_ms, 0.001)}
    if kind == "server":
        out.update(warmup_s=settings.warmup_s, min_tail_cycles=settings.min_tail_cycles, precision=settings.precision,
                   max_queries=settings.sweep_max_queries if probe else settings.max_queries)
    return out


def sweep_plan(settings: TrafficSettings, budget_ms: float | None, decision: str, progress: Progress,
               service_ms: dict[str, float]) -> dict:
    """The sweep's keywords from the bench's traffic settings (serve_bench.latency.sweep.sweep_config)."""
    def scenario(kind: Scenario, qps: float | None, expected_ms: float = 1.0, probe: bool = False) -> dict:
        return _scenario(kind, settings, budget_ms, qps, expected_ms, probe)

    return {"rates": list(settings.rates), "refine": settings.refine, "confirm": settings.confirm,
            "scenario": scenario, "budget_ms": budget_ms, "decision": decision, "progress": progress,
            "service_ms": service_ms}


def runs_loadgen(settings: TrafficSettings, scenario: Scenario) -> bool:
    return settings.loadgen if settings.loadgen is not None else scenario == "server"


def wanted(settings: TrafficSettings | None, scenario: Scenario) -> bool:
    """Whether the bench measures anything under LoadGen at all."""
    return settings is not None and (runs_loadgen(settings, scenario) or settings.sweep or bool(settings.loads))


def measure_traffic(workers: dict[str, BenchWorker], *, scenario: Scenario, target_qps: float | None,
                    budget_ms: float | None, decision: str, settings: TrafficSettings, settle_s: float,
                    expected_ms: dict[str, float], null_pool: np.ndarray | None = None,
                    progress: Progress | None = None,
                    pairs: dict[str, dict[str, str]] | None = None,
                    servable: dict[str, dict] | None = None,
                    served_pool: np.ndarray | None = None,
                    measured_at: str = "in_process") -> tuple[dict[str, dict], dict]:
    """Per artifact its ``traffic`` report entry, and the report-level ``traffic`` facts (the harness overhead).
    ``pairs[file]`` names the files its server runs are paired with, by role ("fp32": an INT8 file's float file).
    ``servable[file]`` (runtime, path, runner options) names the files a model server here can run: the served
    scenario measures them (``settings.served``), each through its server, one at a time, with requests drawn from
    ``served_pool`` (one image each). ``measured_at`` "served" marks every entry so its gated run is the served
    one."""
    say = progress or log.info
    names = list(workers)
    with LiveBar("traffic tests", planned_tests(names, scenario, settings)) as bar:
        entries = _measure_traffic(_Turns(workers, settle_s, bar), names, scenario=scenario, target_qps=target_qps,
                                   budget_ms=budget_ms, decision=decision, settings=settings,
                                   expected_ms=expected_ms, say=say, pairs=pairs or {})
    if settings.served and scenario == "server" and target_qps and served_pool is not None:
        _measure_served(entries, workers, servable or {}, target_qps=target_qps, budget_ms=budget_ms,
                        decision=decision, settings=settings, settle_s=settle_s, expected_ms=expected_ms,
                        pool=served_pool, say=say, pairs=pairs or {})
    if measured_at == "served":
        for entry in entries.values():
            entry["measured_at"] = "served"
    facts = {"scenario": scenario, "target_qps": target_qps, "p99_budget_ms": budget_ms, "measured_at": measured_at,
             "settings": settings.model_dump(mode="json"), "sut_overhead": None}
    if settings.overhead and null_pool is not None:
        facts["sut_overhead"] = harness_overhead(null_pool, scenario, target_qps, settings, settle_s)
    return entries, facts


def _measure_traffic(turns: _Turns, names: list[str], *, scenario: Scenario, target_qps: float | None,
                     budget_ms: float | None, decision: str, settings: TrafficSettings, expected_ms: dict[str, float],
                     say: Progress, pairs: dict[str, dict[str, str]]) -> dict[str, dict]:
    entries: dict[str, dict] = {name: {"scenario": scenario, "target_qps": target_qps, "at_target": None,
                                       "sweep": None} for name in names}
    serving = settings.serving.model_dump()
    at_target = runs_loadgen(settings, scenario)
    if at_target and scenario != "server":  # single-stream or offline: one test, no queue to measure in rounds
        for name in names:
            run = turns(name, "serve", serving, _scenario(scenario, settings, budget_ms, target_qps,
                                                           expected_ms.get(name, 1.0)))
            entries[name]["at_target"] = run
            say(run_words(name, run))
    rates = ([target_qps] if at_target and scenario == "server" else []) + list(settings.loads)
    if rates:
        rule = RoundsRule(min_rounds=settings.rounds, max_queries=settings.max_queries, budget_ms=budget_ms,
                          min_tail_cycles=settings.min_tail_cycles, precision=settings.precision)

        resolved: dict[str, dict] = {}  # each file's serving configuration, its threads filled in by its worker

        def turn(name: str, asked: list[dict]) -> list:
            answer = turns(name, "turn", serving, asked, tests=len(asked))
            resolved[name] = answer["serving"]
            return answer["tests"]

        measured = measure_in_rounds(turn, names, [_scenario("server", settings, budget_ms, qps) for qps in rates],
                                     rule, together=groups_of(pairs), say=say, round_s=settings.round_s)
        pair_runs(measured, pairs)
        for (name, i), (run, _) in measured.items():
            run["serving"], run["within_budget"] = resolved[name], within_budget(run, budget_ms)
            say(run_words(name, run))
            if at_target and scenario == "server" and i == 0:
                entries[name]["at_target"] = run
            else:
                entries[name].setdefault("loads", []).append(run)
    if settings.sweep:
        swept = [n for n in names if settings.sweep_artifacts is None or n in settings.sweep_artifacts]
        for name, record in sweep(turns, swept, settings.configs, **sweep_plan(settings, budget_ms, decision, say,
                                                                            expected_ms)).items():
            entries[name]["sweep"] = record
    for name in names:
        entries[name]["machine_load"] = load_summary(turns.loads[name])
    return entries


def _measure_served(entries: dict[str, dict], workers: dict[str, BenchWorker], servable: dict[str, dict], *,
                    target_qps: float, budget_ms: float | None, decision: str, settings: TrafficSettings,
                    settle_s: float, expected_ms: dict[str, float], pool: np.ndarray, say: Progress,
                    pairs: dict[str, dict[str, str]]) -> None:
    """Each servable file's ``served`` record (serve_bench.latency.served), after every in-process figure, an INT8
    file and its fp32 file (``pairs``) through one server in the same rounds; where the bench sweeps
    (``traffic.sweep``), the served files it sweeps are swept again through their server."""
    from serve_bench.latency.served import measure_served
    from serve_bench.latency.served_sweep import sweep_served

    wanted_files = [n for n in workers if n in servable and entries[n]["at_target"] is not None
                    and (settings.served_artifacts is None or n in settings.served_artifacts)]
    for name in workers:
        if name in wanted_files:
            continue
        entries[name]["served"] = {"failed": "not served: " + (
            "left out by traffic.served_artifacts" if settings.served_artifacts is not None
            and name not in settings.served_artifacts else
            "no model server here runs this file (an ONNX file on a CPU runtime is served)" if name not in servable
            else "no at-target test to take the serving settings from")}
    if not wanted_files:
        return
    rule = RoundsRule(min_rounds=settings.rounds, max_queries=settings.max_queries, budget_ms=budget_ms,
                      min_tail_cycles=settings.min_tail_cycles, precision=settings.precision)
    served = measure_served(workers, {n: servable[n] for n in wanted_files},
                            scenario=_scenario("server", settings, budget_ms, target_qps), rule=rule,
                            budget_ms=budget_ms, serving={n: entries[n]["at_target"]["serving"] for n in wanted_files},
                            service_ms=expected_ms, pool=pool, round_s=settings.round_s, settle_s=settle_s, say=say,
                            pairs=pairs)
    for name, record in served.items():
        entries[name]["served"] = record
        if "run" in record:
            say(run_words(f"{name} served", record["run"]))
    swept = [n for n, record in served.items() if "run" in record
             and (settings.sweep_artifacts is None or n in settings.sweep_artifacts)]
    if settings.sweep and swept:
        # an offline test through the server is sized by the served p50 (LoadGen issues rate × duration queries
        # at once, and the server answers far fewer a second than the file alone); the queue limit, as a
        # release's, by the file's own service time
        through = {n: max(expected_ms.get(n, 1.0), served[n]["run"]["latency_ms"]["p50"]) for n in swept}
        found = sweep_served({n: servable[n] for n in swept}, settings.configs,
                             budget_ms=budget_ms, service_ms=expected_ms, pool=pool, settle_s=settle_s, say=say,
                             plan=sweep_plan(settings, budget_ms, decision, say, through))
        for name, record in found.items():
            entries[name]["served"]["sweep"] = record


def harness_overhead(pool: np.ndarray, scenario: Scenario, target_qps: float | None, settings: TrafficSettings,
                     settle_s: float) -> dict:
    """The same LoadGen tests of a model that answers at once: the harness's own latency per query."""
    serving = settings.serving.model_dump()
    with BenchWorker("harness-overhead", SimulatedRunner.runtime, "-", {"service_ms": 0.0}, pool, 1) as null:
        time.sleep(settle_s)
        out = {"single-stream": null.call("serve", serving, _scenario("single-stream", settings, None, None, 0.05))}
        if scenario == "server" and target_qps:
            time.sleep(settle_s)
            out["server"] = null.call("serve", serving, _scenario("server", settings, None, target_qps))
    return out
