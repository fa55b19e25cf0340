"""Latency under traffic in the report: the LoadGen run at the pipeline's target rate, the capacity of each
serving configuration the sweep tried, and the harness's own share of every latency.

Every part of ``Entry.traffic`` and ``Report.traffic`` is optional: what is missing reads "—" and a
table with no rows is left out. This module draws nothing (``plots.latency_load_curve`` does) and imports
only the report's model, so ``report_tables.sections`` can append these tables without an import cycle;
a ``Table`` here is the same shape as ``report_tables.Table``.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from serve_bench.load.steady_state import DRIFT_P
from serve_bench.report_model import Capacity, Entry, Report, Serving, ServerRun, SteadyState

Table = tuple[list[str], list[list[str]]]

TRAFFIC_TITLE = "Latency under traffic (LoadGen, latency from the scheduled send time)"
CAPACITY_TITLE = "Serving capacity: highest load within the p99 budget"
SERVED_TITLE = "Through the model server: served against in process, the same rounds"
BEST_MARK = "★"


def _num(value, digits: int = 3) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _bounds(ci, digits: int = 3) -> str:
    """`` [lo, hi]`` (either end "—" when unknown), or nothing when there is no interval at all."""
    if not ci or all(v is None for v in ci):
        return ""
    return f" [{_num(ci[0], digits)}, {_num(ci[1], digits)}]"


def given(model: BaseModel | None, field: str, default: Any = None) -> Any:
    """``field`` where the report gave it, or ``default`` where it did not: a model's default is no measured fact
    (a serving setting not recorded reads "?", not the default's value)."""
    return getattr(model, field) if model is not None and field in model.model_fields_set else default


def serving_text(serving: Serving | None) -> str:
    """A serving configuration in a few words: batch cap, queue delay, instances × threads."""
    if serving is None:
        return "—"
    return (f"batch ≤{given(serving, 'max_batch', '?')}, wait {given(serving, 'max_queue_delay_us', '?')} µs, "
            f"{given(serving, 'instances', '?')} inst × {given(serving, 'threads', '?')} thr")


def verdict(run: ServerRun) -> str:
    """LoadGen's own verdict: VALID (with its early-stopping p99 estimate where it gives one), or INVALID with its
    first reason."""
    loadgen = run.loadgen
    if loadgen is None:
        return "—"
    estimate = (loadgen.early_stopping_ms or {}).get("p99")
    if loadgen.valid:
        return "VALID" + (f" (early-stopping p99 ≤ {estimate:.3f} ms)" if estimate is not None else "")
    reasons = loadgen.invalid_reasons
    return f"INVALID: {reasons[0]}" if reasons else "INVALID"


def _sustainable(run: ServerRun) -> str:
    if "sustainable" not in run.model_fields_set:
        return "—"  # single-stream and offline runs: the question does not arise
    if run.sustainable is None:
        return run.sustainable_reason or "unknown"
    if run.sustainable:
        return "yes"
    reason = run.sustainable_reason or ""
    return reason if reason.startswith("not sustainable") else "not sustainable"


def _within(run: ServerRun) -> str:
    within = run.within_budget or {}
    point, confident = within.get("point"), within.get("confident")
    if point is None and confident is None:
        return "—"
    if confident:
        level = run.steady_state.level if run.steady_state is not None else None
        return f"yes ({level:.0%} interval)" if level else "yes (95% sure)"
    return "yes (point only)" if point else "no"


def steady_text(steady: SteadyState | None) -> str:
    """How the p99 of a server run was reached: its level, queries, what was left out, and whether it is precise."""
    if steady is None:
        return "—"
    said = (f"{steady.level:.0%} CI; {steady.queries:,} queries, {steady.discarded:,} in open busy periods "
            f"left out; {steady.tail_cycles} busy periods reach the p99")
    if steady.precise:
        return f"precise ({said})"
    return f"NOT precise{' (stopped at the cap)' if steady.capped else ''}: {steady.reason} ({said})"


def _mean(part: dict[str, float | None] | None) -> float | None:
    return (part or {}).get("mean")


def traffic_table(report: Report) -> Table | None:
    """One row per LoadGen test of an artifact at a given rate (the target, then the fixed ``loads``, so rows of
    one rate compare artifacts at the same traffic); None when there is none."""
    head = ["artifact", "scenario", "serving", "offered /s", "completed /s", "p50 ms", "p99 ms [CI]",
            "rounds: p99 min–max", "p99 ratio, paired by round [CI]", "steady state",
            "LoadGen verdict", "queue mean ms", "model mean ms", "mean batch", "within p99 budget", "sustainable"]
    rows = []
    for art, run in _runs_at_rates(report):
        lat = run.latency_ms or {}  # a run whose model failed has no latencies
        p99 = _num(lat.get("p99")) + (_bounds(run.p99_ci) if lat.get("p99") is not None else "")
        rows.append([art.name, run.scenario or "—", serving_text(run.serving),
                     _num(run.offered_qps, 1), _num(run.completed_qps, 1), _num(lat.get("p50")), p99,
                     spread_text(run.steady_state), paired_text(run),
                     steady_text(run.steady_state), verdict(run), _num(_mean(run.queue_ms)),
                     _num(_mean(run.compute_ms)),
                     _num(run.mean_batch, 2), _within(run), _sustainable(run)])
    return (head, rows) if rows else None


def spread_text(steady: SteadyState | None) -> str:
    """The rounds' own p99s, lowest to highest, with the rounds counted, and "drifted" where they differ more
    than their busy periods allow (:data:`DRIFT_P`)."""
    if steady is None or not steady.round_p99:
        return "—"
    low, high = steady.round_p99
    said = f"{_num(low)}–{_num(high)} ({steady.rounds} rounds)"
    return said + (" drifted" if drifted(steady) else "")


def drifted(steady: SteadyState | None) -> bool:
    return steady is not None and steady.rounds_differ_p is not None and steady.rounds_differ_p < DRIFT_P


def paired_text(run: ServerRun) -> str:
    """This run's p99 over the baseline's and its float file's at the same rate, paired round by round."""
    words = {"baseline": "baseline", "fp32": "its fp32 file"}
    return "; ".join(f"×{r.ratio:.2f} [{r.ci[0]:.2f}, {r.ci[1]:.2f}]{_level(r.level)} over {words.get(role, role)} "
                     f"({r.rounds} rounds)" for role, r in (run.paired or {}).items()) or "—"


def _level(level: float | None) -> str:
    return "" if level is None else f" {level:.0%}"


def drift_flags(entries: list[Entry]) -> list[str]:
    """One flag naming every file and rate whose rounds under traffic differed more than their busy periods allow:
    the machine drifted while they were measured, and their intervals (which count that) are wider for it."""
    drifted_runs = []
    for art in entries:
        traffic = art.traffic
        runs = [] if traffic is None else [traffic.at_target, *(traffic.loads or [])]
        for run in filter(None, runs):
            steady = run.steady_state
            if drifted(steady):
                low, high = steady.round_p99 or (None, None)
                drifted_runs.append(f"{art.name} at {_num(run.offered_qps, 1)}/s ({steady.rounds} rounds, p99 per "
                                    f"round {_num(low)}–{_num(high)} ms, permutation test p = "
                                    f"{steady.rounds_differ_p:.2g})")
    if not drifted_runs:
        return []
    return ["the rounds under traffic differ more than their busy periods allow for " + "; ".join(drifted_runs)
            + ": the machine drifted while they were measured; their intervals count that, but measure again on a "
            "quieter machine before trusting the absolute p99s"]


def _runs_at_rates(report: Report) -> list[tuple[Entry, ServerRun]]:
    out = []
    for art in report.artifacts:
        traffic = art.traffic
        if traffic is not None:
            out += [(art, run) for run in [traffic.at_target, *(traffic.loads or [])] if run is not None]
    return out


def capacity_text(cap: Capacity | None) -> str:
    """The capacity and its interval, or why there is none ("not sustainable", "none within budget"...)."""
    if cap is None:
        return "—"
    if cap.qps is not None:
        return _num(cap.qps, 1) + _bounds(cap.ci, 1)
    words = {"model_failed": "model failed", "not_sustainable": "not sustainable",
             "none_within_budget": "none within budget", "not_confident": "not shown within the budget",
             "unknown": "queue unknown",
             "no_rate_probed": "no rate probed", "not_confirmed": "not confirmed by a full-length run"}
    return words.get(cap.status, "none within budget")


def _bracket(cap: Capacity | None) -> str:
    bracket = (cap.bracket if cap is not None else None) or (None, None)
    if all(v is None for v in bracket):
        return "—"
    return f"{_num(bracket[0], 1)} / {'none failed' if bracket[1] is None else _num(bracket[1], 1)}"


def _note(cap: Capacity | None) -> str:
    if cap is None:
        return "no capacity recorded"
    if cap.qps is None:
        return cap.reason or ""
    if cap.confirmed is False:
        return cap.reason or "not confirmed by a full-length run"
    said = []
    if cap.confirmed:
        run = cap.confirmation
        p99 = (run.latency_ms or {}).get("p99") if run is not None else None
        said.append("confirmed by a full-length run" + (f" (p99 {p99:.3f} ms{_bounds(run.p99_ci)})"
                                                         if p99 is not None else ""))
    if given(cap, "censored", (cap.bracket or (None, None))[1] is None):
        said.append("every probed rate passed: the capacity may be higher")
    return "; ".join(said)


def gain_text(gain: dict | None) -> str:
    if not gain or gain.get("ratio") is None:
        return ""
    over = f" over {gain['over']}" if gain.get("over") else ""
    return f"{gain['ratio']:.2f}×" + _bounds(gain.get("ci"), 2) + over


def capacity_table(report: Report) -> Table | None:
    """One row per artifact × serving configuration of the sweep, the best one marked ★, the batching gain
    (its capacity over the batch-1 configuration's) on the best row; then the same for the sweep through the
    file's model server, each row saying what the same configuration carried in process; None when nothing was
    swept."""
    head = ["artifact", "configuration", "serving", "offline /s", "capacity /s [sure, possible]",
            "last pass / first fail /s", "decided on", "batching gain [range]", "note"]
    rows = []
    for art in report.artifacts:
        traffic = art.traffic
        if traffic is None:
            continue
        if traffic.sweep is not None:
            rows.extend(_sweep_rows(art.name, traffic.sweep))
        served = traffic.served
        if served is not None and served.sweep is not None:
            rows.extend(_sweep_rows(f"{art.name} through {served.server or 'its server'}", served.sweep,
                                    in_process=traffic.sweep))
    return (head, rows) if rows else None


def _sweep_rows(name: str, sweep, in_process=None) -> list[list[str]]:
    """A sweep's rows; ``in_process`` (the same file's sweep in process) for a sweep through its server."""
    rows = []
    best_label = sweep.best.label if sweep.best is not None else None
    gain, gain_placed = sweep.batching_gain, False
    for config in sweep.configs:
        cap, best = config.capacity, best_label is not None and config.label == best_label
        offline = config.offline.completed_qps if config.offline is not None else None
        gain_cell = gain_text(gain) if best else ""
        if not best and gain and config.label == gain.get("over"):
            gain_cell = "1 (reference)"
        gain_placed |= best and bool(gain_cell)
        note = config.failed or _note(cap)
        if in_process is not None:
            note = "; ".join(w for w in (note, _in_process_words(config, in_process)) if w)
        rows.append([name, (config.label or "—") + (f" {BEST_MARK}" if best else ""),
                     serving_text(given(config, "serving")) + (f", queue limit {config.max_queue}"
                                                               if config.max_queue else ""),
                     _num(offline, 1), capacity_text(cap), _bracket(cap), given(cap, "rule") or "—", gain_cell, note])
    if gain_text(gain) and not gain_placed:  # no best configuration to carry it
        rows.append([name, "batching gain", "—", "—", "—", "—", "—", gain_text(gain), ""])
    return rows


def _in_process_words(config, in_process) -> str:
    """What the same configuration carried in process, and the share of it the server keeps: point figures of two
    sweeps run apart, so no interval is put on their ratio, and no share where either capacity is only a floor
    (every probed rate passed) or its full-length run did not confirm it."""
    same = next((c for c in (in_process.configs if in_process is not None else [])
                 if c.serving is not None and config.serving is not None
                 and c.serving.knobs() == config.serving.knobs()), None)
    inside = given(same.capacity, "qps") if same is not None else None
    served = given(config.capacity, "qps")
    if not inside:
        return "no configuration in process with these settings" if in_process is not None else ""
    firm = all(given(c.capacity, "censored") is not True and given(c.capacity, "confirmed") is not False
               for c in (same, config) if c.capacity is not None)
    share = f": the server keeps {served / inside:.0%} of it" if served and firm else ""
    return f"in process {inside:,.1f}/s{share}"


def served_table(report: Report) -> Table | None:
    """One row per file the served scenario measured (or could not): its p99 through the server and in process in
    the same rounds, their paired ratio (what the server multiplies the p99 by), and where a served query's time
    went by the server's own count; an INT8 file's served p99 over its fp32 file's through the same server, paired
    by round; None when no file was served."""
    head = ["artifact", "server", "served p50 ms", "served p99 ms [CI]", "in process p99 ms [CI]",
            "served / in process, paired [CI]", "over its fp32 file, served, paired [CI]", "server queue mean ms",
            "server model mean ms", "HTTP and hops mean ms", "refused", "sustainable"]
    rows = []
    for art in report.artifacts:
        served = art.traffic.served if art.traffic is not None else None
        if served is None:
            continue
        if served.run is None:
            rows.append([art.name, served.server or "—", "—", "—", "—", served.failed or "—", "—", "—", "—", "—",
                         "—", "—"])
            continue
        run, inside, split = served.run, served.in_process, served.split
        lat, inside_lat = run.latency_ms or {}, (inside.latency_ms if inside is not None else None) or {}
        ratio, fp32 = (run.paired or {}).get("in_process"), (run.paired or {}).get("fp32")
        rows.append([art.name, served.server or "—", _num(lat.get("p50")), _num(lat.get("p99")) + _bounds(run.p99_ci),
                     _num(inside_lat.get("p99")) + (_bounds(inside.p99_ci) if inside is not None else ""),
                     _paired_words(ratio), _paired_words(fp32, named=True),
                     _num(given(split, "queue_mean_ms")), _num(given(split, "compute_mean_ms")),
                     _num(given(split, "rest_mean_ms")), _num(given(split, "refused"), 0), _sustainable(run)])
    return (head, rows) if rows else None


def _paired_words(ratio, named: bool = False) -> str:
    if ratio is None:
        return "—"
    return (f"×{ratio.ratio:.2f} [{ratio.ci[0]:.2f}, {ratio.ci[1]:.2f}]{_level(ratio.level)} ({ratio.rounds} rounds"
            + (f", over {ratio.reference})" if named else ")"))


def _run_words(run: ServerRun | None) -> str | None:
    lat = (run.latency_ms if run is not None else None) or {}
    if lat.get("p50") is None and lat.get("p99") is None:
        return None
    return f"p50 {_num(lat.get('p50'))} ms, p99 {_num(lat.get('p99'))} ms"


def overhead_line(report: Report) -> str | None:
    """One sentence: the null model's latencies through the same harness, i.e. the harness's own share."""
    overhead = (report.traffic.sut_overhead if report.traffic is not None else None) or {}
    parts = []
    single = _run_words(overhead.get("single-stream"))
    if single:
        parts.append(f"{single} single-stream")
    server = overhead.get("server")
    words = _run_words(server)
    if words:
        rate = server.offered_qps
        parts.append(f"{words} in the server scenario" + (f" at {rate:,.1f}/s" if rate is not None else ""))
    if not parts:
        return None
    return ("Harness overhead: the same serving loop around a model that does nothing measures "
            + "; ".join(parts) + ". That is the harness's own share of every latency above.")


def traffic_sections(report: Report) -> list[tuple[str, Table]]:
    """The traffic tables with their headings, for ``report_tables.sections``; empty when there is no traffic."""
    out = [(TRAFFIC_TITLE, traffic_table(report)), (CAPACITY_TITLE, capacity_table(report)),
           (SERVED_TITLE, served_table(report))]
    return [(title, table) for title, table in out if table]


def section_notes(report: Report) -> dict[str, str]:
    """Lines to print under a section, by its title: the harness overhead under the first traffic table."""
    line, titles = overhead_line(report), [title for title, _ in traffic_sections(report)]
    return {titles[0]: line} if line and titles else {}
