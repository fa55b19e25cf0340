"""The sections of one measured entry of a report: closed-loop latency and its intervals, latency ratios, the
accuracy paired with the baseline, runtime parity, and the candidate under traffic (LoadGen runs, steady state,
the serving sweep and its capacities).

Kept apart from the report itself (``serve_bench.report_model``), which assembles these into an entry, adds the
gate, the data and the machine, and reads and checks whole files. Every section allows facts it does not name
(``_Open``), so a runtime can add one without a schema bump.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from serve_bench.limits import Limits

Interval = tuple[float, float]
Decision = Literal["point", "confident"]


class _Open(BaseModel):
    """A section whose named fields are typed and whose other facts are kept as written."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    def written(self) -> dict:
        """The section as the dict it was written as, for the measuring code below this floor that reads dicts."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


class LimitsModel(BaseModel):
    """The pipeline file's limits the gate judged under (``serve_bench.limits.Limits``)."""

    model_config = ConfigDict(extra="forbid")
    metric: str
    max_drop: float
    p99_budget_ms: float | None
    decision: Decision

    def limits(self) -> Limits:
        return Limits(**self.model_dump())


class LatencyFigures(_Open):
    """Closed-loop service time of one candidate (ms), with its intervals."""

    p50: float
    p99: float
    n: int = Field(description="timed requests")
    p90: float | None = None
    p95: float | None = None
    p99_9: float | None = Field(None, alias="p99.9")
    mean: float | None = None
    std: float | None = None
    min: float | None = None
    max: float | None = None
    blocks: int | None = None
    p50_ci: Interval | None = None
    p99_ci: Interval | None = None
    p50_ci_blocks: Interval | None = None
    p99_ci_blocks: Interval | None = None
    short_of_floors: bool = Field(False, description="the bench's max_iters cap ended this file's measurement "
                                                     "before it met min_iters and min_duration_s (flagged)")


class Ratio(_Open):
    """One percentile of a candidate over another's, from the rounds both were measured in (below 1: faster)."""

    ratio: float
    ci: Interval
    verdict: str
    rounds: int | None = None
    method: str | None = None


class RatioPair(_Open):
    """p50 and p99 ratios of one candidate over a reference (the baseline, the fp32 file, another runtime)."""

    p50: Ratio
    p99: Ratio
    reference: str | None = Field(None, description="the candidate divided by, where it is not the baseline")


class Paired(_Open):
    """The accuracy drop of a candidate against the baseline, image by image (or by bootstrap for mAP)."""

    reference: bool = Field(False, description="this is the baseline itself")
    unpaired: str | None = Field(None, description="why it could not be paired (then there is no drop)")
    n: int | None = None
    drop: float | None = None
    drop_ci: Interval | None = None
    baseline_only: int | None = Field(None, description="images only the baseline got right")
    artifact_only: int | None = Field(None, description="images only this candidate got right")
    discordant: int | None = None
    method: str | None = None
    sd: float | None = Field(None, description="a bootstrap's spread of the drop (mAP)")
    draws: int | None = Field(None, description="a bootstrap's resamples that gave a drop (mAP)")
    draws_undefined: int | None = Field(None, description="resamples with no drop (a class absent from them)")
    level: float | None = None
    mcnemar_p: float | None = None
    max_drop: float | None = Field(None, description="the red line the drop was judged against (points)")
    non_inferior: bool | None = Field(None, description="the drop's upper bound is within the red line")
    needed_test_images: int | None = Field(None, description="where it is not: the test images that would tell, "
                                                             "at this drop, with the stated power")
    needed_test_images_power: float | None = None


class RuntimeParity(_Open):
    """The same file on another runtime, paired with this one: answers that differ and relative speed."""

    reference: str
    n: int
    top1_differs: int
    top1_differs_pct: float
    top1_differs_ci: Interval
    max_abs_logit_diff: float | None = None
    max_abs_logit_diff_relative: float
    accuracy_vs_reference: Paired
    latency_ratio: RatioPair | None = None


class Serving(_Open):
    max_batch: int = 1
    max_queue_delay_us: int = 0
    instances: int = 1
    threads: int | None = None

    def knobs(self) -> dict[str, Any]:
        """The four settings a serving configuration is: two runs with equal knobs served alike."""
        return {k: getattr(self, k) for k in ("max_batch", "max_queue_delay_us", "instances", "threads")}


class SteadyState(_Open):
    """The regenerative p99 of a server run (serve_bench.load.steady_state)."""

    point: float | None = None
    ci: Interval | None = None
    queries: int | None = None
    discarded: int | None = None
    cycles: int | None = None
    tail_cycles: int | None = None
    precise: bool = False
    capped: bool = False
    reason: str | None = None
    level: float | None = None
    upper_among: dict[str, float | None] | None = None
    method: str | None = Field(None, description="how the interval was made (complete busy periods as units)")
    percentiles_of: str | None = Field(None, description="which queries the percentile is of")
    se: float | None = Field(None, description="the standard error of the share of queries above the point "
                                                "(a share, no unit)")
    tail: list[float] | None = Field(None, description="the slowest latencies (ms) the p99 and its interval rest on")
    warmup_s: float | None = Field(None, description="seconds discarded at the start")
    max_queries: int | None = Field(None, description="the most queries the run could issue")
    rounds: int | None = Field(None, description="tests pooled, each started from an empty system")
    se_within: float | None = Field(None, description="the part of se from the busy periods' variance")
    se_between: float | None = Field(None, description="the part of se from the differences between rounds, "
                                                        "widened for their few degrees of freedom (√(se² − se_within²))")
    round_p99: Interval | None = Field(None, description="the lowest and highest p99 of the rounds on their own")
    rounds_differ_p: float | None = Field(None, description="a permutation test that the rounds are alike: below "
                                                            "0.01 the machine drifted between them")
    stopped: str | None = Field(None, description="why the rounds stopped: precise, not sustainable, capped")


class LoadGenVerdict(_Open):
    valid: bool | None = None
    invalid_reasons: list[str] = Field(default_factory=list)
    early_stopping: list[str] = Field(default_factory=list)
    target_latency_ms: float | None = None
    early_stopping_ms: dict[str, float | None] | None = Field(None, description="LoadGen's early-stopping "
                                                                               "percentile estimates, {'p99': ms}")
    early_stopping_met: bool | None = None
    min_queries_met: bool | None = None
    min_duration_met: bool | None = None
    perf_constraints_met: bool | None = Field(None, description="server: LoadGen's latency constraint met")
    queries: int | None = Field(None, description="queries LoadGen issued")
    latency_ms: dict[str, float | None] | None = Field(None, description="LoadGen's own percentiles (ms)")
    mean_ms: float | None = None
    max_ms: float | None = None


class ServerRun(_Open):
    """One LoadGen run at one arrival rate (or single-stream), as the serving loop measured it."""

    scenario: str | None = None
    offered_qps: float | None = None
    scheduled_qps: float | None = Field(None, description="the rate LoadGen's schedule actually held")
    completed_qps: float | None = None
    tests: int | None = Field(None, description="LoadGen tests this figure took")
    wall_s: float | None = None
    service_ms: dict[str, float | None] | None = Field(None, description="the server's time per batch (the model "
                                                                         "and handing its answers back): mean, p50, "
                                                                         "p99, mean_square (the queue's known answer)")
    queries: int | None = None
    sustainable: bool | None = None
    sustainable_reason: str | None = None
    errors: list[str] = Field(default_factory=list)
    latency_ms: dict[str, float | None] | None = Field(None, description="None where the model could not keep up")
    p99_ci: Interval | None = None
    serving: Serving | None = None
    loadgen: LoadGenVerdict | None = None
    steady_state: SteadyState | None = None
    mean_batch: float | None = None

    def latency(self, key: str) -> float | None:
        """A percentile of this run's latency (ms), None where the run has none (it could not keep up)."""
        return (self.latency_ms or {}).get(key)
    queue_ms: dict[str, float | None] | None = Field(None, description="time in the queue: mean, p50, p99")
    compute_ms: dict[str, float | None] | None = Field(None, description="time in the model: mean, p50, p99")
    within_budget: dict[str, bool | None] | None = Field(None, description="within the p99 budget by each rule: "
                                                                           "point, confident")
    paired: dict[str, "TrafficRatio"] | None = Field(None, description="this run's steady-state p99 over another "
                                                                       "file's at the same rate, paired round by "
                                                                       "round, by role: baseline, fp32")


class TrafficRatio(Ratio):
    """A p99 ratio under traffic: the two files' rounds of the same index paired (serve_bench.load.rounds)."""

    reference: str
    level: float | None = Field(None, description="the interval's two-sided level (99%: a claim on it is about 95%)")


ServerRun.model_rebuild()


class Capacity(_Open):
    """The most traffic a serving configuration carried within the budget, by one rule."""

    qps: float | None = None
    budget_ms: float | None = None
    rule: str = "point"
    confirmed: bool | None = None
    confirmation: ServerRun | None = None
    ci: tuple[float | None, float | None] | None = Field(None, description="[sure, possible]: either end unknown")
    bracket: tuple[float | None, float | None] | None = Field(None, description="[last pass, first fail]")
    status: str | None = None
    reason: str | None = None
    censored: bool | None = Field(None, description="every probed rate passed: the capacity may be higher")
    sustainable: bool | None = Field(None, description="some probed rate passed the budget by this rule")


class SweepConfig(_Open):
    label: str | None = None
    serving: Serving | None = None
    curve: list[ServerRun] = Field(default_factory=list)
    capacity: Capacity | None = None
    offline: ServerRun | None = None
    max_queue: int | None = Field(None, description="the server's queue limit (a configuration swept through its "
                                                    "model server)")
    failed: str | None = Field(None, description="why this configuration's server stopped (served sweep)")


class Sweep(_Open):
    configs: list[SweepConfig] = Field(default_factory=list)
    best: SweepConfig | None = None
    batching_gain: dict[str, Any] | None = Field(None, description="the best batching configuration's capacity "
                                                                   "over batch 1's: ratio, ci, over, config")


class ServedSplit(_Open):
    """Where a served query's time went, per request (ms): the server's own statistics against the client's view."""

    success: int | None = Field(None, description="requests the server answered (its own count)")
    failed: int | None = None
    refused: int | None = Field(None, description="queries the server refused past its queue limit (HTTP 503)")
    refused_share: float | None = None
    batches: int | None = None
    mean_batch: float | None = Field(None, description="the server's batcher: requests over batches")
    queue_mean_ms: float | None = Field(None, description="the server's queue (its batcher), mean per request")
    compute_mean_ms: float | None = Field(None, description="the model in the server, mean per request")
    client_mean_ms: float | None = Field(None, description="what the client saw, mean per query (LoadGen's)")
    rest_mean_ms: float | None = Field(None, description="the client's mean less the server's queue and model: HTTP, "
                                                         "the server's proxy, the hops between processes")
    client_wait_ms: dict[str, float | None] | None = Field(None, description="a query's wait for a free client "
                                                                             "thread (near 0 unless the client lags)")
    round_trip_ms: dict[str, float | None] | None = Field(None, description="a request's HTTP round trip")


class Served(_Open):
    """The file measured through the model server it ships on, at the pipeline's rate, in rounds alternating with
    itself in process at the same arrivals; ``run.paired.in_process`` is what the server multiplies the p99 by."""

    server: str | None = None
    settings: dict[str, Any] | None = Field(None, description="the server's settings: batcher, copies, threads, "
                                                              "queue limit")
    run: ServerRun | None = Field(None, description="the served run, as the client saw it")
    in_process: ServerRun | None = Field(None, description="the same file in process in the same rounds")
    split: ServedSplit | None = None
    sweep: Sweep | None = Field(None, description="the serving sweep run on the server's own batcher (one server per "
                                                  "configuration): the load the server sustains within the budget")
    failed: str | None = Field(None, description="why it was not served, or why its served measurement stopped")
    machine_load: dict[str, Any] | None = Field(None, description="other processes' share of the CPU during the "
                                                                  "served rounds (the server's own processes are "
                                                                  "the file's)")


class EntryTraffic(_Open):
    """A candidate under traffic: the run at the pipeline's rate, the load curve and the serving sweep."""

    scenario: str | None = None
    target_qps: float | None = None
    at_target: ServerRun | None = None
    loads: list[ServerRun] | None = None
    sweep: Sweep | None = None
    served: Served | None = None
    measured_at: str | None = Field(None, description="served: the gate reads the served run (latency.measured_at), "
                                                      "not the at-target run in process")
    machine_load: dict[str, Any] | None = Field(None, description="other processes' share of the CPU during these "
                                                                  "tests")

    def gated_sweep(self) -> Sweep | None:
        """The sweep whose capacities the gate ranks and checks this file by: the one through its model server
        where the gate reads the served run (``measured_at: served``; None where it was not swept there), else
        the one in process."""
        if self.measured_at == "served":
            return self.served.sweep if self.served is not None else None
        return self.sweep
