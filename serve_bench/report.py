"""report.json (parsed by other tools), report.md and a self-contained report.html with plots.

The raw latency samples are kept beside the report (latencies.npz, plain arrays, no
pickle) so the report can be re-rendered, or re-gated with other limits, without
measuring again.
"""
from __future__ import annotations

import base64
import html
import json
from pathlib import Path

import numpy as np

from serve_bench import plots

REPORT_JSON, SAMPLES_FILE = "report.json", "latencies.npz"


def save_samples(folder: Path, latencies: dict[str, np.ndarray]) -> None:
    np.savez_compressed(folder / SAMPLES_FILE, **{f"a{i}": v for i, v in enumerate(latencies.values())},
                        names=np.array(list(latencies)))


def load_samples(folder: Path) -> dict[str, np.ndarray]:
    path = folder / SAMPLES_FILE
    if not path.is_file():
        return {}
    with np.load(path, allow_pickle=False) as data:
        return {str(name): data[f"a{i}"] for i, name in enumerate(data["names"])}


def _budget(gate: dict) -> str:
    return "no p99 budget" if gate["p99_budget_ms"] is None else f"p99 budget {gate['p99_budget_ms']} ms"


def environment_line(env: dict) -> str:
    """The machine behind the figures, in one line: CPU, cores, instruction set, runtimes, GPU."""
    isa, ort = env.get("isa") or {}, env.get("onnxruntime") or {}
    cores = (f"{isa['physical_cores']} physical cores" if isa.get("physical_cores") else
             f"{env.get('cpu_count', '?')} CPUs")
    runtime = (f"onnxruntime {ort.get('version')} ({', '.join(ort.get('providers', []))})" if ort
               else "onnxruntime not recorded")
    gpu = (env.get("gpu") or {}).get("name", "none")
    return (f"{env.get('cpu', '?')}, {cores}; instruction set: {env.get('isa_summary') or 'not recorded'}"
            + (f"; int8 dot product: {isa['int8_dot_product']}" if isa.get("int8_dot_product") else "")
            + f"; torch {env.get('packages', {}).get('torch', '?')}; {runtime}; GPU: {gpu}")


def _fmt(value, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def ladder_lines(report: dict) -> list[list[str]]:
    """One row per INT8 rung tried: artifact, rung, verdict, validation accuracy and drop per flavour,
    layers kept in float, file sizes, the in-stage latency of the CPU file against its fp32 ONNX,
    and why the ladder climbed past the rung."""
    metric, rows = report.get("metric", "top1"), []
    for art in report["artifacts"]:
        ladder = art.get("quantization")
        if not ladder:
            continue
        climbed = ladder.get("climbed", [])
        for i, rung in enumerate(ladder.get("rungs", [])):
            flavours = ", ".join(f"{f} {r.get(f'val_{metric}', float('nan')):.2f}% ({r['drop']:+.2f})"
                                 for f, r in rung["flavours"].items())
            sizes = ", ".join(f"{f} {r['size_bytes'] / 1024:.0f}" for f, r in rung["flavours"].items())
            lat = rung.get("latency") or {}
            latency = f"{lat['int8_p50_ms']:.3f} / {lat['fp32_p50_ms']:.3f}" if lat else "—"
            chosen = " ← shipped" if rung["rung"] == ladder["rung"] else ""
            why = climbed[i].split(": ", 1)[-1] if i < len(climbed) else ""
            rows.append([art["name"], rung["rung"] + chosen, "within" if rung["within_red_line"] else "over",
                         flavours, str(rung["float_layers"]), sizes, latency, why])
    return rows


LADDER_HEAD = ["artifact", "rung", "red line (val)", "val accuracy (drop) per flavour", "float layers", "size KB",
               "p50 ms int8 / fp32", "why it climbed"]


def render_markdown(report: dict) -> str:
    gate, metric = report["gate"], report.get("metric", "top1")
    lines = [f"# Release report: {report.get('pipeline', '')}", "",
             f"**Gate: {'PASSED' if gate['passed'] else 'FAILED'}** — release candidate: "
             f"`{gate['release'] or 'none'}` ({_budget(gate)}, "
             f"max {metric} drop {gate['max_accuracy_drop']} points vs `{report['baseline']}`)", "",
             f"Measured on: {environment_line(report.get('environment', {}))}", ""]
    if gate.get("notes"):
        lines += [f"> note: {note}" for note in gate["notes"]] + [""]
    if gate["reasons"]:
        lines += [f"- {reason}" for reason in gate["reasons"]] + [""]
    lines += [f"| artifact | backend | precision | {metric} % | drop (points) | p50 ms | p99 ms | p99 95% CI | "
              "throughput /s | speed-up p99 | size MB |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for a in report["artifacts"]:
        lat = a["latency_ms"]
        lines.append(f"| {a['name']} | {a['backend']} | {a['precision']} | {_fmt(a['accuracy'].get(metric), 2)} | "
                     f"{_fmt(a['accuracy_drop'], 2)} | {_fmt(lat['p50'])} | {_fmt(lat['p99'])} | "
                     f"{_fmt(lat['p99_ci'][0])}–{_fmt(lat['p99_ci'][1])} | {a['throughput']:,.0f} | "
                     f"{a['speedup_p99']:.2f}× | {a['size_bytes'] / 2**20:.2f} |")
    if report.get("flags"):
        lines += ["", "**Flags**", ""] + [f"- ⚠ {flag}" for flag in report["flags"]]
    ladder = ladder_lines(report)
    if ladder:
        lines += ["", "## INT8 ladder", "", "| " + " | ".join(LADDER_HEAD) + " |",
                  "|" + "---|" * len(LADDER_HEAD)] + ["| " + " | ".join(row) + " |" for row in ladder]
    lines += ["", f"Settings: {json.dumps(report.get('settings', {}))}.", ""]
    return "\n".join(lines)


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def render_html(report: dict, figures: dict[str, bytes]) -> str:
    gate, metric = report["gate"], report.get("metric", "top1")
    rows = []
    for a in report["artifacts"]:
        lat = a["latency_ms"]
        mark = " class=\"release\"" if a["name"] == gate["release"] else ""
        rows.append(f"<tr{mark}><td>{html.escape(a['name'])}</td><td>{a['backend']}</td><td>{a['precision']}</td>"
                    f"<td>{_fmt(a['accuracy'].get(metric), 2)}</td><td>{_fmt(a['accuracy_drop'], 2)}</td>"
                    f"<td>{_fmt(lat['p50'])}</td><td>{_fmt(lat['p99'])}</td>"
                    f"<td>{_fmt(lat['p99_ci'][0])}–{_fmt(lat['p99_ci'][1])}</td><td>{a['throughput']:,.0f}</td>"
                    f"<td>{a['speedup_p99']:.2f}×</td><td>{a['size_bytes'] / 2**20:.2f}</td></tr>")
    reasons = "".join(f"<li class=\"flag\">note: {html.escape(n)}</li>" for n in gate.get("notes", [])) + \
        "".join(f"<li>{html.escape(r)}</li>" for r in gate["reasons"])
    verdict = "passed" if gate["passed"] else "failed"
    figs = "".join(f"<figure>{_img(png, name)}</figure>" for name, png in figures.items())
    flags = "".join(f"<li class=\"flag\">⚠ {html.escape(f)}</li>" for f in report.get("flags", []))
    ladder = ladder_lines(report)
    ladder_html = "" if not ladder else (
        "<h2>INT8 ladder</h2><table><thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in LADDER_HEAD)
        + "</tr></thead><tbody>" + "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
                                           for row in ladder) + "</tbody></table>")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Release report: {html.escape(report.get('pipeline', ''))}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1100px; color: #222; }}
.verdict {{ padding: .8rem 1rem; border-radius: 6px; font-size: 1.2rem; }}
.passed {{ background: #e6f4ea; border: 1px solid #34a853; }} .failed {{ background: #fce8e6; border: 1px solid #d93025; }}
table {{ border-collapse: collapse; width: 100%; margin: 1rem 0; font-size: .9rem; }}
th, td {{ border-bottom: 1px solid #ddd; padding: .35rem .5rem; text-align: right; }}
th:first-child, td:first-child {{ text-align: left; }} tr.release {{ background: #fff7d6; font-weight: 600; }}
figure {{ display: inline-block; margin: .5rem; }} img {{ max-width: 520px; }}
footer {{ color: #666; font-size: .8rem; }} li.flag {{ color: #a15c00; }}
p.environment {{ color: #444; font-size: .9rem; }}
</style></head><body>
<h1>Release report: {html.escape(report.get('pipeline', ''))}</h1>
<p class="environment">Measured on: {html.escape(environment_line(report.get('environment', {})))}</p>
<div class="verdict {verdict}">Gate <b>{verdict.upper()}</b> — release candidate: <b>{html.escape(gate['release'] or 'none')}</b>
({_budget(gate)}, max {metric} drop {gate['max_accuracy_drop']} points vs {html.escape(report['baseline'])})</div>
<ul>{reasons}{flags}</ul>
<table><thead><tr><th>artifact</th><th>backend</th><th>precision</th><th>{metric} %</th><th>drop (points)</th><th>p50 ms</th>
<th>p99 ms</th><th>p99 95% CI</th><th>throughput /s</th><th>speed-up p99</th><th>size MB</th></tr></thead>
<tbody>{''.join(rows)}</tbody></table>
{ladder_html}
{figs}
<footer>Environment: {html.escape(json.dumps(report.get('environment', {})))}<br>
Settings: {html.escape(json.dumps(report.get('settings', {})))}</footer>
</body></html>
"""


def figures(report: dict, latencies: dict[str, np.ndarray]) -> dict[str, bytes]:
    gate, metric = report["gate"], report.get("metric", "top1")
    baseline = next(a for a in report["artifacts"] if a["name"] == report["baseline"])
    red_line = baseline["accuracy"][metric] - gate["max_accuracy_drop"]
    out = {}
    if latencies:
        out["latency_cdf.png"] = plots.latency_cdf(latencies, gate["p99_budget_ms"])
    out["accuracy_vs_p99.png"] = plots.accuracy_vs_p99(report["artifacts"], metric, red_line, gate["p99_budget_ms"])
    out["size_by_artifact.png"] = plots.size_by_artifact(report["artifacts"])
    return out


def write_report(folder: Path, report: dict, latencies: dict[str, np.ndarray] | None = None) -> None:
    """Write every report file into ``folder`` (the caller makes the folder swap atomic)."""
    folder.mkdir(parents=True, exist_ok=True)
    if latencies is not None:
        save_samples(folder, latencies)
    else:
        latencies = load_samples(folder)
    figs = figures(report, latencies)
    for name, png in figs.items():
        (folder / name).write_bytes(png)
    (folder / REPORT_JSON).write_text(json.dumps(report, indent=2) + "\n")
    (folder / "report.md").write_text(render_markdown(report))
    (folder / "report.html").write_text(render_html(report, figs))
