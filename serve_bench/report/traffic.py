"""Latency under traffic in the report: the LoadGen run at the pipeline's target rate, the capacity of each
serving configuration the sweep tried, and the harness's own share of every latency.

Every part of ``entry["traffic"]`` and ``report["traffic"]`` is optional: what is missing reads "—" and a
table with no rows is left out. This module draws nothing (``plots.latency_load_curve`` does) and imports
nothing of the report's, so ``report_tables.sections`` can append these tables without an import cycle;
a ``Table`` here is the same shape as ``report_tables.Table``.
"""
from __future__ import annotations

Table = tuple[list[str], list[list[str]]]

TRAFFIC_TITLE = "Latency under traffic (LoadGen, latency from the scheduled send time)"
CAPACITY_TITLE = "Serving capacity: highest load within the p99 budget"
BEST_MARK = "★"


def _num(value, digits: int = 3) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _bounds(ci, digits: int = 3) -> str:
    """`` [lo, hi]`` (either end "—" when unknown), or nothing when there is no interval at all."""
    if not ci or all(v is None for v in ci):
        return ""
    return f" [{_num(ci[0], digits)}, {_num(ci[1], digits)}]"


def serving_text(serving: dict | None) -> str:
    """A serving configuration in a few words: batch cap, queue delay, instances × threads."""
    if not serving:
        return "—"
    return (f"batch ≤{serving.get('max_batch', '?')}, wait {serving.get('max_queue_delay_us', '?')} µs, "
            f"{serving.get('instances', '?')} inst × {serving.get('threads', '?')} thr")


def verdict(run: dict) -> str:
    """LoadGen's own verdict: VALID (with its early-stopping p99 estimate where it gives one), or INVALID with its
    first reason."""
    loadgen = run.get("loadgen")
    if not loadgen:
        return "—"
    estimate = (loadgen.get("early_stopping_ms") or {}).get("p99")
    if loadgen.get("valid"):
        return "VALID" + (f" (early-stopping p99 ≤ {estimate:.3f} ms)" if estimate is not None else "")
    reasons = loadgen.get("invalid_reasons") or []
    return f"INVALID: {reasons[0]}" if reasons else "INVALID"


def _sustainable(run: dict) -> str:
    if "sustainable" not in run:
        return "—"  # single-stream and offline runs: the question does not arise
    if run["sustainable"] is None:
        return run.get("sustainable_reason") or "unknown"
    if run["sustainable"]:
        return "yes"
    reason = run.get("sustainable_reason") or ""
    return reason if reason.startswith("not sustainable") else "not sustainable"


def _within(run: dict) -> str:
    within = run.get("within_budget") or {}
    point, confident = within.get("point"), within.get("confident")
    if point is None and confident is None:
        return "—"
    if confident:
        level = (run.get("steady_state") or {}).get("level")
        return f"yes ({level:.0%} interval)" if level else "yes (95% sure)"
    return "yes (point only)" if point else "no"


def steady_text(steady: dict | None) -> str:
    """How the p99 of a server run was reached: its level, queries, what was left out, and whether it is precise."""
    if not steady:
        return "—"
    said = (f"{steady['level']:.0%} CI; {steady['queries']:,} queries, {steady['discarded']:,} in open busy periods "
            f"left out; {steady['tail_cycles']} busy periods reach the p99")
    if steady.get("precise"):
        return f"precise ({said})"
    return f"NOT precise{' (stopped at the cap)' if steady.get('capped') else ''}: {steady.get('reason')} ({said})"


def _mean(part) -> float | None:
    return (part or {}).get("mean")


def traffic_table(report: dict) -> Table | None:
    """One row per LoadGen test of an artifact at a given rate (the target, then the fixed ``loads``, so rows of
    one rate compare artifacts at the same traffic); None when there is none."""
    head = ["artifact", "scenario", "serving", "offered /s", "completed /s", "p50 ms", "p99 ms [CI]", "steady state",
            "LoadGen verdict", "queue mean ms", "model mean ms", "mean batch", "within p99 budget", "sustainable"]
    rows = []
    for art, run in _runs_at_rates(report):
        lat = run.get("latency_ms") or {}
        p99 = _num(lat.get("p99")) + (_bounds(run.get("p99_ci")) if lat.get("p99") is not None else "")
        rows.append([art["name"], run.get("scenario") or "—", serving_text(run.get("serving")),
                     _num(run.get("offered_qps"), 1), _num(run.get("completed_qps"), 1), _num(lat.get("p50")), p99,
                     steady_text(run.get("steady_state")), verdict(run), _num(_mean(run.get("queue_ms"))),
                     _num(_mean(run.get("compute_ms"))),
                     _num(run.get("mean_batch"), 2), _within(run), _sustainable(run)])
    return (head, rows) if rows else None


def _runs_at_rates(report: dict) -> list[tuple[dict, dict]]:
    out = []
    for art in report.get("artifacts", []):
        traffic = art.get("traffic") or {}
        out += [(art, run) for run in [traffic.get("at_target"), *(traffic.get("loads") or [])] if run]
    return out


def capacity_text(cap: dict | None) -> str:
    """The capacity and its interval, or why there is none ("not sustainable", "none within budget"...)."""
    if not cap:
        return "—"
    if cap.get("qps") is not None:
        return _num(cap["qps"], 1) + _bounds(cap.get("ci"), 1)
    words = {"model_failed": "model failed", "not_sustainable": "not sustainable",
             "none_within_budget": "none within budget", "not_confident": "not shown within the budget",
             "unknown": "queue unknown",
             "no_rate_probed": "no rate probed", "not_confirmed": "not confirmed by a full-length run"}
    return words.get(cap.get("status"), "none within budget")


def _bracket(cap: dict | None) -> str:
    bracket = (cap or {}).get("bracket") or [None, None]
    if all(v is None for v in bracket):
        return "—"
    return f"{_num(bracket[0], 1)} / {'none failed' if bracket[1] is None else _num(bracket[1], 1)}"


def _note(cap: dict | None) -> str:
    if not cap:
        return "no capacity recorded"
    if cap.get("qps") is None:
        return cap.get("reason") or ""
    if cap.get("confirmed") is False:
        return cap.get("reason") or "not confirmed by a full-length run"
    said = []
    if cap.get("confirmed"):
        run = cap.get("confirmation") or {}
        p99 = (run.get("latency_ms") or {}).get("p99")
        said.append("confirmed by a full-length run" + (f" (p99 {p99:.3f} ms{_bounds(run.get('p99_ci'))})"
                                                         if p99 is not None else ""))
    if cap.get("censored", (cap.get("bracket") or [None, None])[1] is None):
        said.append("every probed rate passed: the capacity may be higher")
    return "; ".join(said)


def gain_text(gain: dict | None) -> str:
    if not gain or gain.get("ratio") is None:
        return ""
    over = f" over {gain['over']}" if gain.get("over") else ""
    return f"{gain['ratio']:.2f}×" + _bounds(gain.get("ci"), 2) + over


def capacity_table(report: dict) -> Table | None:
    """One row per artifact × serving configuration of the sweep, the best one marked ★, the batching gain
    (its capacity over the batch-1 configuration's) on the best row; None when nothing was swept."""
    head = ["artifact", "configuration", "serving", "offline /s", "capacity /s [sure, possible]",
            "last pass / first fail /s", "decided on", "batching gain [range]", "note"]
    rows = []
    for art in report.get("artifacts", []):
        sweep = (art.get("traffic") or {}).get("sweep")
        if not sweep:
            continue
        best_label = (sweep.get("best") or {}).get("label")
        gain, gain_placed = sweep.get("batching_gain"), False
        for config in sweep.get("configs") or []:
            cap, best = config.get("capacity"), best_label is not None and config.get("label") == best_label
            offline = ((config.get("offline") or {}).get("completed_qps"))
            gain_cell = gain_text(gain) if best else ""
            if not best and gain and config.get("label") == gain.get("over"):
                gain_cell = "1 (reference)"
            gain_placed |= best and bool(gain_cell)
            rows.append([art["name"], (config.get("label") or "—") + (f" {BEST_MARK}" if best else ""),
                         serving_text(config.get("serving")), _num(offline, 1), capacity_text(cap), _bracket(cap),
                         (cap or {}).get("rule") or "—", gain_cell, _note(cap)])
        if gain_text(gain) and not gain_placed:  # no best configuration to carry it
            rows.append([art["name"], "batching gain", "—", "—", "—", "—", "—", gain_text(gain), ""])
    return (head, rows) if rows else None


def _run_words(run: dict | None) -> str | None:
    lat = (run or {}).get("latency_ms") or {}
    if lat.get("p50") is None and lat.get("p99") is None:
        return None
    return f"p50 {_num(lat.get('p50'))} ms, p99 {_num(lat.get('p99'))} ms"


def overhead_line(report: dict) -> str | None:
    """One sentence: the null model's latencies through the same harness, i.e. the harness's own share."""
    overhead = (report.get("traffic") or {}).get("sut_overhead") or {}
    parts = []
    single = _run_words(overhead.get("single-stream"))
    if single:
        parts.append(f"{single} single-stream")
    server = overhead.get("server")
    words = _run_words(server)
    if words:
        rate = server.get("offered_qps")
        parts.append(f"{words} in the server scenario" + (f" at {rate:,.1f}/s" if rate is not None else ""))
    if not parts:
        return None
    return ("Harness overhead: the same serving loop around a model that does nothing measures "
            + "; ".join(parts) + ". That is the harness's own share of every latency above.")


def traffic_sections(report: dict) -> list[tuple[str, Table]]:
    """The traffic tables with their headings, for ``report_tables.sections``; empty when there is no traffic."""
    out = [(TRAFFIC_TITLE, traffic_table(report)), (CAPACITY_TITLE, capacity_table(report))]
    return [(title, table) for title, table in out if table]


def section_notes(report: dict) -> dict[str, str]:
    """Lines to print under a section, by its title: the harness overhead under the first traffic table."""
    line, titles = overhead_line(report), [title for title, _ in traffic_sections(report)]
    return {titles[0]: line} if line and titles else {}
