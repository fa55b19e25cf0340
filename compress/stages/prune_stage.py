"""``kind: prune``: BN-scale sparsity training, channel surgery, finetune; saved as history, not pickle.

What the surgery cannot reach (the classifier, protected layers and what is coupled to them,
groups the importance cannot rank, attention kept to whole heads, loose parameters pruned along
a dimension torch-pruning infers) is listed in the stage's metrics, report and log line.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import shutil
from typing import Annotated, Literal

import torch
from pydantic import ConfigDict, Field
from torch import nn

from compress.config import StageConfig
from compress.distillation.loss import DistillSettings, check_pair
from compress.errors import ConfigError
from compress.pruning.channel_pruning import (PruneResult, PruneTarget, SurgerySettings, batchnorm_layers, bn_l1_hook,
                                              gamma_histogram, layer_widths, prune_rounded,
                                              unprunable_batchnorms)
from compress.stages import deployed_latency
from compress.stages.base import InputArtifact, Output, Stage, StageContext, StageResult
from compress.stages.deployed_latency import DeployedLatencySettings
from compress.stages.model_source import model_from_artifact, model_meta, trained_on
from compress.stages.prune_steps import AutoSettings, Timing, prune_in_steps
from compress.stages.prune_words import collapse_hint as _collapse_hint
from compress.stages.prune_words import epochs_words as _epochs, kept as _kept, not_pruned_line as _not_pruned_line
from compress.stages.training_run import (BatchNormSettings, Distributable, TrainingRun, TrainingSettings, headline,
                                          refresh_batchnorm, resolve_device, run_training, stop_if_collapsed,
                                          teacher_loss, test_accuracy, test_metrics, val_score)
from serve_bench.runners import runtime_title, usable_onnx_runtimes
from serve_bench.runners.channel_widths import wanted_multiple
from train.atomic_io import atomic_dir
from train.hardware import isa_facts
from train.loop import Hooks
from train.model_io import load_model, save_model


class SparsityConfig(TrainingSettings):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    epochs: int = Field(2, ge=0, description="0 skips the sparsity phase (e.g. with importance: magnitude)")
    l1: float = Field(1e-4, ge=0, alias="lambda", description="λ of the L1 penalty on BatchNorm scales")


class FinetuneConfig(TrainingSettings):
    epochs: int = Field(3, ge=0, description="passes over the train split after the surgery; 0: none")
    lr: float = Field(1e-3, gt=0, le=10, description="peak learning rate (after warm-up)")
    distill: DistillSettings | None = Field(None, description="distil from a teacher, e.g. {teacher: train}")


class PruneConfig(StageConfig, SurgerySettings, Distributable):
    kind: Literal["prune"] = Field("prune", description="network slimming: an L1 penalty on BatchNorm scales, "
                                                        "channel surgery, a finetune")
    round_to: Annotated[int, Field(ge=1)] | Literal["auto"] | None = Field(
        "auto", description="channel counts rounded to multiples of this; auto: the multiple the convolutions "
        "of the runtimes the file ships on want on this CPU (measured: pipelines/channel_multiples.py), recorded with "
        "its reason; null: no rounding")
    deployed_latency: DeployedLatencySettings = Field(
        default_factory=DeployedLatencySettings, description="the pruned model against the unpruned one, both "
        "exported, timed on the CPU runtimes; target auto keeps only steps faster there")
    sparsity: SparsityConfig = Field(default_factory=SparsityConfig, description="the training with an L1 penalty on "
                                                                               "BatchNorm scales, before the surgery")
    target: PruneTarget = Field(default_factory=lambda: PruneTarget(macs=0.45), description="how far to prune")
    protected: list[str] = Field(default_factory=list, description="module names never pruned (the classifier always)")
    finetune: FinetuneConfig = Field(default_factory=FinetuneConfig, description="the training after the surgery")
    batchnorm: BatchNormSettings = Field(default_factory=BatchNormSettings, description="BatchNorm statistics "
                                         "re-estimated after the surgery and after the finetune")
    auto: AutoSettings = Field(default_factory=AutoSettings, description="how target macs: auto searches")


def _protected(model: nn.Module, names: list[str], field: str) -> list[nn.Module]:
    """The user's protected modules, then the classifier (last: the pruner reports it as such); a detector's
    final class and box convolutions (its ``head_convs``) keep their outputs (class count, four distances)."""
    modules = dict(model.named_modules())
    missing = [n for n in names if n not in modules]
    if missing:
        raise ConfigError(f"{field}.protected: no module named {', '.join(missing)}")
    heads = getattr(model, "head_convs", None)
    if heads is not None:
        absent = [n for n in heads if n not in modules]
        if absent:
            raise ConfigError(f"{field}: the detector's head_convs name no module {', '.join(absent)}")
        return [modules[n] for n in names] + [modules[n] for n in heads]
    classifier = model.get_classifier() if callable(getattr(model, "get_classifier", None)) else None  # timm's
    if not isinstance(classifier, (nn.Linear, nn.Conv2d)):  # some timm models classify with a 1×1 convolution
        classifier = ([m for m in model.modules() if isinstance(m, nn.Linear)] or [None])[-1]
    return [modules[n] for n in names] + ([classifier] if classifier is not None else [])  # it keeps its class count


def _check_criterion(cfg: PruneConfig, model: nn.Module, field: str) -> None:
    """BN-scale pruning on a model without BatchNorm (ConvNeXt, ViT) is a ConfigError, not a fallback.

    Why not fall back to magnitude quietly: the pipeline would record bn_scale while doing
    something else (its cache key, resolved file and search trials would say so too), and its
    sparsity phase would spend every epoch on a penalty with nothing to act on. The fix is one
    line, and saying so before any training costs the user nothing.
    """
    if batchnorm_layers(model):
        return
    norms = sorted({type(m).__name__ for m in model.modules() if isinstance(m, (nn.LayerNorm, nn.GroupNorm))})
    what = f"it normalises with {', '.join(norms)}" if norms else "it has no normalisation layer to rank by"
    if cfg.importance == "bn_scale":
        raise ConfigError(f"{field}.importance: bn_scale (network slimming) ranks channels by BatchNorm scales, but the "
                          f"model has no BatchNorm layers ({what}); set importance: magnitude and sparsity.epochs: 0")
    if cfg.sparsity.epochs > 0:
        raise ConfigError(f"{field}.sparsity.epochs: the sparsity phase drives BatchNorm scales to zero and the model has "
                          f"no BatchNorm layers ({what}); set sparsity.epochs: 0")


def _surgery_once(ctx: StageContext, model: nn.Module, example: torch.Tensor, target: PruneTarget,
                  protected: list[nn.Module], surgery: SurgerySettings, description: dict,
                  halve: bool) -> tuple[nn.Module, PruneResult]:
    """Channel surgery on rank 0 alone; the other ranks load its result from the stage folder.

    Through a file, not a broadcast, so ranks on other machines sharing the run directory get the
    same model the same way; the pruned model is rebuilt from its pruning history, never unpickled.
    """
    folder = ctx.stage_dir / "surgery"
    if ctx.is_main:
        model, result = prune_rounded(model, example, target, protected, surgery, halve=halve)
        pruned = {**description, "pruning": {"history": (description.get("pruning") or {}).get("history", [])
                                             + result.history, "input_shape": list(example.shape[1:])}}
        with atomic_dir(folder) as tmp:
            save_model(model, tmp, pruned)
            (tmp / "surgery.json").write_text(json.dumps(dataclasses.asdict(result)))
    ctx.group.barrier()
    if not ctx.is_main:
        model, _ = load_model(folder)
        result = PruneResult(**json.loads((folder / "surgery.json").read_text()))
    ctx.group.barrier()  # every rank has read it: rank 0 may remove it
    if ctx.is_main:
        shutil.rmtree(folder, ignore_errors=True)
    return model.eval(), result


def _unpruned(model: nn.Module, example: torch.Tensor) -> PruneResult:
    """The record of a model no step of target macs (params): auto pruned within the red line: its figures unchanged."""
    import torch_pruning as tp

    macs, params = tp.utils.count_ops_and_params(model.eval(), example)
    channels = layer_widths(model)
    return PruneResult([], int(macs), int(macs), int(params), int(params), channels, channels)


def _rounding(cfg: PruneConfig, runtimes: list[str]) -> dict:
    """The channel multiple the surgery rounds to, and why: the pipeline's, or (auto) the one the convolutions of
    ``runtimes`` want on this CPU's instruction set."""
    if cfg.round_to == "auto":
        multiple, reason = wanted_multiple(runtimes, isa_facts())
        return {"round_to": multiple if multiple > 1 else None, "reason": reason, "auto": True}
    return {"round_to": cfg.round_to, "auto": False,
            "reason": "set in the pipeline file" if cfg.round_to else "round_to: null in the pipeline file, no rounding"}


class PruneStage(Stage):
    kind = "prune"
    Config = PruneConfig
    input_roles = ("model", "teacher", "baseline")
    required_inputs = ("model",)
    uses = ("seed", "data", "model", "red_line")  # target …: auto and the collapse guard read the red line
    produces = ("model", "report")
    deployable = ("model",)
    distributable = True

    @classmethod
    def config_refs(cls, config: PruneConfig) -> dict[str, str]:  # type: ignore[override]
        distill = config.finetune.distill
        return {"teacher": distill.teacher} if distill else {}

    @classmethod
    def key_extra(cls, config: PruneConfig, pipeline) -> dict | None:  # type: ignore[override]
        """What the settings do not say: the runtimes the model is timed on, the multiple ``round_to: auto``
        resolves to on this machine (a run directory moved to a CPU of another class prunes again), and under
        ``target: auto``, where the timing decides which step is kept, the runtimes' versions, the bench's threads
        and options there, and the machine's instruction set and physical cores. A fixed target's timing only
        reports, so a runtime upgrade or another core count does not prune and finetune it again."""
        where, rounding = cls._deployment(config, pipeline, f"stages.{config.name}")
        key = {"deployed_on": where.runtimes, "round_to": rounding["round_to"]}
        if config.target.auto and where.runtimes:
            facts = isa_facts()
            machine = {k: v for k, v in facts.items() if isinstance(v, bool)} | {"physical_cores": facts.get(
                "physical_cores")}
            key.update(where.key(), machine=machine)
        return key

    @staticmethod
    def _deployment(cfg: PruneConfig, pipeline, field: str) -> tuple[deployed_latency.Deployment, dict]:
        """Where and how the pruned model is timed (the bench's runtimes, threads and options), and the channel
        multiple with its reason."""
        try:
            where = (deployed_latency.deployment_of(cfg.deployed_latency, f"{field}.deployed_latency",
                                                    pipeline.stages) if cfg.deployed_latency.enabled
                     else deployed_latency.Deployment([]))
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        return where, _rounding(cfg, where.runtimes or usable_onnx_runtimes("cpu"))

    @staticmethod
    def _reference(ctx: StageContext, inputs: dict[str, InputArtifact], cfg: PruneConfig, device: torch.device,
                   input_val: float) -> float:
        """The red line's baseline on the validation split (the first train stage's model, as the gate's): the
        line target macs: auto judges against, which earlier stages may already have moved this stage's input from."""
        baseline = inputs.get("baseline")
        if baseline is None or baseline.name == inputs["model"].name:
            return input_val
        model, _ = model_from_artifact(baseline, ctx.data)
        value = val_score(model, ctx.data, cfg.finetune, device)[1]
        ctx.log(f"red line's baseline {baseline.name}: val {value:.2f}; this stage's input {inputs['model'].name}: "
                f"{input_val:.2f}")
        return value

    @staticmethod
    def _finetune_hooks(ctx: StageContext, cfg: PruneConfig, inputs: dict[str, InputArtifact], description: dict):
        """The hooks of a finetune of the pruned model: distilled from the teacher (loaded once) where the stage
        says so. A function of the student, since a step of target macs: auto finetunes each step's model."""
        distill, field = cfg.finetune.distill, f"stages.{ctx.name}.finetune.distill"
        needed = cfg.finetune.epochs > 0 or (cfg.target.auto and cfg.auto.epochs(cfg.finetune) > 0)
        if distill is None or not needed:
            return lambda model: Hooks()
        teacher, teacher_desc = model_from_artifact(inputs["teacher"], ctx.data)
        check_pair(teacher_desc, description, inputs["teacher"].name, inputs["model"].name)
        ctx.log(f"finetune distils from {inputs['teacher'].name} (T={distill.temperature:g}, α={distill.alpha:g})")
        return lambda model: Hooks(loss=teacher_loss(teacher, cfg.finetune, distill, field, ctx.data, model))

    def run(self, ctx: StageContext, inputs: dict[str, InputArtifact]) -> StageResult:
        cfg: PruneConfig = self.config  # type: ignore[assignment]
        field, data = f"stages.{ctx.name}", ctx.data
        torch.manual_seed(ctx.pipeline.seed)
        model, description = model_from_artifact(inputs["model"], data)
        original = copy.deepcopy(model).eval()  # the unpruned model, for the latency ratio
        protected = _protected(model, cfg.protected, field)
        _check_criterion(cfg, model, field)
        example = torch.zeros(1, *data.input_shape)
        report: dict = {"gamma_before": gamma_histogram(model)}
        runs: dict[str, TrainingRun] = {}  # phase → training run, for the precision record

        if cfg.sparsity.epochs > 0:
            kept = unprunable_batchnorms(model, example, protected)
            hook = bn_l1_hook(model, cfg.sparsity.l1, ignored=kept)
            if kept:
                ctx.log(f"{len(kept)} BatchNorm layers belong to protected layers: no L1 penalty on their scales")
            report["unpenalised_batchnorms"] = [n for n, m in model.named_modules() if any(m is k for k in kept)]
            runs["sparsity"] = run_training(ctx, model, cfg.sparsity, field=f"{field}.sparsity",
                                            label=f"{ctx.name}.sparsity", hooks=Hooks(after_backward=hook),
                                            checkpoint_dir=ctx.stage_dir / "checkpoints-sparsity")
            report["gamma_after_sparsity"] = gamma_histogram(model)
        model.cpu().eval()
        where, rounding = self._deployment(cfg, ctx.pipeline, field)
        runtimes = where.runtimes
        if cfg.deployed_latency.min_iters is not None or cfg.deployed_latency.seconds is not None:
            ctx.log(f"{field}.deployed_latency: min_iters and seconds are deprecated and ignored: the check runs "
                    f"{cfg.deployed_latency.rounds} rounds (rounds, round_s)", style="yellow")
        ctx.log(f"channel counts rounded to multiples of {rounding['round_to'] or 1}: {rounding['reason']}")
        surgery = SurgerySettings(**{**cfg.model_dump(include=set(SurgerySettings.model_fields)),
                                     "round_to": rounding["round_to"]})
        device = resolve_device(cfg.finetune.device)
        if device.type == "cuda" and ctx.group.active:
            device = torch.device("cuda", torch.cuda.current_device())
        score, before = val_score(original, data, cfg.finetune, device, ctx.group)
        original.cpu()
        hooks_for = self._finetune_hooks(ctx, cfg, inputs, description)
        steps = None
        if cfg.target.auto:
            if not data.meaningful_accuracy:
                raise ConfigError(f"{field}.target.{cfg.target.measure}: auto judges each step's accuracy, and {data.name}'s labels "
                                  "are random: give a number")
            steps = prune_in_steps(ctx, model, example, protected, surgery, cfg.auto, cfg.finetune, cfg.batchnorm,
                                   hooks_for, device, score, self._reference(ctx, inputs, cfg, device, before),
                                   cfg.target.measure, Timing(runtimes, cfg.deployed_latency, rounding["auto"],
                                                              where))
            model = steps.model.to(device)
            result = steps.result or _unpruned(model, example.to(device))
        else:
            if ctx.group.active:
                model, result = _surgery_once(ctx, model, example, cfg.target, protected, surgery, description,
                                              rounding["auto"])
            else:
                model, result = prune_rounded(model, example, cfg.target, protected, surgery,
                                              halve=rounding["auto"])
            refresh_batchnorm(ctx, model.to(device), cfg.batchnorm, cfg.finetune, "after the surgery", device)
        score, after_surgery = val_score(model, data, cfg.finetune, device, ctx.group)
        rounding.update(used=result.round_to, not_reached=result.rounding)
        if result.rounding:
            ctx.log(f"channel counts rounded to multiples of {result.round_to or 1}"
                    + (f", not {rounding['round_to']}" if result.round_to != rounding["round_to"] else "")
                    + f": tried first: {'; '.join(result.rounding)}", style="yellow")
        target_record = None
        if result.target is not None:  # the target beside what the surgery reached, and whether within tolerance
            target_record = {"measure": result.measure, "asked": result.target, "reached": round(result.reached(), 4),
                             "tolerance": cfg.target_tolerance,
                             "within": result.reached() >= result.target - cfg.target_tolerance}
            if not target_record["within"]:
                ctx.log(f"target {result.measure} {result.target:g}: reached {result.reached():.1%}, more than "
                        f"{cfg.target_tolerance:.0%} under it at every multiple and step count tried; the closest is "
                        "kept", style="yellow")
        heads = (f", attention heads {sum(result.heads_before.values())} → {sum(result.heads_after.values())}"
                 if result.heads_before else "")
        asked = f" (target {result.target:.0%})" if result.target is not None else ""
        ctx.log(f"pruned to {_kept(result, cfg.target.measure)}{asked} "
                f"({result.params_after:,} of {result.params_before:,} params{heads}, {result.importance} importance); "
                f"val {score} right after surgery {after_surgery:.2f}")
        ctx.log(f"not pruned: {_not_pruned_line(result)}")
        if result.unwrapped:
            ctx.log(f"parameters outside any layer, pruned along the dimension torch-pruning inferred: "
                    f"{', '.join(result.unwrapped)}")
        run = None
        if cfg.finetune.epochs > 0:
            hooks = hooks_for(model)
            run = runs["finetune"] = run_training(ctx, model, cfg.finetune, field=f"{field}.finetune",
                                                  label=f"{ctx.name}.finetune", hooks=hooks,
                                                  checkpoint_dir=ctx.stage_dir / "checkpoints-finetune")
            refresh_batchnorm(ctx, model, cfg.batchnorm, cfg.finetune, "after the finetune", run.device)
        _, after = val_score(model, data, cfg.finetune, run.device if run else device, ctx.group)
        if data.meaningful_accuracy:
            stop_if_collapsed(ctx, score, before, after, f"pruned to {_kept(result, cfg.target.measure)}"
                              + (f" and finetuned {_epochs(cfg.finetune.epochs)}" if run else ""),
                              _collapse_hint(cfg))
        test = test_accuracy(ctx.data, model, cfg.finetune, run)
        model.cpu().eval()
        # Timed on rank 0 alone: other ranks timing at once would share its cores and skew it.
        deployed: dict = {}
        try:
            if ctx.is_main:
                deployed = deployed_latency.ratios(original, model, example, where, cfg.deployed_latency,
                                                   ctx.stage_dir)
        except deployed_latency.NotTimed as exc:
            ctx.log(f"the pruned model was not timed where it ships ({exc}); the bench measures the files",
                    style="yellow")
        ctx.log(f"{headline(test_metrics(test))} after finetune; p50 pruned/unpruned, both exported: "
                f"{deployed_latency.words(deployed)}" + (f"; {cost}" if (cost := deployed_latency.cost_words(deployed))
                                                         else ""))
        if deployed and not deployed_latency.pays(deployed):
            slower = [runtime_title(rt) for rt, r in deployed.items() if not deployed_latency.pays({rt: r})]
            ctx.log(f"pruning is not shown faster on {', '.join(slower)}: the pruned file may ship slower than the "
                    "unpruned one there (the bench measures it; round_to, a lighter target or not pruning may pay "
                    "more)", style="yellow")

        history = (description.get("pruning") or {}).get("history", []) + result.history
        description["pruning"] = {"history": history, "input_shape": list(data.input_shape), "stage": ctx.name}
        metrics = {"macs_before": result.macs_before, "macs_after": result.macs_after,
                   "macs_fraction": round(result.macs_after / result.macs_before, 4),
                   "params_fraction": round(result.params_after / result.params_before, 4),
                   "params_before": result.params_before, "params_after": result.params_after,
                   f"val_{score}_before": round(before, 3), f"val_{score}_after_surgery": round(after_surgery, 3),
                   f"val_{score}": round(after, 3),
                   **test_metrics(test),
                   "deployed_latency": deployed, "round_to": rounding,
                   **({"target": target_record} if target_record else {}),
                   "importance": result.importance, "not_pruned": result.not_pruned,
                   "unwrapped_parameters": result.unwrapped,
                   **({"heads_before": sum(result.heads_before.values()), "heads_after": sum(result.heads_after.values())}
                      if result.heads_before else {}),
                   "params": result.params_after, "macs": result.macs_after,
                   **({"auto": steps.record(score, cfg.auto.epochs(cfg.finetune), cfg.target.measure)} if steps is not None else {}),
                   "precision": {phase: {"name": r.precision.name, "reason": r.precision.reason}
                                 for phase, r in runs.items()},
                   "summary": f"{_kept(result, cfg.target.measure, short=True)}, {headline(test_metrics(test))}"
                              + "".join(f", {runtime_title(rt)} p50 ×{r['p50_ratio']:.2f}" for rt, r in deployed.items())}
        report.update(channels_before=result.channels_before, channels_after=result.channels_after,
                      heads_before=result.heads_before, heads_after=result.heads_after,
                      torch_pruning_warnings=result.warnings, metrics=metrics)
        with ctx.atomic_output_dir("model") as folder:
            save_model(model, folder, trained_on(description, data))
        with ctx.atomic_output_dir("report") as folder:
            (folder / "pruning.json").write_text(json.dumps(report, indent=2))
            # Both training phases' per-epoch curves, named by phase, in the train stage's format so
            # tracking shows them as curves (prune.finetune.val_top1, …) like any train stage's.
            curves = [{"epoch": row["epoch"], **{f"{phase}.{k}": v for k, v in row.items() if k not in ("epoch", "step")}}
                      for phase, r in runs.items() for row in r.result.history]
            (folder / "history.json").write_text(json.dumps(curves, indent=2))
            if report["gamma_before"]["counts"]:  # a model without BatchNorm has no scales to plot
                from compress.pruning.plots import gamma_plot

                (folder / "gamma.png").write_bytes(gamma_plot(report))
            if steps is not None:
                from compress.pruning.plots import trajectory_plot

                (folder / "trajectory.png").write_bytes(trajectory_plot(
                    steps.trajectory, f"val_{score}", steps.reference - ctx.pipeline.red_line.max_drop, steps.chosen,
                    cfg.target.measure))
        return StageResult(outputs=[Output("model", "torch-model", ctx.stage_dir / "model",
                                           meta=model_meta(metrics, description)),
                                    Output("report", "report", ctx.stage_dir / "report")], metrics=metrics)
