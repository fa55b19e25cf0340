"""The highest arrival rate whose p99 meets the budget, and the serving configuration that reaches it.

Rules of a probed rate (one LoadGen server run):
- ``point``: its p99 is within the budget and its queue stayed bounded;
- ``confident``: the upper end of the p99's steady-state interval (serve_bench.load.steady_state) is within
  the budget, the run was measured until that interval was precise (not stopped at its cap), and the
  queue stayed bounded. LoadGen's VALID verdict is not asked of a probe: its early stopping needs
  about 700 queries with none past the budget, and a sweep's probes are short (``sweep_min_queries``);
  the gate asks it of the run at the pipeline's traffic, which is not;
- ``possible``: the lower end of that interval is within the budget (the budget is not excluded).

A capacity under a rule is the highest probed rate that passes it with every lower probed rate
passing too (a pass above a failure is noise, not capacity). The capacity (under the pipeline's
rule) comes with a range from the same runs: the ``confident`` capacity below and the ``possible``
capacity above (inverting the p99 interval at each probed rate). It is not a joint 95% interval:
each end rests on separate per-rate intervals and on the probe grid, whose resolution ``bracket``
(the last passing and first failing rate under the rule) states apart.
Configurations are compared as Triton's Model Analyzer does: drop those whose p99 constraint
fails, then rank by the load they carry.
"""
from __future__ import annotations

from typing import Iterable

RULES = ("point", "confident", "possible")


def loadgen_valid_for(run: dict, budget_ms: float | None) -> bool | None:
    """LoadGen's verdict on the run, where it was judged against this budget; None where it was judged against
    another target latency (a report re-gated with another budget): its early-stopping claim was about that one."""
    loadgen = run["loadgen"]
    judged = loadgen.get("target_latency_ms")
    if budget_ms is not None and judged is not None and abs(judged - budget_ms) > 1e-9:
        return None
    return bool(loadgen["valid"])


def passes(run: dict, budget_ms: float | None, rule: str) -> bool:
    """Whether one server run meets the budget under ``rule`` (no budget: only that the queue kept up). A run in
    which the model failed never passes: its queries were answered with errors, fast."""
    if rule not in RULES:
        raise ValueError(f"rule {rule!r}: choose one of {', '.join(RULES)}")
    if not run.get("sustainable", False) or not run.get("latency_ms") or run.get("errors"):
        return False
    if budget_ms is None:
        return True
    p99, ci = run["latency_ms"]["p99"], run.get("p99_ci")
    if rule == "point":
        return p99 <= budget_ms
    trusted = ci is not None and interval_trusted(run)
    if rule == "confident":
        return trusted and ci[1] <= budget_ms
    return p99 <= budget_ms or (trusted and ci[0] <= budget_ms)  # possible: never stricter than the point


def interval_trusted(run: dict) -> bool:
    """Whether a server run's p99 interval may back a confident claim: not where the run stopped at its query cap
    before its steady-state p99 was precise (serve_bench.load.steady_state: such intervals cover the true p99
    less often than they claim). Runs without a steady-state record (older reports) are taken as they are."""
    steady = run.get("steady_state")
    return steady is None or bool(steady.get("precise"))


def within_budget(run: dict, budget_ms: float | None) -> dict:
    return {"point": passes(run, budget_ms, "point"), "confident": passes(run, budget_ms, "confident")}


def _highest(curve: list[dict], budget_ms: float | None, rule: str) -> tuple[float | None, float | None]:
    """(highest rate passing with every lower rate passing, the first rate that failed)."""
    best = None
    for run in sorted(curve, key=lambda r: r["offered_qps"]):
        if not passes(run, budget_ms, rule):
            return best, run["offered_qps"]
        best = run["offered_qps"]
    return best, None


def capacity(curve: list[dict], budget_ms: float | None, decision: str = "point") -> dict:
    """The capacity of one serving configuration from its probed rates (see the module's rules), judged against
    ``budget_ms`` (kept in the result, so a report re-gated with another budget knows to judge again)."""
    point, _ = _highest(curve, budget_ms, "point")
    low, _ = _highest(curve, budget_ms, "confident")
    high, _ = _highest(curve, budget_ms, "possible")
    rule = "confident" if decision == "confident" else "point"
    chosen, first_fail = _highest(curve, budget_ms, rule)
    status, reason = _status(curve, budget_ms, chosen)
    return {"qps": chosen, "ci": [low, high], "bracket": [chosen, first_fail], "sustainable": chosen is not None,
            "status": status, "reason": reason, "rule": rule, "budget_ms": budget_ms,
            # every probed rate passed: the capacity is at least this, the grid did not reach its end
            "censored": chosen is not None and first_fail is None}


def _status(curve: list[dict], budget_ms: float | None, chosen: float | None) -> tuple[str, str]:
    """(``ok`` | ``model_failed`` | ``not_sustainable`` | ``none_within_budget`` | ``not_confident`` |
    ``no_rate_probed``, words)."""
    if chosen is not None:
        return "ok", f"{chosen:,.1f} queries/s within {'the budget' if budget_ms else 'a bounded queue'}"
    if not curve:
        return "no_rate_probed", "no rate probed"
    lowest = min(curve, key=lambda r: r["offered_qps"])
    rate = f"{lowest['offered_qps']:,.1f}/s"
    if lowest.get("errors"):
        return "model_failed", f"the model failed while serving at {rate}: {lowest['errors'][0]}"
    if lowest.get("sustainable") is None and "sustainable" in lowest:
        return "unknown", (f"whether the queue stayed bounded is unknown even at the lowest probed rate, {rate}: "
                           f"{lowest.get('sustainable_reason')}")
    if not lowest.get("sustainable", False):
        why = str(lowest.get("sustainable_reason") or "").removeprefix("not sustainable: ")
        return "not_sustainable", f"not sustainable even at the lowest probed rate, {rate}: {why}"
    if budget_ms is not None and lowest.get("latency_ms") and lowest["latency_ms"]["p99"] > budget_ms:
        return "none_within_budget", (f"none within budget: p99 {lowest['latency_ms']['p99']:.3f} ms > "
                                      f"{budget_ms:g} ms even at the lowest probed rate, {rate}")
    upper = (lowest.get("p99_ci") or [None, None])[1]
    level = (lowest.get("steady_state") or {}).get("level", 0.95)
    said = f"its p99's {level:.0%} upper bound {upper:.3f} ms" if upper is not None else "no interval of its p99"
    return "not_confident", f"not shown within the budget even at the lowest probed rate, {rate} ({said})"


def best_config(configs: Iterable[dict]) -> dict | None:
    """Constraints first, then the objective: among configurations that carry some load within the budget,
    the one that carries the most (ties: the fewer instances, then the smaller batch)."""
    feasible = [c for c in configs if c["capacity"]["qps"] is not None]
    if not feasible:
        return None
    return max(feasible, key=lambda c: (c["capacity"]["qps"], -c["serving"]["instances"], -c["serving"]["max_batch"]))


def next_rates(curve: list[dict], budget_ms: float | None, steps: int, decision: str = "point") -> list[float]:
    """Bisection between the last passing and first failing rate under the rule the capacity is decided by,
    ``steps`` more probes at most: only where the grid left a gap; the geometric mean halves the ratio of the
    bracket each time."""
    point, fail = _highest(curve, budget_ms, "confident" if decision == "confident" else "point")
    if steps <= 0 or fail is None:
        return []
    lower = point if point is not None else fail / 4
    return [round((lower * fail) ** 0.5, 3)]


def confirmed(found: dict, run: dict, curve: list[dict], decision: str = "point") -> dict:
    """The capacity after its confirmation run: a server test at the capacity with the at-target test's length
    (warmed, measured until precise). Probes are short, so one that read low near load credits a rate the server
    cannot hold; the confirmation's p99 and interval are the figures the report states. Where it fails the rule,
    the capacity is judged again from the probes below the refuted rate (their range, bracket and status too),
    and ``reason`` says so."""
    rule = "confident" if decision == "confident" else "point"
    budget, rate = found["budget_ms"], found["qps"]
    record = {k: run.get(k) for k in ("offered_qps", "latency_ms", "p99_ci", "sustainable", "sustainable_reason",
                                      "queries", "steady_state", "errors", "loadgen")}
    if passes(run, budget, rule):
        return {**found, "confirmation": record, "confirmed": True}
    below = capacity([r for r in curve if r["offered_qps"] < rate], budget, decision)
    p99 = (run.get("latency_ms") or {}).get("p99")
    said = f"p99 {p99:.3f} ms" if p99 is not None else (run.get("sustainable_reason") or "no p99")
    fallback = (f"{below['qps']:,.1f}/s, the highest probed rate below it that passed, is stated" if below["qps"]
                else "no lower probed rate passed")
    return {**below, "bracket": [below["qps"], rate], "censored": False, "confirmation": record, "confirmed": False,
            "status": below["status"] if below["qps"] else "not_confirmed",
            "reason": f"the probe at {rate:,.1f}/s passed, but a full-length run there did not ({said}): {fallback}"}
