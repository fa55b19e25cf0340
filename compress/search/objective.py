"""What a trial scored: its candidate artifact, the objective values and the red-line constraints.

A trial's candidate is the artifact its own bench would release if the fp32 baseline were not
on the list: the fastest one within the red line and the budget under the pipeline's decision
rule (so under `confident` the drop's and the p99's upper bounds, not the estimates). Where
none is within, the fastest one stands for the trial, marked infeasible, and the constraints
say by how much it misses: the samplers (TPE and NSGA-II read the trial's constraints) then prefer
any feasible trial over it and learn where the line runs.
"""
from __future__ import annotations

from serve_bench.gate import evaluate

FASTEST, MOST_ACCURATE = "fastest_within_red_line", "most_accurate_within_budget"


def _bounded(entry: dict, decision: str) -> tuple[float | None, float | None]:
    """(drop, p99) as the rule judges them: upper bounds under `confident`, estimates under `point`."""
    drop, p99 = entry.get("accuracy_drop"), (entry.get("latency_ms") or {}).get("p99")
    if decision == "confident":
        drop_ci = (entry.get("accuracy_paired") or {}).get("drop_ci")
        p99_ci = (entry.get("latency_ms") or {}).get("p99_ci_blocks")
        drop = drop_ci[1] if drop_ci else drop
        p99 = p99_ci[1] if p99_ci else p99
    return drop, p99


def outcome_of(report: dict) -> dict:
    """The trial's candidate and its figures, from its bench report."""
    gate = report["gate"]
    decision = gate.get("decision", "point")
    meaningful = (report.get("data") or {}).get("meaningful_accuracy", True)
    others = [e for e in report["artifacts"] if e["name"] != report["baseline"]]
    if not others:
        return {"candidate": None, "feasible": False, "why": "the bench measured nothing but the baseline"}
    judged = evaluate(others, gate["p99_budget_ms"], gate["max_accuracy_drop"], accuracy_meaningful=meaningful,
                      decision=decision)
    name = judged["release"] or min(others, key=lambda e: e["latency_ms"]["p99"])["name"]
    entry = next(e for e in others if e["name"] == name)
    lat = entry["latency_ms"]
    drop_used, p99_used = _bounded(entry, decision)
    budget = gate["p99_budget_ms"]
    return {
        "candidate": name, "feasible": judged["release"] is not None,
        "why": None if judged["release"] else next((r for r in judged["reasons"] if r.startswith(f"{name}:")),
                                                   judged["reasons"][0]),
        "decision": decision, "max_drop": gate["max_accuracy_drop"], "p99_budget_ms": budget,
        "macs": entry.get("macs"), "params": entry.get("params"), "size_bytes": entry.get("size_bytes"),
        "metric": report.get("metric", "top1"),
        "accuracy": (entry.get("accuracy") or {}).get(report.get("metric", "top1")),
        "accuracy_ci": (entry.get("accuracy_ci") or {}).get(report.get("metric", "top1")),
        "drop": entry.get("accuracy_drop"), "drop_ci": (entry.get("accuracy_paired") or {}).get("drop_ci"),
        "p50": lat.get("p50"), "p50_ci": lat.get("p50_ci_blocks"), "p99": lat.get("p99"),
        "p99_ci": lat.get("p99_ci_blocks"),
        # ≤ 0 where the rule is met: Optuna's convention for constraints
        "constraints": [round(drop_used - gate["max_accuracy_drop"], 4) if meaningful and drop_used is not None
                        else 0.0,
                        round(p99_used - budget, 4) if budget is not None and p99_used is not None else 0.0],
    }


def directions(sampler: str) -> list[str]:
    """NSGA-II keeps both objectives (the front); TPE minimises the one the user asked for."""
    return ["minimize", "minimize"] if sampler == "nsga2" else ["minimize"]


def values(outcome: dict, objective: str, sampler: str) -> list[float]:
    """p99 (ms) and/or the accuracy drop (points), as the sampler minimises them. Where accuracy means nothing
    (synthetic data) the gate judges latency only, and so does the drop here: it counts as 0."""
    drop = 0.0 if outcome.get("drop") is None else outcome["drop"]
    if sampler == "nsga2":
        return [outcome["p99"], drop]
    return [outcome["p99"] if objective == FASTEST else drop]


def rank_key(outcome: dict, objective: str) -> tuple:
    """Order of the feasible trials for the finalists: the objective first, the other as a tie-break."""
    drop = 0.0 if outcome.get("drop") is None else outcome["drop"]
    return (outcome["p99"], drop) if objective == FASTEST else (drop, outcome["p99"])
