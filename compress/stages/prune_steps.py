"""``target: {macs: auto}``: how far to prune, found in one run on the validation split.

A MACs target set by hand is a guess: too little leaves speed on the table, too much falls past
the red line, and the user learns which only after quantize, export and the bench. Here the
model is pruned in steps (each keeping ``auto.step`` of the previous step's MACs), each step
finetuned briefly, distilled from the unpruned model as the stage's finetune is, its BatchNorm
statistics re-estimated, and judged on the validation split against the red line; the last step
within it is kept and handed to the stage's finetune. This is the schedule of NNCF's adaptive
compression level and of torch-pruning's iterative pruning, bounded: at most ``max_steps`` steps of
``finetune_epochs`` each. The test split is not read here: the bench reads it once.
"""
from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from pydantic import Field
from torch import nn

from compress.config import Strict
from compress.errors import ConfigError
from compress.pruning.channel_pruning import (PruneResult, PruneTarget, PruningError, PruningInputError,
                                              SurgerySettings, prune)
from compress.stages.base import StageContext
from compress.stages.training_run import (BatchNormSettings, TrainingSettings, refresh_batchnorm, run_training,
                                          val_score)
from train.loop import Hooks


class AutoSettings(Strict):
    """How ``target: {macs: auto}`` searches."""

    step: float = Field(0.75, gt=0, lt=1, description="each step keeps this share of the previous step's MACs")
    min_macs: float = Field(0.05, gt=0, lt=1, description="no step below this share of the input's MACs")
    max_steps: int = Field(8, ge=1, le=30, description="steps at most (each one prune, finetune and judge)")
    finetune_epochs: int = Field(1, ge=0, description="epochs of the stage's finetune after each step, before it is "
                                                      "judged on the validation split")


@dataclass
class Steps:
    """The steps taken: the model of the last one within the red line (the input where none was), what pruning did
    to reach it, and the trajectory (each step's share of the MACs and validation figure)."""

    model: nn.Module
    result: PruneResult | None
    trajectory: list[dict] = field(default_factory=list)
    chosen: int = 0

    def record(self, metric: str, auto: AutoSettings) -> dict:
        return {"trajectory": self.trajectory, "chosen_step": self.chosen,
                "cost": {"steps": len(self.trajectory) - 1, "finetune_epochs_per_step": auto.finetune_epochs,
                         "epochs": (len(self.trajectory) - 1) * auto.finetune_epochs},
                "metric": f"val_{metric}"}


def prune_in_steps(ctx: StageContext, model: nn.Module, example: torch.Tensor, protected: list[nn.Module],
                   surgery: SurgerySettings, auto: AutoSettings, finetune: TrainingSettings,
                   batchnorm: BatchNormSettings, hooks_for: Callable[[nn.Module], Hooks], device: torch.device,
                   metric: str, before: float) -> Steps:
    """Prune ``model`` (changed in place; the result's model is a copy) step by step while each step, finetuned,
    stays within the red line of ``before`` (the input's validation figure)."""
    if ctx.group.active:
        raise ConfigError(f"stages.{ctx.name}.target.macs: auto prunes, finetunes and judges in steps in one process; "
                          "give a number, or drop the distributed section")
    red = ctx.pipeline.red_line
    short = finetune.model_copy(update={"epochs": auto.finetune_epochs})
    ctx.log(f"target macs: auto: up to {auto.max_steps} steps of ×{auto.step:g} MACs (not below {auto.min_macs:.0%}), "
            f"each finetuned {auto.finetune_epochs} epoch{'s' if auto.finetune_epochs != 1 else ''} and judged on the "
            f"validation split against the red line ({red.max_drop:g} points); at most "
            f"{auto.max_steps * auto.finetune_epochs} epochs before the finetune")
    steps = Steps(copy.deepcopy(model).cpu(), None, [{"step": 0, "macs_fraction": 1.0, f"val_{metric}": round(before, 3),
                                                      "within": True}])
    results: list[PruneResult] = []
    macs_input = None
    for k in range(1, auto.max_steps + 1):
        model.cpu().eval()
        try:
            result = prune(model, example, PruneTarget(macs=auto.step), protected, surgery)
        except PruningInputError:
            raise
        except PruningError as exc:  # the pruner can go no further (every layer at max_layer_ratio)
            ctx.log(f"step {k}: no further ({exc}); the search stops")
            break
        macs_input = macs_input or result.macs_before
        results.append(result)
        refresh_batchnorm(ctx, model.to(device), batchnorm, short, f"step {k}: after the surgery", device)
        if auto.finetune_epochs:
            run = run_training(ctx, model, short, field=f"stages.{ctx.name}.finetune", label=f"{ctx.name}.step{k}",
                               hooks=hooks_for(model), checkpoint_dir=ctx.stage_dir / f"checkpoints-step{k}")
            refresh_batchnorm(ctx, model, batchnorm, short, f"step {k}: after its finetune", run.device)
        _, val = val_score(model, ctx.data, finetune, device)
        fraction = result.macs_after / macs_input
        within = before - val <= red.max_drop
        steps.trajectory.append({"step": k, "macs_fraction": round(fraction, 4), f"val_{metric}": round(val, 3),
                                 "within": within})
        ctx.log(f"step {k}: {fraction:.1%} of the MACs, val {metric} {val:.2f} (drop {before - val:+.2f}): "
                + ("within the red line" if within else "past the red line, the search stops"),
                style=None if within else "yellow")
        if not within:
            break
        steps.model, steps.result, steps.chosen = copy.deepcopy(model).cpu(), combined(results), k
        if fraction * auto.step < auto.min_macs:
            break
    if steps.result is None:
        ctx.log("no step within the red line: the model is handed on unpruned", style="yellow")
    else:
        ctx.log(f"kept step {steps.chosen}: {steps.result.macs_after / steps.result.macs_before:.1%} of the MACs")
    return steps


def combined(results: list[PruneResult]) -> PruneResult:
    """Several surgeries of one model as one: from the first's figures before to the last's after."""
    first, last = results[0], results[-1]
    return PruneResult(history=[h for r in results for h in r.history], macs_before=first.macs_before,
                       macs_after=last.macs_after, params_before=first.params_before, params_after=last.params_after,
                       channels_before=first.channels_before, channels_after=last.channels_after,
                       importance=first.importance, not_pruned=first.not_pruned,
                       unwrapped=list(dict.fromkeys(u for r in results for u in r.unwrapped)),
                       heads_before=first.heads_before, heads_after=last.heads_after,
                       warnings=list(dict.fromkeys(w for r in results for w in r.warnings)))
