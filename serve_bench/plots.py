"""The report's figures, drawn with matplotlib into PNG bytes (embedded in the HTML)."""
from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


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


def accuracy_vs_p99(entries: list[dict], metric: str, red_line: float | None, budget_ms: float | None) -> bytes:
    """Each artifact with its 95% intervals as error bars: the p99's over blocks (else per request) and the
    accuracy's, against the red line and the budget."""
    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    points = [(e["latency_ms"]["p99"], e["accuracy"][metric]) for e in entries]
    for (x, y), entry in zip(points, entries):
        lat = entry["latency_ms"]
        xerr = _error(x, lat.get("p99_ci_blocks") or lat.get("p99_ci"))
        yerr = _error(y, (entry.get("accuracy_ci") or {}).get(metric))
        ax.errorbar(x, y, xerr=xerr, yerr=yerr, fmt="o", markersize=6, capsize=3, zorder=3)
        ax.annotate(entry["name"], (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
    front = pareto_front(points)
    ax.plot([points[i][0] for i in front], [points[i][1] for i in front], color="black", linewidth=1,
            label="Pareto front", zorder=2)
    if red_line is not None:
        ax.axhline(red_line, color="crimson", linestyle="--", label=f"accuracy red line {red_line:.2f}%")
    if budget_ms:
        ax.axvline(budget_ms, color="darkorange", linestyle="--", label=f"p99 budget {budget_ms:g} ms")
    ax.set_xlabel("p99 latency (ms)")
    ax.set_ylabel(f"{metric} accuracy (%)")
    ax.set_title("Accuracy vs p99 latency (error bars: 95% intervals)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: never over a point
    ax.grid(alpha=0.3)
    return to_png(fig)


def size_by_artifact(entries: list[dict]) -> bytes:
    fig, ax = plt.subplots(figsize=(7, 4))
    names = [e["name"] for e in entries]
    sizes = [e["size_bytes"] / 2**20 for e in entries]
    bars = ax.bar(names, sizes, color="steelblue")
    for bar, entry in zip(bars, entries):
        label = f"{entry['params']:,} params" if entry.get("params") else ""
        if entry.get("macs"):
            label += f"\n{entry['macs'] / 1e6:,.1f} M MACs"
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=7)
    ax.set_ylabel("size on disk (MB)")
    ax.set_title("Size per artifact")
    ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    return to_png(fig)
