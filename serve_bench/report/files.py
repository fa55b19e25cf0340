"""report.json (parsed by other tools), report.md and a self-contained report.html with plots.

The raw latency samples (latencies.npz: per artifact, each block with its round) and each
artifact's per-image predictions (predictions.npz) are kept beside the report, as plain
arrays read without pickle, so the report can be re-rendered, re-gated with other limits,
or paired with another run's artifacts, without measuring again.
"""
from __future__ import annotations

import base64
import html
import json
from pathlib import Path

import numpy as np

from serve_bench.report import plots
from serve_bench import report_model
from serve_bench.report import tables
from serve_bench.report import traffic as traffic_report
from serve_bench.runners import RUNNER_OF_KIND, RUNNERS
from serve_bench.stats.latency_intervals import BlockedSamples
from serve_bench.stats.paired import smallest_certifiable_drop
from serve_bench.accuracy.predictions import Predictions

REPORT_JSON, SAMPLES_FILE = "report.json", "latencies.npz"


def save_samples(folder: Path, latencies: dict[str, BlockedSamples]) -> None:
    """Flat samples per artifact (``a<i>``), with each block's length and round, so intervals can be redone."""
    arrays = {}
    for i, blocked in enumerate(latencies.values()):
        arrays[f"a{i}"] = blocked.flat
        arrays[f"blocklen{i}"] = np.array([len(b) for b in blocked.blocks], dtype=np.int64)
        arrays[f"round{i}"] = np.array(blocked.rounds, dtype=np.int64)
    np.savez_compressed(folder / SAMPLES_FILE, names=np.array(list(latencies)), **arrays)


def load_blocked(folder: Path) -> dict[str, BlockedSamples]:
    """The saved samples as measured; a file from before blocks were kept reads as one block per artifact."""
    path = folder / SAMPLES_FILE
    if not path.is_file():
        return {}
    out = {}
    with np.load(path, allow_pickle=False) as data:
        for i, name in enumerate(data["names"]):
            flat = data[f"a{i}"]
            if f"blocklen{i}" in data:
                bounds = np.cumsum(data[f"blocklen{i}"])[:-1]
                out[str(name)] = BlockedSamples(list(np.split(flat, bounds)), [int(r) for r in data[f"round{i}"]])
            else:
                out[str(name)] = BlockedSamples([flat], [0])
    return out


def load_samples(folder: Path) -> dict[str, np.ndarray]:
    return {name: blocked.flat for name, blocked in load_blocked(folder).items()}


def test_set_facts(name: str, test, meaningful_accuracy: bool) -> dict:
    """What the report says about the test split: its size and digest, and the tightest red line it can certify."""
    facts = {"name": name, "test_images": len(test.labels), "meaningful_accuracy": meaningful_accuracy,
             "test_digest": test.digest}
    if getattr(test, "targets", None) is None:  # a binomial bound: a detector's mAP has none (its bootstrap says)
        facts["smallest_certifiable_drop"] = round(smallest_certifiable_drop(len(test.labels)), 4)
    return facts


def _budget(gate: report_model.Gate) -> str:
    budget = gate.limits.p99_budget_ms
    return "no p99 budget" if budget is None else f"p99 budget {budget} ms"


def environment_line(env: report_model.Environment | dict) -> str:
    """The machine behind the figures, in one line: CPU, cores, instruction set, runtimes, GPU. A dict (an
    environment not read from a report, e.g. a run's fingerprint) is read as the model first."""
    if not isinstance(env, report_model.Environment):
        env = report_model.Environment.model_validate(env)
    isa = env.isa or {}
    cores = (f"{isa['physical_cores']} physical cores" if isa.get("physical_cores") else
             f"{traffic_report.given(env, 'cpu_count', '?')} CPUs")
    torch_runtime = RUNNER_OF_KIND["torch-model"]
    torch_version = env.packages.get(RUNNERS[torch_runtime].library)
    recorded = env.runtimes if env.runtimes is not None else {  # a report written before runtimes were recorded:
        # onnxruntime's facts apart, torch's version among the packages
        **({torch_runtime: {"version": torch_version}} if torch_version else {}),
        **({RUNNER_OF_KIND["onnx"]: env.onnxruntime} if env.onnxruntime else {})}
    runtime = "; ".join(f"{name} {facts.get('version')}" + (f" ({', '.join(facts['providers'])})"
                                                          if facts.get("providers") else "")
                        for name, facts in recorded.items() if facts) or "runtimes not recorded"
    gpu = (env.gpu or {}).get("name", "none")
    return (f"{traffic_report.given(env, 'cpu', '?')}, {cores}; instruction set: {env.isa_summary or 'not recorded'}"
            + (f"; int8 dot product: {isa['int8_dot_product']}" if isa.get("int8_dot_product") else "")
            + f"; {runtime}; GPU: {gpu}")


def _gate_line(gate: report_model.Gate, metric: str, baseline: str) -> str:
    rule = gate.decision
    rule_words = ("95% upper bounds within the limits" if rule == "confident" else "point estimates")
    return (f"release candidate: `{gate.release or 'none'}` ({_budget(gate)}, max {metric} drop "
            f"{gate.limits.max_drop} points vs `{baseline}`; decision: {rule}, on {rule_words})")


def _md_table(table: tables.Table) -> list[str]:
    head, rows = table
    return (["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            + ["| " + " | ".join(row) + " |" for row in rows])


def render_markdown(report: report_model.Report) -> str:
    gate, metric = report.gate, report.metric
    lines = [f"# Release report: {report.pipeline}", "",
             f"**Gate: {'PASSED' if gate.passed else 'FAILED'}** — {_gate_line(gate, metric, report.baseline)}",
             "", f"Measured on: {environment_line(report.environment)}", ""]
    if gate.notes:
        lines += [f"> note: {note}" for note in gate.notes] + [""]
    if gate.reasons:
        lines += [f"- {reason}" for reason in gate.reasons] + [""]
    lines += _md_table(tables.main_table(report))
    if report.flags:
        lines += ["", "**Flags**", ""] + [f"- ⚠ {flag}" for flag in report.flags]
    notes = {**traffic_report.section_notes(report), "Same file, another runtime": tables.RUNTIME_NOTE,
             tables.EXPORT_ALONE_TITLE: tables.EXPORT_ALONE_NOTE}
    for title, table in tables.sections(report):
        lines += ["", f"## {title}", ""] + _md_table(table) + (["", notes[title]] if title in notes else [])
    lines += ["", intervals_note(report), "", f"Settings: {json.dumps(report.settings)}.", ""]
    return "\n".join(lines)


INTERVALS_NOTE = ("Intervals are 95%: accuracy Wilson; drop paired on the same images (Tango score interval, "
                  "unconditional McNemar); p99 bootstrapped over single requests and over whole interleaved "
                  "blocks; latency ratios over the rounds both artifacts were measured in.")
DETECTION_INTERVALS_NOTE = ("Intervals are 95%: mAP and its drop are percentile intervals over 1,000 bootstrap "
                            "resamples of the test images, the same resamples for every file (the drop is paired); "
                            "p99 bootstrapped over single requests and over whole interleaved blocks; latency ratios "
                            "over the rounds both artifacts were measured in. Every request ends after NMS.")


def intervals_note(report: report_model.Report) -> str:
    return DETECTION_INTERVALS_NOTE if report.metric.startswith("map") else INTERVALS_NOTE


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _html_table(table: tables.Table, release: str | None = None, main: bool = False) -> str:
    """A table inside its own scroll box: a wide section table scrolls by itself, never the page. The main
    table (class ``main``) is laid out to fit a 1280 px window without scrolling: its long artifact names
    break anywhere and its cells wrap."""
    head, rows = table
    marked = ' class="release"'
    body = "".join(f"<tr{marked if release and row[0] == release else ''}>"
                   + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    opening = '<table class="main">' if main else "<table>"
    return (f'<div class="scroll">{opening}<thead><tr>'
            + "".join(f"<th>{html.escape(h)}</th>" for h in head)
            + f"</tr></thead><tbody>{body}</tbody></table></div>")


def render_html(report: report_model.Report, figures: dict[str, bytes]) -> str:
    gate, metric = report.gate, report.metric
    reasons = "".join(f"<li class=\"flag\">note: {html.escape(n)}</li>" for n in gate.notes) + \
        "".join(f"<li>{html.escape(r)}</li>" for r in gate.reasons)
    verdict = "passed" if gate.passed else "failed"
    figs = "".join(f"<figure>{_img(png, name)}</figure>" for name, png in figures.items())
    flags = "".join(f"<li class=\"flag\">⚠ {html.escape(f)}</li>" for f in report.flags)
    notes = {title: f'<p class="environment">{html.escape(line)}</p>'
             for title, line in {**traffic_report.section_notes(report),
                                 "Same file, another runtime": tables.RUNTIME_NOTE,
                                 tables.EXPORT_ALONE_TITLE: tables.EXPORT_ALONE_NOTE}.items()}
    more = "".join(f"<h2>{html.escape(title)}</h2>{_html_table(table)}{notes.get(title, '')}"
                   for title, table in tables.sections(report))
    gate_line = html.escape(_gate_line(gate, metric, report.baseline).replace("`", ""))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Release report: {html.escape(report.pipeline or '')}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2rem auto; padding: 0 1rem; max-width: 1200px; color: #222; }}
.verdict {{ padding: .8rem 1rem; border-radius: 6px; font-size: 1.2rem; }}
.passed {{ background: #e6f4ea; border: 1px solid #34a853; }} .failed {{ background: #fce8e6; border: 1px solid #d93025; }}
table {{ border-collapse: collapse; width: 100%; margin: 1rem 0; font-size: .9rem; }}
th, td {{ border-bottom: 1px solid #ddd; padding: .35rem .5rem; text-align: right; }}
th:first-child, td:first-child {{ text-align: left; }} tr.release {{ background: #fff7d6; font-weight: 600; }}
div.scroll {{ overflow-x: auto; }} table.main {{ font-size: .82rem; }}
table.main th, table.main td {{ padding: .3rem .35rem; }} table.main td:first-child {{ overflow-wrap: anywhere; min-width: 9rem; }}
figure {{ display: inline-block; margin: .5rem; max-width: 100%; }} img {{ max-width: 100%; }}
footer {{ color: #666; font-size: .8rem; }} li.flag {{ color: #a15c00; }}
p.environment {{ color: #444; font-size: .9rem; }}
</style></head><body>
<h1>Release report: {html.escape(report.pipeline or '')}</h1>
<p class="environment">Measured on: {html.escape(environment_line(report.environment))}</p>
<div class="verdict {verdict}">Gate <b>{verdict.upper()}</b> — {gate_line}</div>
<ul>{reasons}{flags}</ul>
{_html_table(tables.main_table(report), gate.release, main=True)}
{more}
<p class="environment">{html.escape(intervals_note(report))}</p>
{figs}
<footer>Environment: {html.escape(json.dumps(report.environment.written()))}<br>
Settings: {html.escape(json.dumps(report.settings))}</footer>
</body></html>
"""


def figures(report: report_model.Report, latencies: dict[str, np.ndarray]) -> dict[str, bytes]:
    metric, limits = report.metric, report.gate.limits
    red_line = report.reference_entry().accuracy[metric] - limits.max_drop
    out = {}
    if latencies:
        out["latency_cdf.png"] = plots.latency_cdf(latencies, limits.p99_budget_ms)
    out["accuracy_vs_p99.png"] = plots.accuracy_vs_p99(report.artifacts, metric, red_line, limits.p99_budget_ms)
    out["size_by_artifact.png"] = plots.size_by_artifact(report.artifacts)
    budget = (report.traffic.p99_budget_ms if report.traffic is not None else None) or limits.p99_budget_ms
    curve = plots.latency_load_curve(report.artifacts, budget)
    if curve is not None:
        out["latency_vs_load.png"] = curve
    return out


def write_report(folder: Path, report: dict | report_model.Report, latencies: dict[str, BlockedSamples] | None = None,
                 predictions: Predictions | None = None) -> None:
    """Write every report file into ``folder`` (the caller makes the folder swap atomic): the report checked
    against its model first (a report that does not fit is refused before anything is written), its JSON schema
    beside it; report.md, report.html and the plots are drawn from the model."""
    document = report.document() if isinstance(report, report_model.Report) else report_model.checked(report)
    report = report_model.Report.model_validate(document)
    folder.mkdir(parents=True, exist_ok=True)
    if latencies is not None:
        save_samples(folder, latencies)
    if predictions is not None:
        predictions.save(folder)
    flat = {name: b.flat for name, b in latencies.items()} if latencies is not None else load_samples(folder)
    figs = figures(report, flat)
    for name, png in figs.items():
        (folder / name).write_bytes(png)
    (folder / REPORT_JSON).write_text(json.dumps(document, indent=2) + "\n")
    (folder / report_model.SCHEMA_FILE).write_text(report_model.schema_text())
    (folder / "report.md").write_text(render_markdown(report))
    (folder / "report.html").write_text(render_html(report, figs))
