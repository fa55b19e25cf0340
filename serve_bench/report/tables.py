"""The report's tables as plain rows of text, rendered alike into report.md, report.html and the console.

Every number the gate decides on is shown with its 95% interval beside it: accuracy (Wilson),
the drop against the baseline (paired), the p99 (per request and over blocks) and the
speed-up, so a reader sees at once which differences are real.
"""
from __future__ import annotations

from serve_bench.report.profile import kernel_section, profile_sections
from serve_bench.report.traffic import traffic_sections
from serve_bench.report_model import Entry, Ratio, Report

Table = tuple[list[str], list[list[str]]]


def fmt(value, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def interval(pair, digits: int = 3) -> str:
    return "—" if not pair else f"{pair[0]:.{digits}f}–{pair[1]:.{digits}f}"


def _ratio(ratio: Ratio) -> str:
    """A latency ratio with its interval, as every ratio column shows it."""
    return f"{ratio.ratio:.3f} [{ratio.ci[0]:.3f}, {ratio.ci[1]:.3f}]"


def _drop(art: Entry) -> str:
    paired = art.accuracy_paired
    if paired is not None and paired.reference:
        return "0 (reference)"
    if paired is not None and paired.unpaired is not None:
        return "not paired"
    if paired is None or paired.drop_ci is None:
        return fmt(art.accuracy_drop, 2)
    lo, hi = paired.drop_ci
    return f"{art.accuracy_drop:.2f} [{lo:.2f}, {hi:.2f}]"


def _disagree(art: Entry) -> str:
    paired = art.accuracy_paired
    if paired is None or paired.baseline_only is None or paired.reference:
        return "—"
    return f"{paired.baseline_only} / {paired.artifact_only}"


def _speedup(art: Entry) -> str:
    ci = art.speedup_p99_ci
    return f"{art.speedup_p99:.2f}×" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci and art.latency_ratio is not None else "")


def main_table(report: Report) -> Table:
    metric = report.metric
    head = ["artifact", "runtime", "precision", f"{metric} % [95% CI]", "drop points [95% CI]",
            "only baseline / only artifact right", "p50 ms", "p99 ms", "p99 CI per request", "p99 CI blocks",
            "speed-up p99 [CI]", "throughput /s", "size MB"]
    rows = []
    # † : the model came from outside and nothing vouches that the test images are new to it (see the flag)
    independence = report.data.test_independence
    mark = " †" if independence is not None and independence.status == "unknown" else ""
    for a in report.artifacts:
        lat, acc_ci = a.latency_ms, a.accuracy_ci.get(metric)
        accuracy = fmt(a.accuracy.get(metric), 2) + (f" [{acc_ci[0]:.2f}, {acc_ci[1]:.2f}]" if acc_ci else "") + mark
        name = f"{a.name} (the baseline as it is)" if a.role == "reference" else a.name
        rows.append([name, a.runtime, a.precision, accuracy, _drop(a), _disagree(a), fmt(lat.p50),
                     fmt(lat.p99), interval(lat.p99_ci), interval(lat.p99_ci_blocks), _speedup(a),
                     f"{a.throughput:,.0f}", f"{a.size_bytes / 2**20:.2f}"])
    return head, rows


def _ratio_cells(ratio) -> list[str]:
    return [_ratio(ratio.p50), ratio.p50.verdict, _ratio(ratio.p99), ratio.p99.verdict]


def ratio_table(report: Report) -> Table:
    """Each artifact's latency over the baseline's (below 1: faster), intervals from block pairing."""
    head = ["artifact", "p50 ratio [95% CI]", "p50 verdict", "p99 ratio [95% CI]", "p99 verdict", "paired rounds"]
    return head, [[a.name, *_ratio_cells(a.latency_ratio), str(a.latency_ratio.p99.rounds)]
                  for a in report.artifacts if a.latency_ratio is not None]


def export_alone_table(report: Report) -> Table:
    """Each candidate's latency over the unpruned model's fp32 file on the same runtime (export alone; compiled
    alone on torch.compile): what compression earned, apart from what leaving torch eager for the runtime gave; and
    over the unpruned model under torch.compile (compile alone), where it was measured: what a PyTorch user gains
    over what they would deploy without compressing."""
    compiled = any(a.vs_compile_alone is not None for a in report.artifacts)
    head = ["artifact", "against", "p50 ratio [95% CI]", "p50 verdict", "p99 ratio [95% CI]", "p99 verdict",
            *(["compile alone", "p99 ratio [95% CI]", "p99 verdict"] if compiled else [])]

    def cells(ratio) -> list[str]:
        return [ratio.reference or "—", *_ratio_cells(ratio)] if ratio is not None else ["—"] * 5

    rows = []
    for a in report.artifacts:
        if a.vs_export_alone is None and a.vs_compile_alone is None:
            continue
        over_compiled = a.vs_compile_alone
        rows.append([a.name, *cells(a.vs_export_alone),
                     *([over_compiled.reference or "—", _ratio(over_compiled.p99), over_compiled.p99.verdict]
                       if over_compiled is not None else ["—", "—", "—"] if compiled else [])])
    return head, rows


EXPORT_ALONE_TITLE = "Compression alone: against the unpruned model exported, and compiled (block-paired)"
EXPORT_ALONE_NOTE = ("The baseline torch model exported to fp32 ONNX as it is and run on the same runtime (on "
                     "torch.compile: compiled as it is). The gate judges it like any other file: where it is released, "
                     "compression bought nothing within the limits. A ratio below 1 is what pruning "
                     "and quantization earned; the speed-up over torch eager also counts what leaving torch for the "
                     "runtime gave. Compile alone, where measured, is the unpruned model under torch.compile: what a "
                     "PyTorch user would deploy without compressing.")


def repeat_table(report: Report) -> Table:
    head = ["artifact", "repeats", "p50 min–max ms", "p99 min–max ms", "p99 max/min"]
    rows = []
    for a in report.artifacts:
        rep = a.repeats
        if rep is None:
            continue
        spread = rep.spread
        rows.append([a.name, str(rep.k), f"{spread['p50'].min:.3f}–{spread['p50'].max:.3f}",
                     f"{spread['p99'].min:.3f}–{spread['p99'].max:.3f}",
                     fmt(spread["p99"].max_over_min, 2)])
    return head, rows


def ladder_table(report: Report) -> Table:
    """One row per INT8 rung tried: artifact, rung, verdict, validation accuracy and drop per flavour,
    layers kept in float, file sizes, the in-stage latency of the CPU file against its fp32 ONNX,
    and why the ladder climbed past the rung."""
    metric, rows = report.metric, []
    head = ["artifact", "rung", "red line (val)", "val accuracy (drop) per flavour", "float layers", "size KB",
            "p50 ms int8 / fp32", "why it climbed"]
    for art in report.artifacts:
        ladder = art.quantization
        if ladder is None:
            continue
        climbed = ladder.climbed
        for i, rung in enumerate(ladder.rungs):
            flavours = ", ".join(f"{f} {r.get(f'val_{metric}', float('nan')):.2f}% ({r['drop']:+.2f})"
                                 for f, r in rung.flavours.items())
            sizes = ", ".join(f"{f} {r['size_bytes'] / 1024:.0f}" for f, r in rung.flavours.items()
                              if "size_bytes" in r)  # a flavour's file on another runtime (cpu@openvino) is the same file
            lat = rung.latency or {}
            latency = f"{lat['int8_p50_ms']:.3f} / {lat['fp32_p50_ms']:.3f}" if lat else "—"
            chosen = " ← shipped" if rung.rung == ladder.rung else ""
            why = climbed[i].split(": ", 1)[-1] if i < len(climbed) else ""
            rows.append([art.name, rung.rung + chosen, "within" if rung.within_red_line else "over",
                         flavours, str(rung.float_layers), sizes, latency, why])
    return head, rows


def comparison_table(report: Report) -> Table:
    """`compress compare`: each run's file on each runtime against the reference (the first run's pick),
    accuracy paired image by image where the test splits match, latency as block-paired ratios."""
    metric = report.metric
    runs = report.comparison.runs if report.comparison is not None else []
    head = ["run", "artifact", "M MACs", "params", f"{metric} % [95% CI]", "drop vs reference [95% CI]",
            "only reference / only this right", "p99 ms [CI blocks]", "p50 ratio [95% CI]", "p99 ratio [95% CI]"]
    rows, label_of = [], {r.run: r.label for r in runs}
    for a in report.artifacts if runs else []:  # every run's file on every runtime measured: a row per candidate
        label = label_of.get(a.run, "")
        ratio = a.latency_ratio
        ratios = ["1 (reference)"] * 2 if ratio is None else [_ratio(ratio.p50), _ratio(ratio.p99)]
        acc_ci = a.accuracy_ci.get(metric)
        lat = a.latency_ms
        rows.append([label, a.name.removeprefix(f"{label}:"), fmt(a.macs / 1e6 if a.macs else None, 2),
                     f"{a.params:,}" if a.params else "—",
                     fmt(a.accuracy.get(metric), 2) + (f" [{acc_ci[0]:.2f}, {acc_ci[1]:.2f}]" if acc_ci else ""),
                     _drop(a), _disagree(a), f"{lat.p99:.3f} [{interval(lat.p99_ci_blocks)}]", *ratios])
    return head, rows


def runtime_table(report: Report) -> Table:
    """The same file on two runtimes, paired: where their answers differ and how their latencies compare."""
    head = ["candidate", "same file on", "top-1 differs: images (% [95% CI])", "accuracy vs there [95% CI]",
            "only there / only here right", "max |Δlogit| / max |logit|", "p50 ratio [95% CI]", "p99 ratio [95% CI]"]
    rows = []
    for a in report.artifacts:
        parity = a.runtime_parity
        if parity is None:
            continue
        paired, ratio = parity.accuracy_vs_reference, parity.latency_ratio
        ci = parity.top1_differs_ci
        rows.append([a.name, parity.reference,
                     f"{parity.top1_differs} of {parity.n} ({parity.top1_differs_pct:.2f}% "
                     f"[{ci[0]:.2f}, {ci[1]:.2f}])",
                     f"{-paired.drop:+.2f} [{-paired.drop_ci[1]:+.2f}, {-paired.drop_ci[0]:+.2f}]",
                     f"{paired.baseline_only} / {paired.artifact_only}",
                     f"{parity.max_abs_logit_diff_relative:.2e}",
                     *(["—"] * 2 if ratio is None else [_ratio(ratio.p50), _ratio(ratio.p99)])])
    return head, rows


RUNTIME_NOTE = ("The same bytes run by another runtime: its answers paired image by image with the first runtime's "
                "on the same test images (a ratio below 1: faster here). Accuracy is measured through each "
                "runtime, and the red line is checked on the runtime a file is released on.")


def per_class_table(report: Report) -> Table:
    """A segmenter's IoU per class for every file (points), and the classes each loses the most against the
    baseline: a mean can hide one class collapsing."""
    arts = [a for a in report.artifacts if a.per_class_iou]
    if not arts:
        return [], []
    classes = list(arts[0].per_class_iou)
    rows = [[a.name, *(fmt(a.per_class_iou.get(c), 2) for c in classes),
             ", ".join(f"{x['class']} −{x['drop']:.2f}" for x in (a.per_class_loss or [])) or "—"] for a in arts]
    return ["artifact", *(f"{c} IoU" for c in classes), "loses most (points)"], rows


def sections(report: Report) -> list[tuple[str, Table]]:
    """The tables after the main one, each with its heading; empty ones left out; then latency under traffic and
    where each artifact's time goes."""
    out = [("Comparison of runs", comparison_table(report)), ("Latency against the baseline (block-paired)", ratio_table(report)),
           (EXPORT_ALONE_TITLE, export_alone_table(report)),
           ("Run-to-run spread", repeat_table(report)), ("INT8 ladder", ladder_table(report)),
           ("Same file, another runtime", runtime_table(report)), ("IoU per class", per_class_table(report))]
    return [(title, table) for title, table in out if table[1]] + traffic_sections(report) + kernel_section(report) + profile_sections(report)
