"""The training loop every stage reuses: AMP, accumulation, clipping, checkpoint/resume.

Stages change its behaviour only through ``Hooks`` (a replacement loss such as
distillation, extra loss terms, a post-backward gradient hook such as the BN-sparsity
penalty, a model wrapper such as QAT), never by forking it. Precision arrives as an
autocast factory and a scaler, so the loop has a single code path.
"""
from __future__ import annotations

import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

from train.checkpoint import load_checkpoint, restore_rng, rng_state, save_checkpoint
from train.data import BatchStream
from train.evaluate import evaluate
from train.memory import PeakMemory
from train.precision import Precision
from train.progress import StepProgress

LossFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], dict[str, torch.Tensor]]


class NonFiniteLoss(RuntimeError):
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
    keep_checkpoint: bool = False


@dataclass
class Hooks:
    loss: LossFn | None = None  # replaces cross-entropy; returns {"loss": total, **parts}
    extra_losses: list[LossFn] = field(default_factory=list)  # each returns named terms added to the loss
    after_backward: Callable[[nn.Module], None] | None = None  # gradients are unscaled here
    wrap_model: Callable[[nn.Module], nn.Module] | None = None
    on_epoch: Callable[[dict], None] | None = None  # receives each epoch's record (loss, val accuracy)


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


def fit(model: nn.Module, train: BatchStream, val: BatchStream | None, optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler, precision: Precision, settings: LoopSettings,
        hooks: Hooks | None = None, checkpoint_dir: Path | None = None, compile_model: bool = False) -> FitResult:
    hooks = hooks or Hooks()
    train_model = hooks.wrap_model(model) if hooks.wrap_model else model
    forward_model = torch.compile(train_model) if compile_model else train_model
    accum = settings.grad_accum
    steps_per_epoch = len(train) // accum
    if steps_per_epoch == 0:
        raise ValueError(f"{settings.label}: {len(train)} batches per epoch is fewer than grad_accum={accum}; "
                         "lower batch_size or grad_accum")
    total_steps = steps_per_epoch * settings.epochs
    scaler = precision.scaler
    state = {"step": 0, "skipped": 0, "history": [], "best_val_top1": -1.0, "best_epoch": -1}

    checkpoint = load_checkpoint(checkpoint_dir) if checkpoint_dir else None
    notes = []
    if checkpoint is not None and checkpoint.get("run_key") != settings.run_key:
        notes.append(f"{settings.label}: ignoring a checkpoint written with other settings")
        checkpoint = None
    if checkpoint is not None:
        train_model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])
        scaler.load_state_dict(checkpoint["scaler"])
        restore_rng(checkpoint["rng"])
        state.update(checkpoint["loop"])
        notes.append(f"{settings.label}: resumed from checkpoint at step {state['step']}/{total_steps}")
    progress = StepProgress(settings.label, total_steps, state["step"], heartbeat_s=settings.heartbeat_s)
    for note in notes:
        progress.message(note)
    resumed_from = state["step"]

    def write_checkpoint() -> None:
        if checkpoint_dir is None or not _params_finite(train_model):
            return
        save_checkpoint(checkpoint_dir, {
            "run_key": settings.run_key, "model": train_model.state_dict(), "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(), "rng": rng_state(), "loop": state,
        })

    memory = PeakMemory(next(model.parameters()).device)
    images_seen, train_time, last_loss = 0, 0.0, float("nan")
    train_model.train()
    optimizer.zero_grad(set_to_none=True)
    try:
        while state["step"] < total_steps:
            epoch = state["step"] // steps_per_epoch
            start_batch = (state["step"] % steps_per_epoch) * accum
            batches = train.epoch(epoch, start=start_batch)
            epoch_loss, epoch_steps = 0.0, 0
            for _ in range(start_batch // accum, steps_per_epoch):
                t0 = time.perf_counter()
                step_loss = 0.0
                for _ in range(accum):
                    x, y = next(batches)
                    with precision.autocast():
                        logits = forward_model(x)
                        terms = (hooks.loss(x, logits, y) if hooks.loss
                                 else {"loss": F.cross_entropy(logits.float(), y, label_smoothing=settings.label_smoothing)})
                        for extra in hooks.extra_losses:
                            added = extra(x, logits, y)
                            terms["loss"] = terms["loss"] + sum(added.values())
                    loss = terms["loss"]
                    value = loss.item()
                    if not math.isfinite(value):
                        raise NonFiniteLoss(
                            f"{settings.label}: loss became {value} at step {state['step'] + 1}/{total_steps} "
                            f"(precision {precision.name}). Try a lower lr, gradient clipping (clip_grad_norm: 1.0), "
                            "or amp: off; the last good checkpoint was kept and no model was registered")
                    scaler.scale(loss / accum).backward()
                    step_loss += value / accum
                    images_seen += len(y)
                scaler.unscale_(optimizer)
                if hooks.after_backward:
                    hooks.after_backward(train_model)
                if settings.clip_grad_norm:
                    torch.nn.utils.clip_grad_norm_(train_model.parameters(), settings.clip_grad_norm)
                scale_before = scaler.get_scale() if scaler.is_enabled() else 1.0
                scaler.step(optimizer)
                scaler.update()
                if scaler.is_enabled() and scaler.get_scale() < scale_before:
                    state["skipped"] += 1  # inf/nan gradients: the scaler skipped this update
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                train_time += time.perf_counter() - t0
                state["step"] += 1
                epoch_loss += step_loss
                epoch_steps += 1
                last_loss = step_loss
                progress.update(state["step"], loss=step_loss, lr=optimizer.param_groups[0]["lr"],
                                img_s=images_seen / max(train_time, 1e-9))
                at_epoch_end = state["step"] % steps_per_epoch == 0
                if at_epoch_end:
                    record = {"epoch": epoch + 1, "step": state["step"], "train_loss": epoch_loss / max(1, epoch_steps)}
                    if val is not None:
                        metrics = evaluate(train_model, val, precision.autocast)
                        record.update(val_top1=metrics["top1"], val_loss=metrics["loss"])
                        if metrics["top1"] > state["best_val_top1"]:
                            state["best_val_top1"], state["best_epoch"] = metrics["top1"], epoch + 1
                        progress.message(f"{settings.label}: epoch {epoch + 1}/{settings.epochs} "
                                         f"loss {record['train_loss']:.4f} val top1 {metrics['top1']:.2f}%")
                    state["history"].append(record)
                    if hooks.on_epoch:
                        hooks.on_epoch(record)
                if at_epoch_end or (settings.checkpoint_every and state["step"] % settings.checkpoint_every == 0):
                    write_checkpoint()
    finally:
        progress.close()

    if checkpoint_dir is not None and not settings.keep_checkpoint:
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
    peak, kind = memory.peak()
    return FitResult(
        steps=state["step"], epochs=settings.epochs, history=state["history"],
        best_val_top1=state["best_val_top1"], best_epoch=state["best_epoch"],
        images_per_s=images_seen / max(train_time, 1e-9), train_time_s=train_time,
        skipped_steps=state["skipped"], resumed_from_step=resumed_from, peak_memory_bytes=peak,
        peak_memory_kind=kind, effective_batch=train.batch_size * accum, final_loss=last_loss, model=train_model,
    )
