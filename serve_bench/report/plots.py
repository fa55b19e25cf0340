"""The report's figures, drawn with matplotlib into PNG bytes (embedded in the HTML)."""
from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402
import numpy as np  # noqa: E402

from serve_bench.report_model import Entry, EntryTraffic, ServerRun, SweepConfig  # noqa: E402


def to_png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()


def latency_cdf(latencies: dict[str, np.ndarray], budget_ms: float | None) -> bytes:
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, samples in latencies.items():
        ordered = np.sort(samples)
        ax.plot(ordered, np.arange(1, len(ordered) + 1) / len(ordered), label=name)
    if budget_ms:
        ax.axvline(budget_ms, color="crimson", linestyle="--", label=f"p99 budget {budget_ms:g} ms")
    ax.axhline(0.99, color="grey", linewidth=0.6, linestyle=":")
    ax.set_xscale("log")
    ax.set_xlabel("latency per request (ms, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("Latency CDF")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return to_png(fig)


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of points not beaten on both lower latency and higher accuracy, by latency."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best = [], -np.inf
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def _error(value: float, interval) -> list[list[float]]:
    """Distances below and above ``value`` of its interval, as matplotlib's error bars take them (0 where none
    is known)."""
    if not interval:
        return [[0.0], [0.0]]
    return [[max(value - interval[0], 0.0)], [max(interval[1] - value, 0.0)]]


MARKERS = "osD^vP*Xhp<>"


def accuracy_vs_p99(entries: list[Entry], metric: str, red_line: float | None, budget_ms: float | None) -> bytes:
    return to_png(accuracy_vs_p99_figure(entries, metric, red_line, budget_ms))


def accuracy_vs_p99_figure(entries: list[Entry], metric: str, red_line: float | None, budget_ms: float | None):
    """Each artifact with its 95% intervals as error bars: the p99's over blocks (else per request) and the
    accuracy's, against the red line and the budget.

    The p99 axis is logarithmic: a torch baseline is often ten times slower than every compressed file, and on
    a linear axis those files crowd into its left tenth. Each file has its own colour and marker and is named
    in the legend beside the plot, not next to its point, so no two names can overlap however close the points
    lie; the red line and the budget are drawn as lines and named in the legend too."""
    fig, ax = plt.subplots(figsize=(9, 4.8))
    colours = plt.get_cmap("tab10" if len(entries) <= 10 else "tab20")
    points = [(e.latency_ms.p99, e.accuracy[metric]) for e in entries]
    for i, ((x, y), entry) in enumerate(zip(points, entries)):
        lat = entry.latency_ms
        xerr = _error(x, lat.p99_ci_blocks or lat.p99_ci)
        yerr = _error(y, entry.accuracy_ci.get(metric))
        ax.errorbar(x, y, xerr=xerr, yerr=yerr, fmt=MARKERS[i % len(MARKERS)], markersize=7, capsize=3, zorder=3,
                    color=colours(i % colours.N), label=f"{entry.name}  ({x:.3g} ms, {y:.2f}%)")
    front = pareto_front(points)
    ax.plot([points[i][0] for i in front], [points[i][1] for i in front], color="black", linewidth=1,
            label="Pareto front", zorder=2)
    if red_line is not None:
        ax.axhline(red_line, color="crimson", linestyle="--", label=f"accuracy red line {red_line:.2f}%")
    if budget_ms:
        ax.axvline(budget_ms, color="darkorange", linestyle="--", label=f"p99 budget {budget_ms:g} ms")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(_ms))
    ax.xaxis.set_minor_formatter(ticker.FuncFormatter(lambda v, _: _ms(v, _) if _leading(v) in (2, 5) else ""))
    ax.set_xlabel("p99 latency (ms, log scale)")
    ax.set_ylabel(f"{metric} accuracy (%)")
    ax.set_title("Accuracy vs p99 latency (error bars: 95% intervals)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: never over a point
    ax.grid(alpha=0.3, which="both")
    return fig


def _leading(value: float) -> int:
    """The first significant digit of a positive number (2 for 0.25, 5 for 50)."""
    return int(f"{value:.0e}"[0]) if value > 0 else 0


def _ms(value: float, _pos) -> str:
    return f"{value:g}"


def size_by_artifact(entries: list[Entry]) -> bytes:
    fig, ax = plt.subplots(figsize=(7, 4))
    names = [e.name for e in entries]
    sizes = [e.size_bytes / 2**20 for e in entries]
    bars = ax.bar(names, sizes, color="steelblue")
    for bar, entry in zip(bars, entries):
        label = f"{entry.params:,} params" if entry.params else ""
        if entry.macs:
            label += f"\n{entry.macs / 1e6:,.1f} M MACs"
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=7)
    ax.set_ylabel("size on disk (MB)")
    ax.set_title("Size per artifact")
    ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    return to_png(fig)


def _curve_points(curve: list[ServerRun]) -> list[ServerRun]:
    """The runs that can be drawn (a rate and a p99), by offered rate."""
    drawable = [r for r in curve if r.offered_qps is not None and (r.latency_ms or {}).get("p99") is not None]
    return sorted(drawable, key=lambda r: r.offered_qps)


def _draw_config(ax, config: SweepConfig, color, best: bool) -> None:
    """One serving configuration's curve: p99 solid with its 95% interval, p50 dotted, points the queue could
    not keep up with hollow red rings (a dot of the line's colour inside), the capacity a dashed vertical line."""
    runs = _curve_points(config.curve)
    if not runs:
        return
    x = [r.offered_qps for r in runs]
    p99 = [r.latency_ms["p99"] for r in runs]
    label = f"{'?' if config.label is None else config.label}{' ★' if best else ''} p99"
    ax.plot(x, p99, color=color, linewidth=1.4, label=label, zorder=2)
    p50 = [(r.offered_qps, r.latency_ms.get("p50")) for r in runs if r.latency_ms.get("p50") is not None]
    if p50:
        ax.plot(*zip(*p50), color=color, linewidth=1, linestyle=":", alpha=0.9, zorder=2)
    for run, xi, yi in zip(runs, x, p99):
        yerr = _error(yi, run.p99_ci)
        if run.sustainable is True:
            ax.errorbar(xi, yi, yerr=yerr, fmt="o", color=color, markersize=4, capsize=2, zorder=3)
        else:
            ax.errorbar(xi, yi, yerr=yerr, fmt="o", color="red", mfc="none", markersize=7, capsize=2, zorder=3)
            ax.plot(xi, yi, ".", color=color, markersize=3, zorder=4)  # whose point it is
    qps = config.capacity.qps if config.capacity is not None else None
    if qps is not None:
        ax.axvline(qps, color=color, linestyle="--", linewidth=1, alpha=0.9)


def _swept(entry: Entry) -> EntryTraffic | None:
    """The entry's traffic where its sweep has a curve to draw."""
    traffic = entry.traffic
    if traffic is None or traffic.sweep is None:
        return None
    return traffic if any(_curve_points(c.curve) for c in traffic.sweep.configs) else None


def latency_load_curve(entries: list[Entry], budget_ms: float | None) -> bytes | None:
    """Latency against offered load (LoadGen server runs), one panel per artifact with a sweep, one line per
    serving configuration; None when no artifact has a curve."""
    swept = [(e.name, t) for e in entries if (t := _swept(e)) is not None]
    if not swept:
        return None
    cols = min(len(swept), 2)
    rows = -(-len(swept) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.2 * cols, 4.0 * rows), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (name, traffic) in zip(axes.flat, swept):
        sweep = traffic.sweep
        best, configs = sweep.best.label if sweep.best is not None else None, sweep.configs
        for i, config in enumerate(configs):
            _draw_config(ax, config, colors[i % len(colors)], best is not None and config.label == best)
        if budget_ms:
            ax.axhline(budget_ms, color="crimson", linewidth=1.2, label=f"p99 budget {budget_ms:g} ms")
        if traffic.target_qps:
            ax.axvline(traffic.target_qps, color="grey", linestyle="-.", label=f"target {traffic.target_qps:g}/s")
        if any(r.sustainable is not True for c in configs for r in _curve_points(c.curve)):
            ax.plot([], [], "o", color="red", mfc="none", label="saturation (not sustainable, or unknown)")
        ax.set_yscale("log")
        ax.set_xlabel("offered load (queries/s, Poisson)")
        ax.set_ylabel("latency from scheduled send (ms, log)")
        ax.set_title(f"{name}: p99 solid (CI bars at each run's level), p50 dotted, capacity dashed", fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3, which="both")
    for ax in list(axes.flat)[len(swept):]:
        ax.set_visible(False)
    return to_png(fig)
