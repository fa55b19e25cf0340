"""``target: {macs: auto}`` (or ``{params: auto}``): how far to prune, found in one run on the validation split.

A MACs target set by hand is a guess: too little leaves speed on the table, too much falls past
the red line, and the user learns which only after quantize, export and the bench. Here step k
prunes the model (after its sparsity phase) to ``auto.step``**k of its MACs (or parameters), finetunes the result
briefly (distilled from the unpruned model as the stage's finetune is), re-estimates its BatchNorm
statistics and judges it on the validation split against the red line, measured from the red
line's baseline as the gate measures it (not from this stage's input, which earlier stages may
already have moved); the deepest step within it is handed to the stage's finetune. Each step is
one surgery of the same model to a deeper target, not a surgery of the previous step's result, so
``max_layer_ratio`` and ``head_ratio`` mean what they mean for a fixed target. It is bounded: at
most ``max_steps`` steps of ``finetune_epochs`` each, said in the log.

Each step is judged by a point estimate on the validation split, and the deepest one that passes
is kept: with a small split, a step truly past the line can pass (the deepest of several noisy
estimates is chosen). The bench judges the file on the test split with intervals, once; this
search only decides how far to prune. The test split is not read here.
"""
from __future__ import annotations

import copy
import time
from contextlib import nullcontext
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from pydantic import Field
from torch import nn

from compress.config import Strict
from compress.errors import ConfigError
from compress.pruning.channel_pruning import (PruneResult, PruneTarget, PruningLimitReached, SurgerySettings,
                                              prune_rounded)
from compress.stages import deployed_latency
from compress.stages.base import StageContext
from compress.stages.deployed_latency import DeployedLatencySettings
from compress.stages.training_run import (BatchNormSettings, TrainingSettings, refresh_batchnorm, run_training,
                                          val_score)
from train.loop import Hooks


class AutoSettings(Strict):
    """How ``target: {macs: auto}`` and ``{params: auto}`` search."""

    step: float = Field(0.75, gt=0, lt=1, description="step k keeps this share to the power k of the MACs (or parameters)")
    min_macs: float = Field(0.05, gt=0, lt=1, description="no step below this share of the input's MACs (or parameters)")
    max_steps: int = Field(8, ge=1, le=30, description="steps at most (each one prune, finetune and judge)")
    max_probes: int = Field(3, ge=0, le=10, description="where a step breaks the red line, probes at most between "
                            "it and the last step within (or the unpruned model), halving the bracket each time: a "
                            "tight red line often breaks at the first step, and the model was handed on unpruned")
    resolution: float = Field(0.05, gt=0, lt=1, description="no probe once the bracket is this narrow (a share of "
                                                            "the MACs or parameters)")
    finetune_epochs: int | None = Field(
        None, ge=0, description="epochs of the stage's finetune after each step, before it is judged on the validation "
        "split; default: the finetune's own epochs (a step finetuned less than the kept model will be is judged "
        "too harshly: on resnet18 at 64 px, 1 epoch a step stopped at 20% of the MACs, 4 went on to 6.9% at no drop)")

    def epochs(self, finetune: TrainingSettings) -> int:
        return finetune.epochs if self.finetune_epochs is None else self.finetune_epochs


@dataclass
class Timing:
    """Where each step is timed against the unpruned model (none: accuracy alone judges a step)."""

    runtimes: list[str]
    settings: DeployedLatencySettings
    halve: bool = True  # round_to chosen for the user: halved where a step cannot be reached with it
    where: deployed_latency.Deployment | None = None  # the bench's threads and options there (default: none set)

    def deployment(self) -> deployed_latency.Deployment:
        return self.where or deployed_latency.Deployment(list(self.runtimes))


@dataclass
class Steps:
    """The steps taken: the model of the last one within the red line (the input where none was), what pruning did
    to reach it, and the trajectory (each step's share of the MACs and validation figure)."""

    model: nn.Module
    result: PruneResult | None
    trajectory: list[dict] = field(default_factory=list)
    chosen: int = 0
    reference: float = float("nan")  # the red line's baseline on the validation split, each step judged against
    timed_on: list[str] = field(default_factory=list)  # the runtimes a kept step must be faster on

    def record(self, metric: str, epochs: int, measure: str = "macs") -> dict:
        return {"trajectory": self.trajectory, "chosen_step": self.chosen, "measure": measure,
                "baseline_val": round(self.reference, 3),
                "cost": {"steps": len(self.trajectory) - 1, "finetune_epochs_per_step": epochs,
                         "epochs": (len(self.trajectory) - 1) * epochs},
                "metric": f"val_{metric}",
                "kept": "the deepest step within the red line" + (
                    f" and shown faster than the unpruned model on {', '.join(self.timed_on)} (p50, paired by round)"
                    if self.timed_on else "")}


def prune_in_steps(ctx: StageContext, model: nn.Module, example: torch.Tensor, protected: list[nn.Module],
                   surgery: SurgerySettings, auto: AutoSettings, finetune: TrainingSettings,
                   batchnorm: BatchNormSettings, hooks_for: Callable[[nn.Module], Hooks], device: torch.device,
                   metric: str, reference: float, measure: str = "macs", timing: Timing | None = None) -> Steps:
    """Steps of ``model`` (left as it is) pruned to ``auto.step``**k of its MACs (``measure``: or parameters) while
    each, finetuned, stays within the red line of ``reference`` (the red line's baseline on the validation split).
    With ``timing``, each step is also exported and timed against the unpruned model on its runtimes, and only a
    step shown faster on all of them can be kept: the search goes on past a step that is not (a deeper one may
    be), and stops at the red line."""
    timing = timing or Timing([], DeployedLatencySettings(enabled=False))
    unpruned_file = nullcontext()
    if timing.runtimes:
        try:
            unpruned_file = deployed_latency.UnprunedFile(model, example, ctx.stage_dir)
        except Exception as exc:  # noqa: BLE001 - an exporter failure: the steps are judged on accuracy, said so
            ctx.log(f"the unpruned model could not be exported to time the steps ({type(exc).__name__}: {exc}); "
                    "the steps are judged on accuracy alone", style="yellow")
            timing = Timing([], timing.settings, timing.halve)
    with unpruned_file as unpruned:
        return _steps(ctx, model, example, protected, surgery, auto, finetune, batchnorm, hooks_for, device, metric,
                      reference, measure, timing, unpruned)


@dataclass
class _Tried:
    """One step or probe: its trajectory row, and the pruned model with its record where it was judged."""

    row: dict
    model: nn.Module | None = None
    result: PruneResult | None = None
    within: bool = False
    faster: bool = False
    stop: bool = False  # the pruner went no further, or the step could not be timed: the search ends here


def _steps(ctx, model, example, protected, surgery, auto, finetune, batchnorm, hooks_for, device, metric, reference,
           measure, timing, unpruned) -> Steps:
    word = "MACs" if measure == "macs" else "parameters"
    if ctx.group.active:
        raise ConfigError(f"stages.{ctx.name}.target.{measure}: auto prunes, finetunes and judges in steps in one process; "
                          "give a number, or drop the distributed section")
    red = ctx.pipeline.red_line
    epochs = auto.epochs(finetune)
    short = finetune.model_copy(update={"epochs": epochs})
    _, start = val_score(model, ctx.data, finetune, device)
    ctx.log(f"target {measure}: auto: up to {auto.max_steps} steps to ×{auto.step:g}^k of the {word} (not below "
            f"{auto.min_macs:.0%}), each finetuned {epochs} epoch{'s' if epochs != 1 else ''} "
            f"and judged on the validation split against the red line ({red.max_drop:g} points below the baseline's "
            f"{reference:.2f})" + (f" and by its p50 against the unpruned model's on {', '.join(timing.runtimes)}"
                                   if timing.runtimes else "")
            + f"; where a step breaks the line, up to {auto.max_probes} probes between it and the last step within, "
              f"to {auto.resolution:.0%} of the {word}; at most {(auto.max_steps + auto.max_probes) * epochs} epochs "
              "before the finetune")
    model.cpu()
    steps = Steps(copy.deepcopy(model), None, [{"step": 0, "macs_fraction": 1.0, "params_fraction": 1.0,
                                                f"val_{metric}": round(start, 3),
                                                "within": reference - start <= red.max_drop}], reference=reference,
                  timed_on=list(timing.runtimes))

    def judge(k: int, target: float, probe: bool, bracket: tuple[float, float] | None = None) -> _Tried:
        """Step or probe ``k``, recorded, and kept where it is within the line and faster where it ships; a probe
        only where its surgery landed inside ``bracket`` (never as deep as a step already past the line)."""
        began = time.perf_counter()
        # a probe's surgery must land in the bracket's deeper half at most: the default tolerance could land it as
        # deep as the step already past the line
        cut = surgery if bracket is None else surgery.model_copy(update={"target_tolerance": min(
            surgery.target_tolerance, max(target - bracket[1], 0.0) / 2)})
        tried = _judged(ctx, model, example, protected, cut, measure, target, k, probe, short, epochs, batchnorm,
                        hooks_for, device, finetune, metric, reference, red.max_drop, timing, unpruned, bracket)
        tried.row["seconds"] = round(time.perf_counter() - began, 1)
        if tried.model is not None or tried.row.get("not_timed") or tried.row.get("outside_bracket"):
            steps.trajectory.append(tried.row)
        if tried.within and tried.faster and not tried.row.get("outside_bracket"):
            steps.model, steps.result, steps.chosen = tried.model.cpu(), tried.result, k
        return tried

    within_share, past_share, k = 1.0, None, 0  # the deepest share judged within the line, the shallowest past it
    for k in range(1, auto.max_steps + 1):
        target = auto.step ** k
        if target < auto.min_macs:
            break
        tried = judge(k, target, probe=False)
        if tried.stop:
            break
        if not tried.within:
            past_share = tried.row[f"{measure}_fraction"]
            break
        within_share = tried.row[f"{measure}_fraction"]
    probes = 0
    while past_share is not None and probes < auto.max_probes and within_share - past_share > auto.resolution:
        probes += 1
        k += 1
        target = (within_share + past_share) / 2
        ctx.log(f"probe {k} ({probes} of at most {auto.max_probes}): between {within_share:.1%} (within the red "
                f"line) and {past_share:.1%} (past it), {target:.1%} of the {word}")
        tried = judge(k, target, probe=True, bracket=(within_share, past_share))
        if tried.stop:
            break
        reached = tried.row[f"{measure}_fraction"]
        if tried.within:
            within_share = reached
        else:
            past_share = reached
    if steps.result is None:
        ctx.log("no pruned step within the red line" + (" and faster where it ships" if timing.runtimes else "")
                + ": the model is handed on unpruned", style="yellow")
    else:
        kept = steps.trajectory[steps.chosen]  # the trajectory holds step k at index k
        ctx.log(f"kept step {steps.chosen}{' (a probe)' if kept.get('probe') else ''}: "
                f"{kept['macs_fraction']:.1%} of the MACs, {kept['params_fraction']:.1%} of the parameters")
    spent = sum(r.get("seconds", 0) for r in steps.trajectory)
    timed = sum(c["took_s"] for r in steps.trajectory for c in
                [v.get("cost") or {} for v in (r.get("deployed_latency") or {}).values()] if c)
    ctx.log(f"the search judged {len(steps.trajectory) - 1} steps and probes in {spent:.0f} s"
            + (f", {timed:.0f} s of it timing files" if timed else ""))
    return steps


def _judged(ctx, model, example, protected, surgery, measure, target, k, probe, short, epochs, batchnorm, hooks_for,
            device, finetune, metric, reference, max_drop, timing, unpruned, bracket=None) -> _Tried:
    """Step (or probe) ``k``: ``model`` pruned to ``target`` of its ``measure``, finetuned briefly, judged on the
    validation split against the red line and, within it, timed against the unpruned file. A probe whose surgery
    lands outside its ``bracket`` (no finer than what was judged already) is recorded and stops the search before
    any finetune."""
    word, what = ("MACs" if measure == "macs" else "parameters"), "probe" if probe else "step"
    try:
        candidate, result = prune_rounded(model.eval(), example, PruneTarget(**{measure: target}), protected, surgery,
                                          halve=timing.halve)
    except PruningLimitReached as exc:
        ctx.log(f"{what} {k}: the pruner goes no further ({exc}); the search stops")
        return _Tried({"step": k}, stop=True)
    share = (result.macs_after / result.macs_before if measure == "macs"
             else result.params_after / result.params_before)
    if bracket is not None and not bracket[0] > share > bracket[1]:
        ctx.log(f"{what} {k}: the surgery reached {share:.1%} of the {word}, outside the bracket: not judged, the "
                "search stops (the channel steps are coarser than the bracket here)")
        return _Tried({"step": k, "probe": True, "macs_fraction": round(result.macs_after / result.macs_before, 4),
                       "params_fraction": round(result.params_after / result.params_before, 4),
                       "target": round(target, 4), "outside_bracket": True}, stop=True)
    refresh_batchnorm(ctx, candidate.to(device), batchnorm, short, f"{what} {k}: after the surgery", device)
    if epochs:
        run = run_training(ctx, candidate, short, field=f"stages.{ctx.name}.finetune", label=f"{ctx.name}.step{k}",
                           hooks=hooks_for(candidate), checkpoint_dir=ctx.stage_dir / f"checkpoints-step{k}")
        refresh_batchnorm(ctx, candidate, batchnorm, short, f"{what} {k}: after its finetune", run.device)
    _, val = val_score(candidate, ctx.data, finetune, device)
    fractions = {"macs_fraction": round(result.macs_after / result.macs_before, 4),
                 "params_fraction": round(result.params_after / result.params_before, 4),
                 "round_to": result.round_to, "target": round(target, 4)}
    within = reference - val <= max_drop
    row = {"step": k, **({"probe": True} if probe else {}), **fractions, f"val_{metric}": round(val, 3),
           "within": within}
    faster = True
    if within and timing.runtimes:
        try:
            row["deployed_latency"] = deployed_latency.ratios(unpruned.path, candidate.cpu(), example,
                                                              timing.deployment(), timing.settings, ctx.stage_dir)
            faster = row["faster"] = deployed_latency.pays(row["deployed_latency"])
        except deployed_latency.NotTimed as exc:  # one rule for every step: stop rather than change it
            ctx.log(f"{what} {k} could not be timed ({exc}): the search stops at the last step judged by both",
                    style="yellow")
            row["not_timed"] = str(exc)
            return _Tried(row, stop=True)
    verdict = ("past the red line" + ("" if probe else ", the search stops") if not within else "within the red line"
               + ("" if not timing.runtimes else ", faster where it ships" if faster
                  else ", not shown faster where it ships: not kept" + ("" if probe else ", the search goes on")))
    timed = (f"; p50 vs unpruned {deployed_latency.words(row['deployed_latency'])}"
             + (f", {cost}" if (cost := deployed_latency.cost_words(row["deployed_latency"])) else "")
             if "deployed_latency" in row else "")
    ctx.log(f"{what} {k}: {fractions[f'{measure}_fraction']:.1%} of the {word}, val {metric} {val:.2f} "
            f"({reference - val:+.2f} points below the baseline){timed}: {verdict}",
            style=None if within and faster else "yellow")
    return _Tried(row, candidate, result, within, faster)
