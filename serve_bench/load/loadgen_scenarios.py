"""MLPerf LoadGen driving the serving loop: single-stream, server and offline, as LoadGen names them.

LoadGen (``mlcommons-loadgen``, imported as ``mlperf_loadgen``) owns the traffic: in the server
scenario it draws Poisson arrival times from its own seeded schedule and counts each query's
latency from its *scheduled* send time, so a model that stalls makes the queries scheduled
behind it late, as real users would be (a closed-loop client would simply wait and send fewer).
This module is the system under test (SUT) LoadGen calls: it hands queries to a
:class:`ServingLoop` and reports completions. It runs inside the artifact's worker process.

What comes back is LoadGen's own: its percentiles, its early-stopping verdict and its validity
("too few queries to claim a p99" is LoadGen saying the run is INVALID, kept as it said it),
plus each query's latency from LoadGen's trace, in schedule order, from which the p99 and its
block-bootstrap interval are computed (consecutive stretches of the schedule as blocks: latencies
under a queue are correlated in time, so single queries are not independent draws).
"""
from __future__ import annotations

import json
import logging
import re
import tempfile
import time
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from serve_bench.latency_intervals import BlockedSamples, block_bootstrap_ci
from serve_bench.load.serving_loop import ServedRecords, ServingLoop

log = logging.getLogger(__name__)

Scenario = Literal["single-stream", "server", "offline"]
PERCENTILE_KEYS = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p999": 99.9}
BLOCKS = 20  # stretches of the schedule the p99's interval resamples
GROWTH = 2.0  # a queue that grows: the last quarter's median latency over the first quarter's (see keeps_up)


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


def _schedule_blocks(latencies: np.ndarray) -> BlockedSamples:
    size = max(1, len(latencies) // BLOCKS)
    blocks = [latencies[i:i + size] for i in range(0, len(latencies), size)]
    if len(blocks) > 1 and len(blocks[-1]) < size:  # the short tail joins the block before it
        tail = blocks.pop()
        blocks[-1] = np.concatenate([blocks[-1], tail])
    return BlockedSamples(blocks, list(range(len(blocks))))


def keeps_up(schedule_s: np.ndarray, latencies_ms: np.ndarray) -> tuple[bool, str]:
    """Whether the queue stayed bounded, from each query's scheduled time and latency (LoadGen's trace).

    Two signs of a queue that grows without bound: latency climbs through the schedule (the median of
    its last quarter over twice its first quarter's, and by more than 1 ms), or when the last query is
    scheduled far more queries are still in the system than Little's law allows a stable queue
    (arrival rate × the mean latency of the schedule's first half, ×3, and at least 20). LoadGen's own
    completed-per-second rate is not used: it divides by the time the *last* query finished, so one
    slow final query reads as a server that did not keep up.
    """
    n = len(latencies_ms)
    quarter = n // 4
    if quarter >= 25:
        early, late = np.median(latencies_ms[:quarter]), np.median(latencies_ms[-quarter:])
        if late > GROWTH * early and late - early > 1.0:
            return False, (f"not sustainable: median latency climbed from {early:.3f} ms in the first quarter of "
                           f"the schedule to {late:.3f} ms in the last (the queue grows without bound)")
    if n >= 50 and schedule_s[-1] > schedule_s[0]:
        end = schedule_s[-1]
        waiting = int(np.sum(schedule_s + latencies_ms / 1e3 > end))
        rate = (n - 1) / (end - schedule_s[0])
        stable = 3 * rate * float(np.mean(latencies_ms[: n // 2])) / 1e3
        if waiting > max(20.0, stable):
            return False, (f"not sustainable: {waiting} queries were still in the system when the last one was "
                           f"scheduled, where a stable queue holds about {stable / 3:.1f} (the queue grows "
                           "without bound)")
    return True, "sustainable"


def run_scenario(loop: ServingLoop, sample_count: int, settings: ScenarioSettings, keep_raw: bool = False) -> dict:
    """One LoadGen test of ``loop`` (its pool holds ``sample_count`` inputs); LoadGen's figures and the SUT's.
    ``keep_raw`` adds every query's scheduled time and latency (``schedule_s``, ``latencies_ms``: arrays, not for
    the report), in schedule order."""
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
    result = scenario_result(settings, results, summary, scheduled_s, latencies, served, wall, loop.errors)
    if keep_raw:
        result["schedule_s"], result["latencies_ms"] = scheduled_s, latencies
    return result


def scenario_result(settings: ScenarioSettings, results: dict, summary: str, schedule_s: np.ndarray,
                    latencies: np.ndarray, served: ServedRecords, wall_s: float, errors: list[str]) -> dict:
    """The report's record of one LoadGen test (plain values)."""
    def ns_to_ms(key: str):
        value = results.get(key)
        return None if value is None else round(float(value) / 1e6, 6)

    scheduled = results.get("result_scheduled_samples_per_sec")
    completed = results.get("result_completed_samples_per_sec", results.get("result_samples_per_second"))
    valid = str(results.get("result_validity", "")).upper() == "VALID"
    reasons = [r.strip() for r in str(results.get("result_invalid_reason") or "").split(".") if r.strip()]
    out = {"scenario": settings.scenario, "offered_qps": settings.target_qps if settings.scenario == "server" else None,
           "scheduled_qps": None if scheduled is None else round(float(scheduled), 3),
           "completed_qps": None if completed is None else round(float(completed), 3),
           "queries": int(len(latencies)), "wall_s": round(wall_s, 3),
           "loadgen": {"valid": valid, "invalid_reasons": reasons, "early_stopping": _early_stopping(summary),
                       "early_stopping_ms": early_stopping_estimates(_early_stopping(summary)),
                       "early_stopping_met": results.get("early_stopping_met"),
                       "min_queries_met": results.get("result_min_queries_met"),
                       "min_duration_met": results.get("result_min_duration_met"),
                       "perf_constraints_met": results.get("result_perf_constraints_met"),
                       "latency_ms": {k: ns_to_ms(f"result_{q:.2f}_percentile_latency_ns")
                                      for k, q in PERCENTILE_KEYS.items()},
                       "mean_ms": ns_to_ms("result_mean_latency_ns"), "max_ms": ns_to_ms("result_max_latency_ns"),
                       "target_latency_ms": settings.target_latency_ms},
           **served.summary(), "errors": errors[:3]}
    if len(latencies):
        out["latency_ms"] = {k: round(float(np.percentile(latencies, q)), 6) for k, q in PERCENTILE_KEYS.items()}
        out["latency_ms"]["mean"] = round(float(latencies.mean()), 6)
        blocked = _schedule_blocks(latencies)
        out["p99_ci"] = [round(v, 6) for v in block_bootstrap_ci(blocked, 99.0)] if len(blocked.blocks) > 1 else None
    else:
        out["latency_ms"], out["p99_ci"] = None, None
    if settings.scenario == "server":
        out["sustainable"], out["sustainable_reason"] = keeps_up(schedule_s, latencies)
    return out
