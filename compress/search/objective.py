"""What a trial scored: its candidate artifact, the objective values and the limits' constraints.

A trial is scored on its validation bench (split_bench): its deployable artifacts measured beside
the reference baseline on the validation split, so the test split stays unseen until the final
bench. Its candidate is the artifact its own gate would release if the baseline were not on the
list: the fastest one within the red line and the budget under the pipeline's decision rule (so
under `confident` the drop's and the p99's upper bounds, not the estimates). Speed is the p99
ratio to the baseline measured in the same bench: absolute p99s from separate benches drift with
the machine (up to 3× between runs), a ratio to a baseline measured beside it does not.

On the validation split a trial is *chosen*, not certified, so it is judged on the point estimates
(``point``) whatever the pipeline's rule: certification is the final bench's job, on the test split at
the corrected level. Judging the choice by upper bounds on the validation split, usually half the test
split's size (500 images on mnist5k, which can certify no red line under 0.76 point), would mark
nearly every trial infeasible and keep the finalists out of the final bench.

Where no artifact is within the limits, the fastest one stands for the trial, marked infeasible,
and the constraints say by how much it misses, each relative to its limit (a drop miss in points
over the red line, a p99 miss in ms over the budget), so neither unit outweighs the other: the
samplers (TPE and NSGA-II read the trial's constraints) then prefer any feasible trial over it and
learn where the line runs.
"""
from __future__ import annotations

from collections.abc import Sequence

from serve_bench.limits import Limits
from serve_bench.runners import RUNNER_OF_KIND
from compress.search.contenders import BASELINE
from compress.search.final_gate import p99_ratio
from serve_bench.gate import carried_load, evaluate
from serve_bench.report_model import Entry, Report

FASTEST, MOST_ACCURATE, MOST_TRAFFIC = ("fastest_within_red_line", "most_accurate_within_budget",
                                       "most_traffic_within_budget")
CHOOSING_RULE = "point"  # how a trial is judged on the validation split: a choice, certified later on test


def _bounded(entry: Entry, decision: str) -> tuple[float | None, float | None]:
    """(drop, p99) as the rule judges them: upper bounds under `confident`, estimates under `point`; the p99 the
    gate reads: at the pipeline's traffic under the server scenario, else closed loop."""
    run = entry.server_run()
    drop = entry.accuracy_drop
    p99 = run.latency("p99") if run is not None else entry.latency_ms.p99
    if decision == "confident":
        drop_ci = entry.accuracy_paired.drop_ci if entry.accuracy_paired is not None else None
        p99_ci = run.p99_ci if run is not None else entry.latency_ms.p99_ci_blocks
        drop = drop_ci[1] if drop_ci else drop
        p99 = p99_ci[1] if p99_ci else p99
    return drop, p99


def listed(interval: Sequence[float] | None) -> list[float] | None:
    """An interval as the search's records hold it (a JSON list, as the report had it), or None."""
    return None if interval is None else list(interval)


def constraints(limits: Limits, drop: float | None, p99_ms: float | None, meaningful: bool = True) -> list[float]:
    """[drop miss, p99 miss], each relative to its limit; ≤ 0 where the limit is met (Optuna's convention)."""
    return [round(limits.drop_miss(drop), 4) if meaningful and drop is not None else 0.0,
            round(limits.p99_miss(p99_ms), 4)]


def _on_split(reason: str, split: str) -> str:
    """The gate's words name the test split; a validation bench's reasons name the split they were judged on."""
    if split != "val":
        return reason
    return reason.replace("test set", "validation set").replace("test images", "validation images")


def _limits_of(report: Report) -> Limits:
    """The limits a split bench was keyed on and judged under (every split bench report records them)."""
    if report.limits is None:
        raise ValueError("not a split bench report: it records no limits")
    return report.limits.limits()


def outcome_of(report: Report) -> dict:
    """The trial's candidate and its figures, from its split bench report."""
    limits = _limits_of(report)
    meaningful = report.data.meaningful_accuracy
    others = [e for e in report.artifacts if e.name != report.baseline
              and (e.contender or {}).get("role") != BASELINE]  # the reference on any runtime
    if not others:
        return {"candidate": None, "feasible": False, "why": "the bench measured nothing but the baseline"}
    split = report.split or "test"
    rule = CHOOSING_RULE if split == "val" else limits.decision
    judged = evaluate(others, limits.replace(decision=rule), accuracy_meaningful=meaningful)
    chosen = next((e for e in others if e.name == judged["release"]), None)
    entry = chosen if chosen is not None else min(others, key=p99_ratio)
    lat = entry.latency_ms
    ratio = entry.latency_ratio.p99 if entry.latency_ratio is not None else None
    paired = entry.accuracy_paired
    drop_used, p99_used = _bounded(entry, rule)
    metric = limits.metric
    return {
        "candidate": entry.contender["artifact"] if entry.contender is not None else entry.name,
        # the runtime it was scored on: the final bench measures the finalist there, as its gate would ship it
        "runtime": (entry.contender or {}).get("runtime"),
        "split": split, "feasible": chosen is not None,
        "why": None if chosen is not None else _on_split(next(
            (r for r in judged["reasons"] if r.startswith(f"{entry.name}:")), judged["reasons"][0]), split),
        "decision": rule, "max_drop": limits.max_drop, "p99_budget_ms": limits.p99_budget_ms,
        "macs": entry.macs, "params": entry.params, "size_bytes": entry.size_bytes,
        "metric": metric, "accuracy": entry.accuracy.get(metric),
        "accuracy_ci": listed(entry.accuracy_ci.get(metric)),
        "drop": entry.accuracy_drop, "drop_ci": listed(paired.drop_ci if paired is not None else None),
        "p50": lat.p50, "p50_ci": listed(lat.p50_ci_blocks), "p99": lat.p99,
        "p99_ci": listed(lat.p99_ci_blocks), "p99_ratio": ratio.ratio if ratio is not None else None,
        "p99_ratio_ci": listed(ratio.ci) if ratio is not None else None,
        "constraints": constraints(limits, drop_used, p99_used, meaningful),
        "carried_qps": carried_load(entry),  # with a traffic sweep: its best serving configuration's capacity
    }


def candidate_name(outcome: dict) -> str:
    """The candidate with the runtime its figures are from: ``file@runtime`` for any runtime but onnxruntime, as a
    search's bench names its contenders (a bench stage whose ``runtimes`` lists another first names files otherwise)."""
    name, runtime = outcome.get("candidate"), outcome.get("runtime")
    if name is None:
        return "—"
    return f"{name}@{runtime}" if runtime not in (None, RUNNER_OF_KIND["onnx"]) else name


def directions(sampler: str) -> list[str]:
    """NSGA-II keeps both objectives (the front); TPE minimises the one the user asked for."""
    return ["minimize", "minimize"] if sampler == "nsga2" else ["minimize"]


def _speed(outcome: dict, objective: str = FASTEST) -> float:
    """What "faster" means for the objective: the p99 ratio to the baseline, or, for the most traffic, the load
    carried within the budget negated (so every objective is minimised; none carried counts as 0)."""
    if objective == MOST_TRAFFIC:
        return -(outcome.get("carried_qps") or 0.0)
    return outcome["p99_ratio"]


def values(outcome: dict, objective: str, sampler: str) -> list[float]:
    """The p99 ratio to the baseline and/or the accuracy drop (points), as the sampler minimises them. Where
    accuracy means nothing (synthetic data) the gate judges latency only, and so does the drop here: it counts
    as 0."""
    drop = 0.0 if outcome.get("drop") is None else outcome["drop"]
    if sampler == "nsga2":
        return [_speed(outcome, objective), drop]
    return [drop if objective == MOST_ACCURATE else _speed(outcome, objective)]


def rank_key(outcome: dict, objective: str) -> tuple:
    """Order of the feasible trials for the finalists: the objective first, the other as a tie-break."""
    drop = 0.0 if outcome.get("drop") is None else outcome["drop"]
    return (drop, _speed(outcome)) if objective == MOST_ACCURATE else (_speed(outcome, objective), drop)


def best_first(outcomes: list[tuple[int, dict]], objective: str) -> list[int]:
    """Trial numbers of the feasible outcomes, best first; of trials whose candidates are the same file (a
    setting that changed nothing), only the best."""
    out, seen = [], set()
    for number, outcome in sorted(((n, o) for n, o in outcomes if o.get("feasible")),
                                  key=lambda item: rank_key(item[1], objective)):
        digest = outcome.get("sha256")
        if digest is None or digest not in seen:
            out.append(number)
            seen.add(digest)
    return out
