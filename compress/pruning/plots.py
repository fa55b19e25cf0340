"""The BN-scale histogram before and after sparsity training: the picture that shows slimming worked."""
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
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()
