"""MLPerf LoadGen driving the serving loop: single-stream, server and offline, as LoadGen names them.

LoadGen (``mlcommons-loadgen``, imported as ``mlperf_loadgen``) owns the traffic: in the server
scenario it draws Poisson arrival times from its own seeded schedule and counts each query's
latency from its *scheduled* send time, so a model that stalls makes the queries scheduled
behind it late, as real users would be (a closed-loop client would simply wait and send fewer).
This module is the system under test (SUT) LoadGen calls: it hands queries to a
:class:`ServingLoop` and reports completions. It runs inside the artifact's worker process.

What comes back is LoadGen's own: its percentiles, its early-stopping verdict and its validity
("too few queries to claim a p99" is LoadGen saying the run is INVALID, kept as it said it),
plus each query's latency from LoadGen's trace, in schedule order. In the server scenario the p99 and
its interval come from steady state (serve_bench.load.steady_state: complete busy periods as independent
blocks), measured again with more queries until precise or a cap, after traffic at the target rate that
is not counted (the first test of a worker ran slow, and one 2-second test decided a release).
"""
from __future__ import annotations

import json
import logging
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from serve_bench.stats.latency_intervals import BlockedSamples, block_bootstrap_ci
from serve_bench.load.percentiles import PERCENTILE_KEYS, percentiles_ms
from serve_bench.load.serving_loop import ServedRecords, ServingLoop
from serve_bench.load.queue_growth import bounded
from serve_bench.load.steady_state import MIN_QUERIES, Segment, SteadyP99, queries_wanted, steady_p99

log = logging.getLogger(__name__)

Scenario = Literal["single-stream", "server", "offline"]
OF_CYCLES = "the complete busy periods"  # a server record's `percentiles_of` where its p99 is steady state's


class ScenarioSettings(BaseModel):
    """One LoadGen test: the scenario, the traffic, and how long it lasts."""

    model_config = ConfigDict(extra="forbid")
    scenario: Scenario = "server"
    target_qps: float | None = Field(None, gt=0, description="server: Poisson arrivals per second; offline: the "
                                                             "expected throughput LoadGen sizes the query by")
    duration_s: float = Field(3.0, gt=0, description="LoadGen's minimum duration")
    min_queries: int = Field(1000, ge=1, description="LoadGen's minimum query count")
    max_duration_s: float = Field(60.0, gt=0, description="LoadGen stops issuing after this long")
    target_latency_ms: float | None = Field(None, gt=0, description="the p99 LoadGen's early stopping and validity "
                                                                    "judge against (the budget)")
    expected_latency_ms: float = Field(1.0, gt=0, description="single-stream: LoadGen's query-count estimate")
    seed: int = Field(0, ge=0, description="LoadGen's schedule, sample-index and sample-set seeds")
    warmup_s: float = Field(0.0, ge=0, description="server: traffic at the target rate for this long before the "
                                                   "measured test, not counted (thread pools, caches and the "
                                                   "batcher reach their working state)")
    max_queries: int | None = Field(None, ge=1, description="server: measure again, with more queries, until the "
                                                            "steady-state p99 is precise or the queries of all "
                                                            "tests reach this cap; none: one test")
    min_tail_cycles: int = Field(20, ge=0, description="server: busy periods reaching the p99 a precise figure "
                                                       "rests on at least")
    precision: float = Field(0.25, gt=0, description="server: the upper end of the p99's interval within this "
                                                     "fraction of the point (or the interval wholly on one side "
                                                     "of the budget)")


def _mllog(detail: Path) -> dict:
    """``key → value`` of LoadGen's detail log (lines ``:::MLLOG {json}``); the last value of a key wins."""
    out = {}
    for line in detail.read_text(errors="replace").splitlines():
        if line.startswith(":::MLLOG "):
            try:
                record = json.loads(line[len(":::MLLOG "):])
            except json.JSONDecodeError:
                continue
            out[record.get("key")] = record.get("value")
    return out


_SAMPLE = re.compile(r'"name":"Sample".*?"ph":"b".*?"ts":([0-9.]+).*?"complete_ns":([0-9]+)')


def _trace_latencies(trace: Path) -> tuple[np.ndarray, np.ndarray]:
    """Each query's scheduled time (s from the start) and latency (ms) from it, in schedule order, from
    LoadGen's trace (a sample's begin event is stamped at its scheduled time, in µs)."""
    with trace.open(errors="replace") as lines:
        pairs = sorted((float(m.group(1)), int(m.group(2))) for m in map(_SAMPLE.search, lines) if m)
    return (np.array([ts for ts, _ in pairs], dtype=np.float64) / 1e6,
            np.array([ns for _, ns in pairs], dtype=np.float64) / 1e6)


def _early_stopping(summary: str) -> list[str]:
    """LoadGen's early-stopping lines from its summary, as it wrote them (estimates, or how many more queries)."""
    lines = summary.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith("Early Stopping Result"))
    except StopIteration:
        return []
    out = []
    for line in lines[start + 1:]:
        if not line.strip() or line.startswith("="):
            break
        out.append(line.strip(" *"))
    return out


_ESTIMATE = re.compile(r"Early stopping ([0-9.]+)th percentile estimate: ([0-9]+)")


def early_stopping_estimates(lines: list[str]) -> dict[str, float]:
    """LoadGen's early-stopping percentile estimates (single-stream), ``{"p99": ms}``: the latency the percentile
    is claimed to be within, given how many queries ran (a conservative figure beside the raw percentile)."""
    out = {}
    for match in filter(None, map(_ESTIMATE.search, lines)):
        out[f"p{float(match.group(1)):g}"] = round(int(match.group(2)) / 1e6, 6)
    return out


RETEST_SEED = 100_003  # a retest's schedule seed steps by this: no other test of the bench draws the same arrivals


@dataclass
class LoadGenTest:
    """What one LoadGen test left: its detail-log values and summary, each query's scheduled time (s) and latency
    (ms) in schedule order, the serving loop's records, the wall time and the model's errors."""

    results: dict
    summary: str
    schedule_s: np.ndarray
    latencies_ms: np.ndarray
    served: ServedRecords
    wall_s: float
    errors: list[str]

    @property
    def segment(self) -> Segment:
        return self.schedule_s, self.latencies_ms


def run_scenario(loop: ServingLoop, sample_count: int, settings: ScenarioSettings, keep_raw: bool = False) -> dict:
    """The test ``settings`` describe of ``loop`` (its pool holds ``sample_count`` inputs): LoadGen's figures and
    the SUT's. In the server scenario: ``warmup_s`` of traffic at the target rate first (not counted), then tests
    until the steady-state p99 is precise or ``max_queries`` is reached, each asking for as many queries as
    :func:`~serve_bench.load.steady_state.queries_wanted` says. ``keep_raw`` adds every query's scheduled time and
    latency (``schedule_s``, ``latencies_ms``: arrays of the last test, not for the report)."""
    server = settings.scenario == "server"
    if server and settings.warmup_s > 0:
        warm_up(loop, sample_count, settings)
    tests = [one_test(loop, sample_count, settings)]
    estimate = steady_of(tests, settings) if server else None
    while server and settings.max_queries is not None:
        left = settings.max_queries - sum(len(t.latencies_ms) for t in tests)
        # stop when precise, at the cap, with no room for a test long enough for a verdict, or when the queue grew
        if estimate.precise or left < MIN_QUERIES or bounded(*tests[-1].segment)[0] is False:
            break
        more = max(min(queries_wanted(estimate, settings.min_tail_cycles), left), MIN_QUERIES)
        log.info("server at %g/s: %s; measuring %d more queries", settings.target_qps, estimate.reason, more)
        retest = settings.model_copy(update={"min_queries": more, "seed": settings.seed + RETEST_SEED * len(tests)})
        tests.append(one_test(loop, sample_count, retest))
        estimate = steady_of(tests, settings)
    result = scenario_result(settings, tests, estimate)
    if keep_raw:
        result["schedule_s"], result["latencies_ms"] = tests[-1].schedule_s, tests[-1].latencies_ms
    return result


def one_turn(loop: ServingLoop, sample_count: int, tests: list[ScenarioSettings]) -> dict:
    """A file's turn in a round of server tests (serve_bench.load.rounds): the first test's warm-up, then one
    LoadGen test per settings, back to back; the tests as they came (``tests``), for the caller to pool."""
    if tests and tests[0].warmup_s > 0:
        warm_up(loop, sample_count, tests[0])
    return {"tests": [one_test(loop, sample_count, settings) for settings in tests]}


def steady_of(tests: list[LoadGenTest], settings: ScenarioSettings) -> SteadyP99:
    """The steady-state p99 of the server tests so far, judged by the settings' precision rule."""
    return steady_p99([t.segment for t in tests], budget_ms=settings.target_latency_ms,
                      min_tail_cycles=settings.min_tail_cycles, precision=settings.precision)


def warm_up(loop: ServingLoop, sample_count: int, settings: ScenarioSettings) -> float:
    """Poisson traffic at the target rate for ``warmup_s`` through the same loop, answers discarded; the seconds
    of warm-up that ran (0 where the rate is too slow for one query, or the warm-up failed)."""
    from serve_bench.load.open_loop import run_open_loop

    if settings.target_qps * settings.warmup_s < 1:  # a slow rate: its warm-up would hold no query
        return 0.0
    try:
        run_open_loop(loop, sample_count, settings.target_qps, settings.warmup_s, seed=settings.seed + 7919)
    except (ValueError, TimeoutError) as exc:  # the measured test that follows says what the server does
        log.warning("warm-up traffic at %g/s: %s", settings.target_qps, exc)
        return 0.0
    return settings.warmup_s


def one_test(loop: ServingLoop, sample_count: int, settings: ScenarioSettings) -> LoadGenTest:
    """One LoadGen test of ``loop``."""
    import mlperf_loadgen as lg

    def issue(samples) -> None:
        loop.submit([(s.id, s.index) for s in samples])

    def complete(tags: list) -> None:
        lg.QuerySamplesComplete([lg.QuerySampleResponse(tag, 0, 0) for tag in tags])

    test = lg.TestSettings()
    test.mode = lg.TestMode.PerformanceOnly
    test.min_duration_ms = int(settings.duration_s * 1000)
    test.max_duration_ms = int(settings.max_duration_s * 1000)
    test.min_query_count = settings.min_queries
    test.qsl_rng_seed = test.sample_index_rng_seed = test.schedule_rng_seed = settings.seed
    target_ns = int((settings.target_latency_ms or 10_000.0) * 1e6)
    if settings.scenario == "server":
        if settings.target_qps is None:
            raise ValueError("the server scenario needs target_qps (Poisson arrivals per second)")
        test.scenario = lg.TestScenario.Server
        test.server_target_qps = settings.target_qps
        test.server_target_latency_ns = target_ns
        test.server_target_latency_percentile = 0.99
    elif settings.scenario == "single-stream":
        test.scenario = lg.TestScenario.SingleStream
        test.single_stream_expected_latency_ns = int(settings.expected_latency_ms * 1e6)
        test.single_stream_target_latency_percentile = 0.99
    else:
        test.scenario = lg.TestScenario.Offline
        test.offline_expected_qps = settings.target_qps or 1000.0
    loop.done = complete
    with tempfile.TemporaryDirectory(prefix="loadgen-") as folder:
        logs = lg.LogSettings()
        logs.log_output.outdir = folder
        logs.log_output.copy_summary_to_stdout = False
        logs.enable_trace = True  # each query's scheduled time and latency: the raw data of every percentile
        sut = lg.ConstructSUT(issue, lambda: None)
        qsl = lg.ConstructQSL(sample_count, sample_count, lambda indices: None, lambda indices: None)
        loop.start()
        started = time.perf_counter()
        try:
            lg.StartTestWithLogSettings(sut, qsl, test, logs)
        finally:
            served = loop.stop()
            lg.DestroyQSL(qsl)
            lg.DestroySUT(sut)
        wall = time.perf_counter() - started
        out = Path(folder)
        results = _mllog(out / "mlperf_log_detail.txt")
        summary = (out / "mlperf_log_summary.txt").read_text(errors="replace")
        scheduled_s, latencies = _trace_latencies(out / "mlperf_log_trace.json")
    return LoadGenTest(results, summary, scheduled_s, latencies, served, wall, list(loop.errors))


def _loadgen_record(settings: ScenarioSettings, test: LoadGenTest) -> dict:
    """LoadGen's own verdict and figures of one test, as it said them."""
    results = test.results

    def ns_to_ms(key: str):
        value = results.get(key)
        return None if value is None else round(float(value) / 1e6, 6)

    reasons = [r.strip() for r in str(results.get("result_invalid_reason") or "").split(".") if r.strip()]
    said = _early_stopping(test.summary)
    return {"valid": str(results.get("result_validity", "")).upper() == "VALID", "invalid_reasons": reasons,
            "early_stopping": said, "early_stopping_ms": early_stopping_estimates(said),
            "early_stopping_met": results.get("early_stopping_met"),
            "min_queries_met": results.get("result_min_queries_met"),
            "min_duration_met": results.get("result_min_duration_met"),
            "perf_constraints_met": results.get("result_perf_constraints_met"),
            "latency_ms": {k: ns_to_ms(f"result_{q:.2f}_percentile_latency_ns") for k, q in PERCENTILE_KEYS.items()},
            "mean_ms": ns_to_ms("result_mean_latency_ns"), "max_ms": ns_to_ms("result_max_latency_ns"),
            "target_latency_ms": settings.target_latency_ms, "queries": int(len(test.latencies_ms))}


def _rate(tests: list[LoadGenTest], key: str) -> float | None:
    """A LoadGen rate: one test's as it said it; over several tests, their queries over their summed durations
    (each test's queries over its own rate)."""
    rates = [t.results.get(key) for t in tests]
    if len(tests) == 1:
        return None if rates[0] is None else round(float(rates[0]), 3)
    counts = [len(t.latencies_ms) for t in tests]
    if any(r is None or float(r) <= 0 for r in rates) or not sum(counts):
        return None
    return round(sum(counts) / sum(n / float(r) for n, r in zip(counts, rates)), 3)


def pooled_verdict(tests: list[LoadGenTest], rounds: bool = False) -> tuple[bool | None, str]:
    """Whether the queue stayed bounded over several tests of one configuration: not where any test saw it grow;
    unknown where the tests without a verdict held more queries than those with one; else bounded. In rounds
    (``rounds``), not where most rounds saw it grow: each round starts empty and is judged alone, and a stable
    M/M/1 queue at ρ 0.85 looks grown in 4-5% of 1,000-2,000-query rounds, so over 15 rounds "any" would call half
    of such runs unsustainable; a queue that does grow (ρ 1.1) looks so in 99% of 1,000-query rounds."""
    verdicts = [(bounded(*t.segment), len(t.latencies_ms)) for t in tests]
    failed = [v for v, _ in verdicts if v[0] is False]
    if failed and (not rounds or 2 * len(failed) > len(verdicts)):
        return failed[0]
    verdicts = [(v, n) for v, n in verdicts if v[0] is not False]
    unknown = [(v, n) for v, n in verdicts if v[0] is None]
    if sum(n for _, n in unknown) > sum(n for v, n in verdicts if v[0] is True):
        return unknown[0][0]
    return True, "sustainable"


def closed_loop_ci(latencies: np.ndarray, blocks: int = 20) -> list[float] | None:
    """A single-stream or offline test's p99 interval: 20 stretches of the schedule resampled (no queue forms,
    so stretches of consecutive queries are far longer than what correlates them)."""
    size = max(1, len(latencies) // blocks)
    parts = [latencies[i:i + size] for i in range(0, len(latencies), size)]
    if len(parts) > 1 and len(parts[-1]) < size:  # the short tail joins the block before it
        parts[-2] = np.concatenate([parts[-2], parts.pop()])
    if len(parts) < 2:
        return None
    return [round(v, 6) for v in block_bootstrap_ci(BlockedSamples(parts, list(range(len(parts)))), 99.0)]


def scenario_result(settings: ScenarioSettings, tests: list[LoadGenTest], steady: SteadyP99 | None = None,
                    rounds: bool = False) -> dict:
    """The report's record of one measurement (one LoadGen test, or several of one server configuration pooled):
    plain values. LoadGen's own verdict is the first test's (the one sized by the settings); the percentiles are
    of every query, or in the server scenario of the complete busy periods of every test (steady state: ``steady``,
    computed here when not given)."""
    served = ServedRecords(*(np.concatenate([getattr(t.served, f) for t in tests]) for f in
                             ("queue_ns", "compute_ns", "batch", "busy_ns")))
    completed_key = ("result_completed_samples_per_sec" if "result_completed_samples_per_sec" in tests[0].results
                     else "result_samples_per_second")
    queries = sum(len(t.latencies_ms) for t in tests)
    out = {"scenario": settings.scenario, "offered_qps": settings.target_qps if settings.scenario == "server" else None,
           "scheduled_qps": _rate(tests, "result_scheduled_samples_per_sec"),
           "completed_qps": _rate(tests, completed_key),
           "queries": int(queries), "tests": len(tests), "wall_s": round(sum(t.wall_s for t in tests), 3),
           "loadgen": _loadgen_record(settings, tests[0]),
           **served.summary(), "errors": [e for t in tests for e in t.errors][:3]}
    if settings.scenario == "server":
        steady = steady or steady_of(tests, settings)
        latencies = steady.values if steady.values is not None else np.zeros(0)
        of = OF_CYCLES
        if steady.leaves_out_too_much:  # not steady state: every query counts, the slow ones too
            latencies = np.concatenate([t.latencies_ms for t in tests])
            of = "every query (the open busy periods hold too many to leave out)"
            steady = steady.of_every_query(float(np.percentile(latencies, 99.0)))
        out["steady_state"] = {**steady.as_dict(), "warmup_s": settings.warmup_s, "max_queries": settings.max_queries,
                               "capped": not steady.precise and settings.max_queries is not None
                               and queries > settings.max_queries - MIN_QUERIES, "percentiles_of": of}
        out["sustainable"], out["sustainable_reason"] = pooled_verdict(tests, rounds)
        out["p99_ci"] = None if steady.ci is None else [round(v, 6) for v in steady.ci]
    else:
        latencies = np.concatenate([t.latencies_ms for t in tests])
        out["p99_ci"] = closed_loop_ci(latencies)
    if len(latencies):
        out["latency_ms"] = percentiles_ms(latencies)
        out["latency_ms"]["mean"] = round(float(latencies.mean()), 6)
    else:
        out["latency_ms"], out["p99_ci"] = None, None
    return out
