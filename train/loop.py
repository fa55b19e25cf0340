"""The training loop every stage reuses: AMP, accumulation, clipping, checkpoint/resume.

Stages change its behaviour only through ``Hooks`` (a replacement loss such as
distillation, extra loss terms, a post-backward gradient hook such as the BN-sparsity
penalty, a model wrapper such as QAT), never by forking it. Precision arrives as an
autocast factory and a scaler, so the loop has a single code path.
"""
from __future__ import annotations

import contextlib
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ContextManager

import torch
from torch import nn
from torch.nn import functional as F

from train.checkpoint import load_checkpoint, restore_rng, rng_state, save_checkpoint
from train.data import BatchStream
from train.distributed import SINGLE, ProcessGroupInfo, from_sync_batchnorm, to_sync_batchnorm
from train.errors import TrainError
from train.evaluate import evaluate
from train.memory import PeakMemory
from train.precision import Precision
from train.progress import StepProgress

LossFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], dict[str, torch.Tensor]]


class NonFiniteLoss(TrainError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


@dataclass
class LoopSettings:
    epochs: int
    grad_accum: int = 1
    clip_grad_norm: float | None = None
    label_smoothing: float = 0.0
    checkpoint_every: int = 0  # optimizer steps between checkpoints; epoch ends always checkpoint
    label: str = "train"
    heartbeat_s: float = 30.0
    run_key: str = ""  # a checkpoint written under another key (other settings) is not resumed
    # Several processes: BatchNorm statistics over the global batch, as one process would compute them
    # (torch's SyncBatchNorm, which DDP accepts only on CUDA).
    sync_batchnorm: bool = False
    val_metric: str = "top1"  # the validation figure recorded as val_<name> and maximised (map for a detector)


@dataclass
class Hooks:
    loss: LossFn | None = None  # replaces cross-entropy; returns {"loss": total, **parts}
    after_backward: Callable[[nn.Module], None] | None = None  # gradients are unscaled here
    on_epoch: Callable[[dict], None] | None = None  # receives each epoch's record (loss, val accuracy)
    # Entered around every validation pass: a model whose forward has side effects in eval mode
    # (QAT's range observers) must not learn from the images that judge it.
    evaluation: Callable[[], ContextManager] | None = None
    # Replaces top-1 validation (a detector is scored by mAP): returns the metrics of the split, the one named
    # by LoopSettings.val_metric choosing the best epoch.
    validate: Callable[[nn.Module, BatchStream, Callable[[], ContextManager]], dict] | None = None


@dataclass
class FitResult:
    steps: int
    epochs: int
    history: list[dict]
    best_val_top1: float
    best_epoch: int
    images_per_s: float
    train_time_s: float
    skipped_steps: int
    resumed_from_step: int
    peak_memory_bytes: int
    peak_memory_kind: str
    effective_batch: int
    final_loss: float
    model: nn.Module


def _params_finite(model: nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


class _Loop:
    """The state of one fit() call; each method is one phase of a step or an epoch."""

    def __init__(self, train_model: nn.Module, forward_model: nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler: torch.optim.lr_scheduler.LRScheduler, precision: Precision, settings: LoopSettings,
                 hooks: Hooks, total_steps: int, group: ProcessGroupInfo = SINGLE,
                 ddp: nn.Module | None = None) -> None:
        self.train_model, self.forward_model = train_model, forward_model
        self.group, self.ddp = group, ddp
        self.optimizer, self.scheduler, self.precision = optimizer, scheduler, precision
        self.settings, self.hooks, self.total_steps = settings, hooks, total_steps
        self.state = {"step": 0, "skipped": 0, "history": [], "best_val_top1": -1.0, "best_epoch": -1}
        self.images_seen, self.train_time = 0, 0.0
        self.epoch_sums: dict[str, float] = {}
        self.epoch_steps = 0

    def _loss_terms(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        with self.precision.autocast():
            logits = self.forward_model(x)
            if self.hooks.loss:
                terms = dict(self.hooks.loss(x, logits, y))
            else:
                terms = {"loss": F.cross_entropy(logits.float(), y, label_smoothing=self.settings.label_smoothing)}
        return terms

    def _micro_step(self, x: torch.Tensor, y: torch.Tensor, accum: int) -> tuple[dict[str, torch.Tensor], float]:
        terms = self._loss_terms(x, y)
        value = terms["loss"].item()
        if not math.isfinite(value):
            raise NonFiniteLoss(
                f"{self.settings.label}: loss became {value} at step {self.state['step'] + 1}/{self.total_steps} "
                f"(precision {self.precision.name}). Try a lower lr, gradient clipping (clip_grad_norm: 1.0), "
                "or amp: off; the last good checkpoint was kept and no model was registered")
        self.precision.scaler.scale(terms["loss"] / accum).backward()
        return terms, value

    def step(self, batches) -> float:
        """One optimizer step over ``grad_accum`` micro-batches; returns the step's mean loss."""
        t0 = time.perf_counter()
        accum, scaler = self.settings.grad_accum, self.precision.scaler
        step_loss = 0.0
        for micro in range(accum):
            x, y = next(batches)
            # Gradients are averaged across processes once per optimizer step, not per micro-batch.
            syncing = self.ddp is None or micro == accum - 1
            with (contextlib.nullcontext() if syncing else self.ddp.no_sync()):
                terms, value = self._micro_step(x, y, accum)
            step_loss += value / accum
            for name, term in terms.items():
                self.epoch_sums[name] = self.epoch_sums.get(name, 0.0) + float(term.detach()) / accum
            self.images_seen += len(y)
        scaler.unscale_(self.optimizer)

        if self.hooks.after_backward:
            self.hooks.after_backward(self.train_model)
        if self.settings.clip_grad_norm:
            torch.nn.utils.clip_grad_norm_(self.train_model.parameters(), self.settings.clip_grad_norm)
        scale_before = scaler.get_scale() if scaler.is_enabled() else 1.0
        scaler.step(self.optimizer)
        scaler.update()
        if scaler.is_enabled() and scaler.get_scale() < scale_before:
            self.state["skipped"] += 1  # inf/nan gradients: the scaler skipped this update
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.train_time += time.perf_counter() - t0
        self.state["step"] += 1
        self.epoch_steps += 1
        return step_loss

    def end_epoch(self, epoch: int, val: BatchStream | None, progress: StepProgress) -> None:
        steps = max(1, self.epoch_steps)
        names = sorted(self.epoch_sums)  # the mean over every process's images, not rank 0's alone
        sums = dict(zip(names, self.group.sum([self.epoch_sums[k] for k in names])))
        record = {"epoch": epoch + 1, "step": self.state["step"],
                  **{("train_loss" if k == "loss" else f"train_{k}"): v / steps / self.group.world
                     for k, v in sums.items()}}
        self.epoch_sums, self.epoch_steps = {}, 0
        if val is not None:
            name = self.settings.val_metric
            with (self.hooks.evaluation or contextlib.nullcontext)():
                metrics = (self.hooks.validate or evaluate)(self.train_model, val, self.precision.autocast,
                                                           *(() if self.hooks.validate else (self.group,)))
            record.update({f"val_{k}": v for k, v in metrics.items() if k != "n"} if self.hooks.validate
                          else {"val_top1": metrics["top1"], "val_loss": metrics["loss"]})
            if metrics[name] > self.state["best_val_top1"]:
                self.state["best_val_top1"], self.state["best_epoch"] = metrics[name], epoch + 1
            progress.message(f"{self.settings.label}: epoch {epoch + 1}/{self.settings.epochs} "
                             f"loss {record.get('train_loss', float('nan')):.4f} val {name} {metrics[name]:.2f}"
                             + ("%" if name == "top1" else ""))
        self.state["history"].append(record)
        if self.hooks.on_epoch:
            self.hooks.on_epoch(record)

    def checkpoint_state(self, scaler: torch.amp.GradScaler) -> dict:
        return {"run_key": self.settings.run_key, "model": self.train_model.state_dict(),
                "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "scaler": scaler.state_dict(), "rng": rng_state(), "loop": self.state}

    def resume(self, checkpoint: dict, scaler: torch.amp.GradScaler) -> None:
        self.train_model.load_state_dict(checkpoint["model"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        self.scheduler.load_state_dict(checkpoint["scheduler"])
        scaler.load_state_dict(checkpoint["scaler"])
        restore_rng(checkpoint["rng"])
        self.state.update(checkpoint["loop"])


def fit(model: nn.Module, train: BatchStream, val: BatchStream | None, optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler, precision: Precision, settings: LoopSettings,
        hooks: Hooks | None = None, checkpoint_dir: Path | None = None, compile_model: bool = False,
        group: ProcessGroupInfo = SINGLE) -> FitResult:
    """Train ``model`` in place. Under a group of several processes (torchrun) every rank calls this
    with its shard of the data (``BatchStream(shard=...)``); rank 0 alone writes checkpoints, and
    every rank resumes from the same one."""
    hooks = hooks or Hooks()
    ddp = None
    if group.active:
        if settings.sync_batchnorm:
            to_sync_batchnorm(model)
        device = next(model.parameters()).device
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    forward_model = torch.compile(ddp or model) if compile_model else (ddp or model)
    accum = settings.grad_accum
    steps_per_epoch = len(train) // accum
    if steps_per_epoch == 0:
        raise ValueError(f"{settings.label}: {len(train)} batches per epoch is fewer than grad_accum={accum}; "
                         "lower batch_size or grad_accum")
    total_steps = steps_per_epoch * settings.epochs
    loop = _Loop(model, forward_model, optimizer, scheduler, precision, settings, hooks, total_steps, group, ddp)
    state = loop.state

    checkpoint = load_checkpoint(checkpoint_dir) if checkpoint_dir else None
    notes = []
    if checkpoint is not None and checkpoint.get("run_key") != settings.run_key:
        notes.append(f"{settings.label}: ignoring a checkpoint written with other settings")
        checkpoint = None
    if checkpoint is not None:
        loop.resume(checkpoint, precision.scaler)
        notes.append(f"{settings.label}: resumed from checkpoint at step {state['step']}/{total_steps}")
    resumed_from = state["step"]
    progress = StepProgress(settings.label, total_steps, resumed_from, heartbeat_s=settings.heartbeat_s)
    for note in notes:
        progress.message(note)

    memory = PeakMemory(next(model.parameters()).device)
    last_loss = float("nan")
    model.train()
    optimizer.zero_grad(set_to_none=True)
    try:
        while state["step"] < total_steps:
            epoch = state["step"] // steps_per_epoch
            start_batch = (state["step"] % steps_per_epoch) * accum
            batches = train.epoch(epoch, start=start_batch)
            for _ in range(start_batch // accum, steps_per_epoch):
                last_loss = loop.step(batches)
                progress.update(state["step"], loss=last_loss, lr=optimizer.param_groups[0]["lr"],
                                img_s=loop.images_seen / max(loop.train_time, 1e-9))
                at_epoch_end = state["step"] % steps_per_epoch == 0
                if at_epoch_end:
                    loop.end_epoch(epoch, val, progress)
                due = settings.checkpoint_every and state["step"] % settings.checkpoint_every == 0
                if checkpoint_dir is not None and (at_epoch_end or due) and group.is_main and _params_finite(model):
                    save_checkpoint(checkpoint_dir, loop.checkpoint_state(precision.scaler))
    finally:
        progress.close()

    group.barrier()  # no rank still reads the checkpoint when rank 0 removes it
    if group.active:
        from_sync_batchnorm(model)
    if checkpoint_dir is not None and group.is_main:
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
    peak, kind = memory.peak()
    images, seconds = group.sum([loop.images_seen, loop.train_time])
    return FitResult(
        steps=state["step"], epochs=settings.epochs, history=state["history"],
        best_val_top1=state["best_val_top1"], best_epoch=state["best_epoch"],
        # every image of every process, over the mean time a process trained
        images_per_s=images / max(seconds / group.world, 1e-9), train_time_s=loop.train_time,
        skipped_steps=state["skipped"], resumed_from_step=resumed_from, peak_memory_bytes=peak,
        peak_memory_kind=kind, effective_batch=train.batch_size * accum * group.world, final_loss=last_loss, model=model,
    )
