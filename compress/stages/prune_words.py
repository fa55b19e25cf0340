"""What the prune stage's log and summary say about a pruned model: what it kept, what kept its width, and what
to try when it collapsed."""
from __future__ import annotations

from compress.pruning.channel_pruning import PruneResult


def kept(result, measure: str | None, short: bool = False) -> str:
    """What the pruned model kept, led by the measure its budget was set on (a params target names the params)."""
    macs, params = result.macs_after / result.macs_before, result.params_after / result.params_before
    if short:
        return f"params {params:.1%}, MACs {macs:.1%}" if measure == "params" else f"MACs {macs:.1%}"
    return (f"{params:.1%} of the params ({macs:.1%} of the MACs)" if measure == "params"
            else f"{macs:.1%} of the MACs")


def not_pruned_line(result: PruneResult) -> str:
    """One line saying what kept its width and why (the report file lists every layer)."""
    parts = [f"{reason}: {', '.join(names[:3])}{f' and {len(names) - 3} more' if len(names) > 3 else ''}"
             for reason, names in result.not_pruned.items()]
    return "; ".join(parts) or "nothing"


def epochs_words(n: int) -> str:
    return f"{n} epoch{'s' if n != 1 else ''}"


def collapse_hint(cfg) -> str:
    """What to try when the pruned model collapsed, from the settings it ran with."""
    tries = []
    if cfg.batchnorm.reestimate_images == 0:
        tries.append("re-estimate its BatchNorm statistics (batchnorm.reestimate_images, 0 now)")
    tries.append("prune less (target)")
    if cfg.finetune.epochs < 3:
        tries.append(f"finetune longer (finetune.epochs, {cfg.finetune.epochs} now)")
    return "Try to " + ", or ".join(tries) + "."
