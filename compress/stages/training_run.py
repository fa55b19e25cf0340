"""Training settings and one training run, shared by every stage that trains (train, prune, ...).

The stages differ in what they do around the loop (sparsity hooks, surgery, distillation),
not in how a model is trained; this module is the single place that turns validated
settings into the loop's plain objects and its result into recorded metrics.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field, field_validator
from torch import nn

from compress.config import DistributedSettings, Strict
from compress.distillation.loss import LossSettings
from compress.distillation.task_kd import DISTILLATION, Training
from compress.errors import ConfigError, ModelCollapsed, StageError
from compress.stages.base import StageContext
from train.activation_checkpointing import checkpoint_blocks
from train.data import Augment, BatchStream, DataBundle
from train.distributed import SINGLE, ProcessGroupInfo
from train.loop import FitResult, Hooks, LoopSettings, NonFiniteLoss, fit
from train.optim import lr_factor, make_optimizer, make_scheduler
from train.precision import Precision, make_precision
from train.tasks import TASKS, task_of


class AugmentConfig(Strict):
    pad: int = Field(2, ge=0, le=16, description="random shift by up to this many pixels")
    hflip: bool = Field(False, description="random horizontal flips (not for digits)")


class TrainingSettings(Strict):
    """One training run's settings: every stage that trains (train, a prune's sparsity and finetune, distill,
    QAT) takes these, each with its own defaults."""

    epochs: int = Field(8, ge=1, description="passes over the train split")
    batch_size: int = Field(128, ge=1, description="images per forward pass in training (per process when distributed; an "
                                                  "optimizer step takes batch_size × grad_accum)")
    eval_batch_size: int = Field(512, ge=1, description="images per forward pass when measuring accuracy")
    optimizer: Literal["adamw", "sgd"] = Field("adamw", description="adamw, or sgd with Nesterov momentum")
    lr: float = Field(2e-3, gt=0, le=10, description="peak learning rate (after warm-up)")
    weight_decay: float = Field(0.05, ge=0, description="decoupled weight decay (adamw) or L2 (sgd); not on "
                                                         "BatchNorm scales and biases")
    momentum: float = Field(0.9, ge=0, lt=1, description="sgd's momentum (adamw ignores it)")
    schedule: Literal["cosine", "wsd", "step", "constant"] = Field(
        "cosine", description="learning-rate schedule after warm-up: cosine to zero, wsd (warm-up, stable, decay), "
                              "step (milestones), or constant")
    warmup_epochs: float = Field(0.5, ge=0, description="epochs of linear warm-up from zero (fractions allowed)")
    decay_fraction: float = Field(0.2, gt=0, le=1, description="wsd: share of steps spent decaying")
    milestones: list[float] = Field([0.5, 0.75], description="step: fractions of training where lr drops")
    gamma: float = Field(0.1, gt=0, le=1, description="step: lr factor at each milestone")
    grad_accum: int = Field(1, ge=1, description="batches whose gradients add up before each optimizer step")
    clip_grad_norm: float | None = Field(None, gt=0, description="clip the gradients' global norm to this; none: "
                                                                 "no clipping")
    label_smoothing: float = Field(0.0, ge=0, lt=1, description="share of the target's probability spread over the "
                                                               "other classes")
    amp: Literal["auto", "off", "bf16", "fp16"] = Field(
        "auto", description="mixed precision: auto is bf16 where the device computes bf16 natively (CPU or GPU), "
                            "else fp16 with a GradScaler on CUDA and fp32 on the CPU")
    channels_last: bool = Field(False, description="NHWC memory format: faster convolutions on CPUs with oneDNN and "
                                                   "on tensor cores")
    compile: bool = Field(False, description="torch.compile the model first (slower start, faster steps)")
    checkpoint_blocks: list[str] = Field(default_factory=list, description="modules to run with activation checkpointing")
    checkpoint_every: int = Field(100, ge=0, description="optimizer steps between resumable checkpoints")
    augment: AugmentConfig = Field(default_factory=AugmentConfig, description="train-time augmentation")
    train_images: int | None = Field(None, ge=1, description="train on only the first N images of the (already "
                                     "shuffled) train split: data-efficiency studies, e.g. distillation with few labels")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: CUDA where available, else the CPU")
    heartbeat_s: float = Field(30.0, gt=0, description="seconds between progress lines when the output is not a "
                                                       "terminal")

    @field_validator("amp", mode="before")
    @classmethod
    def _yaml_off(cls, value):
        # YAML 1.1 reads a bare `off` as false; that is what the user meant.
        return "off" if value is False else value


class BatchNormSettings(Strict):
    """BatchNorm running statistics set again after channel surgery, a finetune and QAT (train.batchnorm_stats):
    surgery changes every layer's input, and a short finetune at a small momentum does not catch up."""

    reestimate_images: int = Field(600, ge=0, description="training images (no augmentation, train mode, no "
                                   "gradients) whose statistics replace every BatchNorm's running ones; 0: off")


class Distributable(Strict):
    """The per-stage override of the pipeline's ``distributed:`` section (stages that train)."""

    distributed: DistributedSettings | None = Field(
        None, description="processes this stage trains on (torchrun); default: the pipeline's distributed section")


@dataclass
class TrainingRun:
    result: FitResult
    precision: Precision
    device: torch.device
    metrics: dict
    group: ProcessGroupInfo = SINGLE


LR_SCALING = {"none": lambda world: 1.0, "linear": lambda world: float(world), "sqrt": lambda world: world ** 0.5}


def resolve_device(choice: str) -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: cuda was asked for but torch sees no CUDA device; use device: auto or cpu")
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(choice)


def eval_stream(data: DataBundle, split: str, cfg: TrainingSettings, device: torch.device,
                group: ProcessGroupInfo = SINGLE) -> BatchStream:
    return BatchStream(getattr(data, split), data, cfg.eval_batch_size, shuffle=False, drop_last=False,
                       seed=0, device=device, channels_last=cfg.channels_last, shard=group.shard)


def _sync_batchnorm(settings: DistributedSettings | None, device: torch.device, field: str) -> bool:
    """SyncBatchNorm where torch supports it under DDP (CUDA); asked for on CPU, a clear refusal."""
    if settings is None or settings.sync_batchnorm is None:
        return device.type == "cuda"
    if settings.sync_batchnorm and device.type != "cuda":
        raise ConfigError(f"{field}: distributed.sync_batchnorm: true needs GPUs (torch's SyncBatchNorm runs only "
                          "on CUDA); set it false or leave it unset (then each CPU process normalises over its batch)")
    return settings.sync_batchnorm


def run_training(ctx: StageContext, model: nn.Module, cfg: TrainingSettings, *, field: str, label: str,
                 hooks: Hooks | None = None, checkpoint_dir: Path | None = None) -> TrainingRun:
    """Train ``model`` in place; ``field`` names the settings in error messages (e.g. stages.prune.finetune)."""
    device = resolve_device(cfg.device)
    data, group = ctx.data, ctx.group
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        if group.active:  # this rank's GPU, chosen when it joined the group
            device = torch.device("cuda", torch.cuda.current_device())
    model.to(device, memory_format=torch.channels_last if cfg.channels_last else torch.preserve_format)
    if cfg.checkpoint_blocks:
        try:
            checkpoint_blocks(model, cfg.checkpoint_blocks)
        except ValueError as exc:
            raise ConfigError(f"{field}.{exc}") from exc
    split = data.train if cfg.train_images is None else data.train.head(cfg.train_images)
    augment, hooks = task_training(data, model, cfg, field, hooks, group)
    train = BatchStream(split, data, cfg.batch_size, shuffle=True, drop_last=True,
                        augment=augment, seed=ctx.pipeline.seed, device=device,
                        channels_last=cfg.channels_last, shard=group.shard)
    steps_per_epoch = len(train) // cfg.grad_accum
    if steps_per_epoch == 0:
        processes = f" × {group.world} processes" if group.active else ""
        raise ConfigError(f"{field}.batch_size: {cfg.batch_size}{processes} × grad_accum {cfg.grad_accum} is more "
                          f"than the {len(split)} training images; lower it")
    stale = slow_batchnorm(model, steps_per_epoch)
    if stale:
        ctx.log(f"warning: {field}: {stale}", style="yellow")
    scaling = ctx.distributed.lr_scaling if ctx.distributed is not None else "none"
    lr = cfg.lr * LR_SCALING[scaling](group.world)
    total = steps_per_epoch * cfg.epochs
    precision = make_precision(cfg.amp, device)
    optimizer = make_optimizer(model, cfg.optimizer, lr, cfg.weight_decay, cfg.momentum)
    scheduler = make_scheduler(optimizer, lr_factor(
        cfg.schedule, total, int(cfg.warmup_epochs * steps_per_epoch), cfg.decay_fraction, tuple(cfg.milestones), cfg.gamma))
    settings = LoopSettings(epochs=cfg.epochs, grad_accum=cfg.grad_accum, clip_grad_norm=cfg.clip_grad_norm,
                            label_smoothing=cfg.label_smoothing, checkpoint_every=cfg.checkpoint_every,
                            label=label, heartbeat_s=cfg.heartbeat_s, run_key=f"{ctx.cache_key}:{label}",
                            sync_batchnorm=_sync_batchnorm(ctx.distributed, device, field),
                            val_metric=task_of(data).val_metric)
    bn = "SyncBatchNorm" if settings.sync_batchnorm else "BatchNorm statistics per process"
    where = (f"{group.world} processes ({train.batch_size} images each, global batch "
             f"{train.batch_size * group.world * cfg.grad_accum}, lr {lr:g} by lr_scaling {scaling}, {bn})"
             if group.active else str(device))
    ctx.log(f"{label}: {cfg.epochs} epochs × {steps_per_epoch} steps on {where}, {precision.name} "
            f"({precision.reason})")
    if precision.warning:
        ctx.log(f"warning: {field}.{precision.warning}", style="yellow")
    try:
        result = fit(model, train, eval_stream(data, "val", cfg, device, group), optimizer, scheduler, precision,
                     settings, hooks, checkpoint_dir=checkpoint_dir, compile_model=cfg.compile, group=group)
    except NonFiniteLoss as exc:
        raise StageError(str(exc)) from exc
    metrics = {
        f"best_val_{task_of(data).val_metric}": round(result.best_val_top1, 3),
        "best_epoch": result.best_epoch,
        "images_per_s": round(result.images_per_s, 1), "train_time_s": round(result.train_time_s, 2),
        "peak_memory_mb": round(result.peak_memory_bytes / 2**20, 1), "peak_memory_kind": result.peak_memory_kind,
        "precision": precision.name, "precision_reason": precision.reason, "device": str(device),
        "val_precision": precision.name, "test_precision": "fp32",
        "epochs": cfg.epochs, "steps": result.steps,
        "effective_batch": result.effective_batch, "amp_skipped_steps": result.skipped_steps,
        "resumed_from_step": result.resumed_from_step, "processes": group.world,
    }
    return TrainingRun(result, precision, device, metrics, group)


def slow_batchnorm(model: nn.Module, steps_per_epoch: int) -> str | None:
    """Why validation may read BatchNorm statistics that are still mostly their initial values, or None: a model
    trained from scratch (its running statistics never updated) whose momentum forgets the initial ones more
    slowly than one epoch (torchvision's MobileNetV3 uses 0.01)."""
    fresh = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.momentum
             and m.running_mean is not None and not m.running_mean.any() and bool((m.running_var == 1).all())]
    if not fresh:
        return None
    momentum = min(m.momentum for m in fresh)
    left = (1 - momentum) ** steps_per_epoch
    if momentum * steps_per_epoch >= 1:
        return None
    return (f"BatchNorm momentum {momentum:g} over {steps_per_epoch} steps an epoch: after the first epoch the running "
            f"statistics of {len(fresh)} layers are still {left:.0%} their initial values, and validation (eval mode) "
            "reads them, so it can score the model as answering one class; raise the momentum (a torchvision "
            "segmenter takes model.args.bn_momentum: 0.1) or train on more steps")


def refresh_batchnorm(ctx: StageContext, model: nn.Module, settings: BatchNormSettings, cfg: TrainingSettings,
                      after: str, device: torch.device | None = None) -> int:
    """Re-estimate ``model``'s BatchNorm statistics on the first training images (the split is shuffled once, so
    they are a random draw, and every process of a distributed stage reads the same ones: the statistics agree),
    in batches of the training batch size, and say so. Returns the images used (0: off, or no BatchNorm)."""
    from train.batchnorm_stats import batchnorm_count, reestimate

    if settings.reestimate_images == 0 or not batchnorm_count(model):
        return 0
    device = device or next(model.parameters()).device
    available = min(settings.reestimate_images, len(ctx.data.train))
    batch = min(cfg.batch_size, available)
    whole = available // batch * batch  # each batch weighs the same in the average: none cut short
    stream = BatchStream(ctx.data.train.head(whole), ctx.data, batch, shuffle=False, drop_last=True, seed=0,
                         device=device, channels_last=cfg.channels_last)
    used = reestimate(model, stream.epoch(0), settings.reestimate_images)
    ctx.log(f"{after}: BatchNorm statistics of {batchnorm_count(model)} layers re-estimated on {used} training images")
    return used


def stop_if_collapsed(ctx: StageContext, metric: str, before: float, after: float, what: str, hint: str) -> None:
    """Stop the pipeline (ModelCollapsed) where ``after`` (this stage's model, validation split) is more than
    red_line.collapse_margin points below ``before`` (its input's): both figures, and ``hint`` on what to try."""
    red = ctx.pipeline.red_line
    margin = red.collapse_margin
    if margin is None or before - after <= max(margin, red.max_drop):  # within the red line is never a collapse
        return
    ctx.log(f"{what}: val {metric} {before:.2f} → {after:.2f}: collapsed, the pipeline stops here", style="red")
    raise ModelCollapsed(f"stage {ctx.name!r}: {what}: val {metric} {after:.2f} against {before:.2f} for its input, "
                         f"{before - after:.2f} points below (red_line.collapse_margin {margin:g}); the model is not "
                         f"handed on. {hint}")


def test_accuracy(data: DataBundle, model: nn.Module, cfg: TrainingSettings, run: TrainingRun | None = None) -> dict:
    """Test accuracy of the model as it deploys: in fp32, whatever precision it trained in.

    The bench measures the exported fp32 files; a test figure taken under bf16 autocast would
    be a second, different accuracy for the same weights (validation during training stays in
    the training precision, and the record names it).
    """
    device = run.device if run else resolve_device(cfg.device)
    group = run.group if run else SINGLE
    model.to(device)
    return task_of(data).evaluate(model, eval_stream(data, "test", cfg, device, group), group=group)


def test_metrics(test: dict) -> dict:
    """The test figures a stage records: top-1, and top-5 where the class count gives it a meaning; a
    detector's mAP@0.5:0.95 and mAP@0.5; a segmenter's mIoU and pixel accuracy (points)."""
    names = dict.fromkeys(name for task in TASKS.values() for name in task.figures)
    return {f"test_{name}": round(test[name], 3) for name in names if name in test}


def val_score(model: nn.Module, data: DataBundle, cfg: TrainingSettings, device: torch.device,
              group: ProcessGroupInfo = SINGLE) -> tuple[str, float]:
    """The validation figure a stage judges by (the task's: top1, mAP, mIoU), and its name."""
    task = task_of(data)
    return task.val_metric, task.evaluate(model.to(device), eval_stream(data, "val", cfg, device, group),
                                          group=group)[task.val_metric]


def headline(metrics: dict) -> str:
    """The test figure a log line leads with: top-1 of a classifier, mAP of a detector, mIoU of a segmenter."""
    task = next((t for t in TASKS.values() if f"test_{t.val_metric}" in metrics), TASKS["classification"])
    return task.headline(metrics)


def task_training(data: DataBundle, model: nn.Module, cfg: TrainingSettings, field: str, hooks: Hooks | None,
                  group: ProcessGroupInfo) -> tuple[Augment, Hooks | None]:
    """The augmentation and the loop's hooks for ``data``'s task: its loss and validation beside what the stage
    asked for (a classifier's are the loop's own)."""
    task = task_of(data)
    augment = Augment(cfg.augment.pad, cfg.augment.hflip)
    if task.labels_move_with_pixels:
        explicit = cfg.augment.model_fields_set & {"pad", "hflip"}
        if explicit and (cfg.augment.pad or cfg.augment.hflip):
            raise ConfigError(f"{field}.augment: shifts and flips move the pixels, which this loop's augmentation does "
                              f"not follow in the labels of task: {task.name}; drop augment")
        augment = Augment()
    if group.active and not task.distributed:
        raise ConfigError(f"{field}.distributed: task: {task.name} trains in one process; drop the distributed "
                          "section")
    if task.loss is None:
        return augment, hooks
    hooks = hooks or Hooks()
    DISTILLATION[task.distillation].check(model, hooks, field)
    if hooks.loss is None:
        hooks.loss = task.loss(data, model, cfg.label_smoothing)
    hooks.validate = lambda m, stream, autocast: task.evaluate(m, stream, autocast, group=group)
    return augment, hooks


def teacher_loss(teacher: nn.Module, cfg: TrainingSettings, kd: LossSettings, field: str,
                 data: DataBundle | None = None, student: nn.Module | None = None):
    """The loss for a student trained with ``cfg``: teacher on the same device, in the same precision, the way
    ``data``'s task passes knowledge on (a classifier's logits without data)."""
    task = task_of(data) if data is not None else TASKS["classification"]
    device = resolve_device(cfg.device)
    hard = (lambda: task.loss(data, student, cfg.label_smoothing)) if task.loss is not None and data is not None \
        else None  # the task's own loss as the hard term, made only where the way of distilling takes one
    training = Training(device=device, autocast=make_precision(cfg.amp, device).autocast,
                        channels_last=cfg.channels_last, augmenting=bool(cfg.augment.pad or cfg.augment.hflip),
                        label_smoothing=cfg.label_smoothing)
    return DISTILLATION[task.distillation].make(teacher, kd, field, hard, student, data, training)
