"""The search report: every trial with its settings, validation figures and status, the Pareto front,
the final interleaved bench on the test split and the gate's decision on the finalists (with its
correction for choosing among them), as JSON, Markdown and HTML. Accuracy columns show the red
line's metric, the one the drop is measured in."""
from __future__ import annotations

import base64
import html
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from compress.pipeline.fingerprint import environment  # noqa: E402
from compress.search.objective import candidate_name  # noqa: E402
from compress.search.split_bench import read_split_report  # noqa: E402
from serve_bench.report.plots import pareto_front, to_png  # noqa: E402
from train.atomic_io import atomic_dir  # noqa: E402

REPORT_DIR = "report"


def _trial_row(frozen, optuna, interrupted: set[int]) -> dict:
    attrs = frozen.user_attrs
    state = frozen.state.name.lower()
    status = "interrupted" if frozen.number in interrupted else attrs.get("status") or state
    if status == "running" and frozen.state != optuna.trial.TrialState.RUNNING:
        status = state
    return {"trial": frozen.number, "status": status, "params": frozen.params, "dir": attrs.get("dir"),
            "outcome": attrs.get("outcome"), "note": attrs.get("reason") or attrs.get("error"),
            "retry_of": attrs.get("retry_of"), "build_s": attrs.get("build_s"), "measure_s": attrs.get("measure_s")}


def _ci(value, interval, digits: int = 2) -> str:
    if value is None:
        return "—"
    text = f"{value:.{digits}f}"
    return text + (f" [{interval[0]:.{digits}f}, {interval[1]:.{digits}f}]" if interval else "")


def _mmacs(macs: int | None) -> str:
    return "—" if not macs else f"{macs / 1e6:,.{1 if macs >= 1e7 else 3}f}"


def _ratio(ratio: dict | None) -> str:
    return f"×{ratio['ratio']:.3f} [{ratio['ci'][0]:.3f}, {ratio['ci'][1]:.3f}]" if ratio else "reference"


def _figures(o: dict | None) -> list[str]:
    if not o:
        return ["—"] * 7
    ratio = {"ratio": o["p99_ratio"], "ci": o.get("p99_ratio_ci") or [o["p99_ratio"]] * 2} \
        if o.get("p99_ratio") is not None else None
    return [candidate_name(o), _mmacs(o.get("macs")),
            _ci(o.get("accuracy"), o.get("accuracy_ci")), _ci(o.get("drop"), o.get("drop_ci")),
            _ci(o.get("p50"), o.get("p50_ci"), 3), _ci(o.get("p99"), o.get("p99_ci"), 3),
            _ratio(ratio) if ratio else "—"]


def trial_head(metric: str) -> list[str]:
    return ["trial", "status", "settings", "candidate", "M MACs", f"validation {metric} % [95% CI]",
            "validation drop pts [95% CI]", "p50 ms [95% CI]", "p99 ms [95% CI]", "p99 vs baseline [95% CI]", "note"]


def final_head(metric: str) -> list[str]:
    return ["artifact", "M MACs", f"test {metric} % [95% CI]", "test drop pts [95% CI]", "p50 ms [95% CI]",
            "p99 ms [95% CI]", "p99 vs baseline [95% CI]"]


def trial_table(report: dict) -> list[list[str]]:
    rows = [["reference", "hand-set", "as in the pipeline file", *_figures(report["reference"]),
             (report["reference"] or {}).get("why") or ""]]
    for t in report["trials"]:
        settings = ", ".join(f"{k.split('.', 1)[-1]}={v}" for k, v in t["params"].items())
        note = t["note"] or (t["outcome"] or {}).get("why") or ""
        if t.get("retry_of") is not None:
            note = f"retry of trial {t['retry_of']}. {note}".strip()
        rows.append([str(t["trial"]), t["status"], settings, *_figures(t["outcome"]), note])
    return rows


def final_table(final: dict, metric: str) -> list[list[str]]:
    """The final bench's entries; the accuracy column in the red line's ``metric``, as the drop column is."""
    rows = []
    for e in final["entries"]:
        rows.append([e["name"], _mmacs(e.get("macs")),
                     _ci((e.get("accuracy") or {}).get(metric), (e.get("accuracy_ci") or {}).get(metric)),
                     _ci(e.get("drop"), e.get("drop_ci")), _ci(e.get("p50"), e.get("p50_ci"), 3),
                     _ci(e.get("p99"), e.get("p99_ci"), 3), _ratio((e.get("latency_ratio") or {}).get("p99"))])
    return rows


def _markdown_table(head: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(out)


def _html_table(head: list[str], rows: list[list[str]]) -> str:
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table>"


def pareto_plot(report: dict) -> bytes:
    """Every measured trial at its p99 ratio to the baseline and its validation accuracy (95% intervals as
    bars), the front and the red line. Ratios, because each trial was measured in its own bench: absolute
    p99s of separate benches move with the machine, a ratio to the baseline measured beside it does not."""
    fig, ax = plt.subplots(figsize=(8.5, 5))
    measured = [t for t in report["trials"] if t.get("outcome") and t["outcome"].get("p99_ratio") is not None
                and t["outcome"].get("accuracy") is not None]
    points = [(t["outcome"]["p99_ratio"], t["outcome"]["accuracy"]) for t in measured]
    chosen = (report.get("chosen") or {}).get("trial")
    for t, (x, y) in zip(measured, points):
        o = t["outcome"]
        ci_x, ci_y = o.get("p99_ratio_ci") or [x, x], o.get("accuracy_ci") or [y, y]
        style = dict(fmt="o", color="tab:blue") if o["feasible"] else dict(fmt="x", color="grey")
        ax.errorbar(x, y, xerr=[[max(x - ci_x[0], 0)], [max(ci_x[1] - x, 0)]],
                    yerr=[[max(y - ci_y[0], 0)], [max(ci_y[1] - y, 0)]], capsize=2, alpha=0.8, **style)
        ax.annotate(str(t["trial"]), (x, y), textcoords="offset points", xytext=(4, 3), fontsize=7)
        if t["trial"] == chosen:
            ax.plot([x], [y], marker="*", markersize=16, color="crimson", linestyle="none",
                    label=f"chosen: trial {chosen}", zorder=4)
    front = pareto_front(points)
    ax.plot([points[i][0] for i in front], [points[i][1] for i in front], color="black", linewidth=1,
            label="Pareto front of the trials", zorder=2)
    ref = report["reference"]
    if ref and ref.get("p99_ratio") is not None and ref.get("accuracy") is not None:
        ax.plot([ref["p99_ratio"]], [ref["accuracy"]], marker="s", markersize=9, color="darkorange",
                linestyle="none", label="hand-set pipeline", zorder=4)
    if report.get("red_line_accuracy") is not None:
        ax.axhline(report["red_line_accuracy"], color="crimson", linestyle="--",
                   label=f"red line ({report['red_line_accuracy']:.2f}%)")
    ax.set_xscale("log")
    ax.set_xlabel("p99 of the trial's candidate over the baseline's, measured together (log scale)")
    ax.set_ylabel(f"validation {report['metric']} accuracy (%)")
    ax.set_title(f"Search {report['name']}: {len(measured)} measured trials (×: over the limits)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)
    return to_png(fig)


def summary_line(report: dict) -> str:
    final, chosen = report.get("final"), report.get("chosen")
    if chosen is None:
        why = "no trial was within the limits" if final is None else "no finalist passed the gate in the final bench"
        return f"Nothing chosen: {why}."
    vs, limits = final["chosen_vs_hand_set"]["p99"], final["limits"]
    correction = final["gate"]["correction"]
    corrected = f", {correction['method']} over {correction['finalists']} finalists" \
        if correction["method"] != "none" else ""
    return (f"Chosen: trial {chosen['trial']} ({chosen['artifact']}), p99 ×{vs['ratio']:.3f} [{vs['ci'][0]:.3f}, "
            f"{vs['ci'][1]:.3f}] of the hand-set pipeline's ({vs['verdict']}) in one interleaved bench, within the "
            f"red line of {limits['max_drop']:g} points ({limits['metric']}) on the test split under the "
            f"`{limits['decision']}` rule{corrected}; pipeline file {chosen['pipeline']}.")


def render_markdown(report: dict) -> str:
    parts = [f"# Search {report['name']}", "", summary_line(report), "",
             f"Objective `{report['objective']}`, sampler `{report['sampler']}`, {len(report['trials'])} trials "
             f"({report['counts']}), base pipeline `{report['pipeline']}`, trials share its stages "
             f"{', '.join(report['shared_stages']) or '(none)'}; each trained with {report['threads']} thread(s).", "",
             "## Trials", "", "Each trial is scored on the validation split, beside the reference baseline in its "
             "own bench: its drop against that baseline and its p99 as a ratio to it (absolute p99s of separate "
             "benches move with the machine). The test split is not seen until the final bench below.", "",
             _markdown_table(trial_head(report["metric"]), trial_table(report)), "", "![Pareto front](pareto.png)", ""]
    final = report.get("final")
    if final:
        limits = final["limits"]
        parts += ["## Final interleaved bench (test split)", "", f"Measured together in `{final['folder']}` "
                  f"(decision rule `{limits['decision']}`, red line {limits['max_drop']:g} points of "
                  f"{limits['metric']}, p99 budget {limits['p99_budget_ms']} ms).", "",
                  _markdown_table(final_head(report["metric"]), final_table(final, report["metric"])), "",
                  "Gate over the finalists: " + ("released " + final["gate"]["release"] if final["gate"]["passed"]
                                                 else "FAILED: " + "; ".join(final["gate"]["reasons"]))
                  + f". The hand-set result {'passes' if final['hand_set_passes'] else 'fails'} the same gate "
                  "(judged alone, at the usual level).", "",
                  f"Correction for choosing among the finalists on the test split: {final['gate']['correction']['words']}.",
                  ""]
        for line in final["gate"].get("notes", []) + final.get("flags", []):
            parts.append(f"- {line}")
    return "\n".join(parts) + "\n"


def render_html(report: dict, png: bytes) -> str:
    final = report.get("final")
    body = [f"<h1>Search {html.escape(report['name'])}</h1>", f"<p><b>{html.escape(summary_line(report))}</b></p>",
            f"<img alt='Pareto front' src='data:image/png;base64,{base64.b64encode(png).decode()}'>",
            "<h2>Trials (validation split)</h2>", _html_table(trial_head(report["metric"]), trial_table(report))]
    if final:
        body += ["<h2>Final interleaved bench (test split)</h2>",
                 _html_table(final_head(report["metric"]), final_table(final, report["metric"])),
                 f"<p>Correction for choosing among the finalists: {html.escape(final['gate']['correction']['words'])}"
                 ".</p>"]
    style = ("body{font-family:sans-serif;margin:2em} table{border-collapse:collapse;font-size:13px} "
             "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right} td:nth-child(3){text-align:left}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>Search {html.escape(report['name'])}</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n")


def write_search_report(search, study, optuna, reference: dict, final: dict | None, chosen: dict | None) -> dict:
    s = search.settings
    interrupted = set(study.user_attrs.get("interrupted", []))
    trials = [_trial_row(t, optuna, interrupted) for t in sorted(study.trials, key=lambda t: t.number)]
    counts: dict[str, int] = {}
    for t in trials:
        counts[t["status"]] = counts.get(t["status"], 0) + 1
    baseline = read_split_report(Path(reference["report"])).reference_entry()  # the reference run's validation bench
    limits = search.limits
    base_acc = baseline.accuracy.get(limits.metric)
    report = {"format": "compress-search/2", "name": s.name, "search_file": str(search.plan.path),
              "pipeline": str(search.plan.base_path), "objective": s.objective, "sampler": s.sampler,
              "space": s.space_dict(), "scored_on": "validation split; the final bench on the test split",
              "threads": s.threads(), "shared_stages": search.shared, "metric": limits.metric,
              "limits": limits.as_dict(), "max_drop": limits.max_drop, "p99_budget_ms": limits.p99_budget_ms,
              "red_line_accuracy": None if base_acc is None else base_acc - limits.max_drop,
              "reference": reference["outcome"], "trials": trials,
              "counts": ", ".join(f"{n} {k}" for k, n in sorted(counts.items())),
              "final": final, "chosen": chosen, "environment": environment()}
    png = pareto_plot(report)
    with atomic_dir(search.dir / REPORT_DIR) as folder:
        (folder / "search.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
        (folder / "search.md").write_text(render_markdown(report))
        (folder / "search.html").write_text(render_html(report, png))
        (folder / "pareto.png").write_bytes(png)
    return report
