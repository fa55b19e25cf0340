"""The search's final gate: the finalists, chosen on the validation split, judged on the test split in
one bench, with the error of choosing among several corrected.

The finalists' test figures are new to the search (nothing was chosen on them before), but the gate
still picks among F finalists on them. Where every finalist's true drop sits on the red line and
each passes a 2.5% one-sided test, one of them passes with a chance of up to 1 − 0.975^F (7.3% for
3). So under the `confident` rule each finalist's drop and p99 bounds are taken at the Bonferroni
level: two-sided 1 − 0.05/F (one-sided 0.025/F each), which keeps the chance that the released
artifact is past a limit at 2.5% or less, whatever F. The `point` rule has no error rate to
correct (it passes an artifact on the red line about half the time, the more finalists the more
often); the report says so. The hand-set result is judged alone at the usual level: nothing was
chosen for it.

Among the finalists that pass, the released one has the smallest p99 ratio to the baseline
measured in the same bench, the figure that survives the machine's drift.
"""
from __future__ import annotations

from dataclasses import dataclass

from serve_bench.limits import Limits
from serve_bench.gate import carried_load, evaluate
from serve_bench.report_model import Entry
from serve_bench.stats.latency_intervals import BlockedSamples, block_bootstrap_ci
from serve_bench.load.steady_state import LEVEL as STEADY_LEVEL
from serve_bench.load.steady_state import upper_at
from serve_bench.stats.paired import LEVEL, PairedCounts, drop_interval

BONFERRONI, NO_CORRECTION = "bonferroni", "none"


@dataclass(frozen=True)
class Correction:
    """How the final gate corrects for choosing among ``finalists`` on the test split."""

    method: str  # bonferroni | none
    finalists: int
    level: float  # two-sided level of each finalist's intervals

    def words(self) -> str:
        if self.method == BONFERRONI:
            return (f"Bonferroni over {self.finalists} finalists: each finalist's drop and closed-loop p99 bounds at "
                    f"{100 * self.level:.2f}% (one-sided {100 * (1 - self.level) / 2:.3f}% each), so the chance that "
                    f"the released one is past a limit stays at {100 * (1 - LEVEL) / 2:.1f}% or less; a p99 at the "
                    f"pipeline's traffic at {100 * (1 - (1 - STEADY_LEVEL) / self.finalists):.2f}% (its steady-state "
                    "interval's own level, corrected the same way)")
        if self.finalists <= 1:
            return "none needed: one finalist, judged at the usual 95% level"
        return (f"none: the `point` rule compares estimates, with no error rate to correct; an artifact on the red "
                f"line passes it about half the time, and choosing among {self.finalists} finalists passes one more "
                "often (use gate.decision: confident for a stated error rate)")

    def as_dict(self) -> dict:
        return {"method": self.method, "finalists": self.finalists, "level": round(self.level, 6),
                "words": self.words()}


def correction_for(finalists: int, decision: str) -> Correction:
    if decision == "confident" and finalists > 1:
        return Correction(BONFERRONI, finalists, 1 - (1 - LEVEL) / finalists)
    return Correction(NO_CORRECTION, finalists, LEVEL)


def p99_ratio(entry: Entry) -> float:
    """The entry's p99 over the baseline's in the same bench (its own p99 where it is the baseline)."""
    return entry.latency_ratio.p99.ratio if entry.latency_ratio is not None else 1.0


def _objective_key(entry: Entry, objective: str) -> tuple[float, float]:
    drop = 0.0 if entry.accuracy_drop is None else entry.accuracy_drop
    if objective == "most_traffic_within_budget":
        return -(carried_load(entry) or 0.0), drop
    return (drop, p99_ratio(entry)) if objective == "most_accurate_within_budget" else (p99_ratio(entry), drop)


def _counts(entry: Entry) -> PairedCounts | None:
    """The entry's per-image agreement with the baseline, where it was paired."""
    paired = entry.accuracy_paired
    if paired is None or paired.n is None or paired.baseline_only is None or paired.artifact_only is None:
        return None
    return PairedCounts(paired.n, paired.baseline_only, paired.artifact_only)


def _corrected_problems(entry: Entry, limits: Limits, correction: Correction, meaningful: bool,
                        blocked: BlockedSamples | None) -> list[str]:
    problems = []
    counts = _counts(entry)
    if meaningful and counts is not None:
        upper = drop_interval(counts, correction.level)[1]
        if upper > limits.max_drop:
            problems.append(f"accuracy drop {entry.accuracy_drop:.2f} points, {100 * correction.level:.2f}% "
                            f"upper bound {upper:.2f} ({correction.method} over {correction.finalists} finalists) > "
                            f"red line {limits.max_drop:g}")
    run = entry.server_run()
    if limits.p99_budget_ms is not None and run is not None and run.steady_state is not None:
        # the p99 at the pipeline's traffic: its interval is at the steady-state level (99%), corrected the same way
        level = 1 - (1 - STEADY_LEVEL) / correction.finalists
        # upper_at reads the record as written (its tail and standard error are facts the model keeps untyped)
        upper = upper_at(run.steady_state.model_dump(exclude_unset=True), correction.finalists)
        if upper is None or upper > limits.p99_budget_ms:
            said = "unknown" if upper is None else f"{upper:.3f} ms"
            problems.append(f"p99 at {run.offered_qps:,.1f}/s: {100 * level:.2f}% upper bound {said} "
                            f"({correction.method} over {correction.finalists} finalists) > budget "
                            f"{limits.p99_budget_ms:g} ms")
    elif limits.p99_budget_ms is not None and blocked is not None and run is None:
        upper = block_bootstrap_ci(blocked, 99.0, level=correction.level)[1]
        if upper > limits.p99_budget_ms:
            problems.append(f"p99 {100 * correction.level:.2f}% upper bound {upper:.3f} ms ({correction.method} over "
                            f"{correction.finalists} finalists) > budget {limits.p99_budget_ms:g} ms")
    return problems


def judge_finalists(finalists: list[Entry], limits: Limits, meaningful: bool = True,
                    blocked: dict[str, BlockedSamples] | None = None, objective: str = "fastest_within_red_line") -> dict:
    """The gate over the finalists' test-split entries (measured in one bench against the baseline).

    Each is judged by the release gate's rule and, under `confident` with several finalists, at the
    corrected level; the released one is the best passing finalist by the search's objective: the smallest
    p99 ratio to the baseline (``fastest_within_red_line``) or the smallest drop
    (``most_accurate_within_budget``), the other figure breaking ties.
    """
    correction = correction_for(len(finalists), limits.decision)
    passing, reasons, notes, verdicts = [], [], [], {}
    for entry in finalists:
        verdict = evaluate([entry], limits, accuracy_meaningful=meaningful)
        problems = [r.split(": ", 1)[1] for r in verdict["reasons"] if r.startswith(f"{entry.name}: ")]
        if verdict["passed"] and correction.method == BONFERRONI:
            problems += _corrected_problems(entry, limits, correction, meaningful, (blocked or {}).get(entry.name))
        notes += [n for n in verdict["notes"] if n not in notes]
        run = entry.server_run()
        if correction.method == BONFERRONI and run is not None and run.steady_state is None:
            note = ("the p99 at the pipeline's traffic (server scenario) is judged at 95%, not at the corrected "
                    "level: this report predates the steady-state record a corrected interval is read from")
            notes += [note] if note not in notes else []
        verdicts[entry.name] = {"passed": not problems, "problems": problems}
        if problems:
            reasons.append(f"{entry.name}: " + "; ".join(problems))
        else:
            passing.append(entry)
    if objective == "most_traffic_within_budget" and any(carried_load(e) is None for e in passing):
        objective = "fastest_within_red_line"  # a finalist never swept (or swept to no load) has no load to rank by
        notes.append("most_traffic_within_budget: not every passing finalist has a highest load within the budget "
                     "(under latency.measured_at served, a sweep through its server), so the finalists are ranked "
                     "by their p99 ratio to the baseline instead")
    release = min(passing, key=lambda e: _objective_key(e, objective)).name if passing else None
    if release is None:
        reasons.insert(0, "no finalist meets the limits" + (" at the corrected level" if correction.method ==
                                                            BONFERRONI else ""))
    return {"passed": release is not None, "release": release, "reasons": reasons, "notes": notes,
            "decision": limits.decision, "correction": correction.as_dict(), "finalists": verdicts,
            "ranked_on": RANKED_ON.get(objective, RANKED_ON["fastest_within_red_line"])}


RANKED_ON = {"most_accurate_within_budget":
             "accuracy drop, then the p99 ratio to the baseline measured in the same bench",
             "most_traffic_within_budget": "the highest Poisson load within the p99 budget (its best serving "
                                           "configuration, swept in the same bench), then the accuracy drop",
             "fastest_within_red_line": "p99 ratio to the baseline measured in the same bench"}
