"""The BN-scale histogram before and after sparsity training (the picture that shows slimming worked), and the
trajectory of ``target: {macs: auto}`` (or params) (how far pruning went before the red line)."""
from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def gamma_plot(report: dict) -> bytes:
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, label in (("gamma_before", "before sparsity training"), ("gamma_after_sparsity", "after sparsity training")):
        hist = report.get(key) or {}
        if hist.get("counts"):
            edges = hist["edges"]
            ax.stairs(hist["counts"], edges, label=label, fill=False, linewidth=1.5)
    ax.set_xlabel("|BatchNorm scale γ|")
    ax.set_ylabel("channels")
    ax.set_title("BN scales: channels near zero are the ones pruning removes")
    ax.legend(fontsize=8)
    return _png(fig)


def trajectory_plot(trajectory: list[dict], metric: str, red_line: float, chosen: int, measure: str = "macs") -> bytes:
    """Validation figure against the share of MACs (or parameters) kept, one point per step and per probe between a
    step within the line and the first past it (joined in order of the share, probes drawn hollow), the red line
    (the baseline's validation figure less the allowed drop) and the step kept."""
    fig, ax = plt.subplots(figsize=(7, 4))
    key = f"{measure}_fraction"
    judged = sorted((s for s in trajectory if metric in s), key=lambda s: -s[key])
    ax.plot([s[key] * 100 for s in judged], [s[metric] for s in judged], color="#1f77b4", linewidth=1.5)
    for probe in (False, True):
        points = [s for s in judged if bool(s.get("probe")) == probe]
        ax.plot([s[key] * 100 for s in points], [s[metric] for s in points], marker="o", linestyle="none",
                color="#1f77b4", markerfacecolor="white" if probe else "#1f77b4", label="probes" if probe and points else None)
    for step in judged:
        ax.annotate(f"{'probe' if step.get('probe') else 'step'} {step['step']}", (step[key] * 100, step[metric]),
                    textcoords="offset points", xytext=(4, 6), fontsize=8)
    kept = next(s for s in trajectory if s["step"] == chosen)
    ax.plot([kept[key] * 100], [kept[metric]], marker="*", markersize=16, color="#2ca02c",
            label=f"kept: step {chosen}", linestyle="none")
    ax.axhline(red_line, color="#d62728", linestyle="--", linewidth=1, label="red line (validation)")
    ax.set_xlabel(f"{'MACs' if measure == 'macs' else 'parameters'} kept (% of the input's)")
    ax.set_ylabel(metric.replace("_", " "))
    ax.invert_xaxis()  # pruning goes right
    ax.set_title(f"target {measure}: auto — each step finetuned and judged on validation")
    ax.legend(fontsize=8)
    return _png(fig)


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()
