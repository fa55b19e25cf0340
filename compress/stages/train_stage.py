"""``kind: train``: the AMP training loop as a pipeline stage."""
from __future__ import annotations

import json
from typing import Literal

import torch
from pydantic import Field, field_validator

from compress.config import StageConfig, Strict
from compress.errors import ConfigError, StageError
from compress.model_source import model_from_artifact, model_from_config
from compress.stages.base import InputArtifact, Output, Stage, StageContext, StageResult
from train.activation_checkpointing import checkpoint_blocks
from train.data import Augment, BatchStream
from train.evaluate import evaluate
from train.loop import Hooks, LoopSettings, NonFiniteLoss, fit
from train.model_io import save_model
from train.models import count_macs, count_params
from train.optim import lr_factor, make_optimizer, make_scheduler
from train.precision import make_precision


class AugmentConfig(Strict):
    pad: int = Field(2, ge=0, le=16, description="random shift by up to this many pixels")
    hflip: bool = Field(False, description="random horizontal flips (not for digits)")


class TrainConfig(StageConfig):
    kind: Literal["train"] = "train"
    epochs: int = Field(8, ge=1)
    batch_size: int = Field(128, ge=1)
    eval_batch_size: int = Field(512, ge=1)
    optimizer: Literal["adamw", "sgd"] = "adamw"
    lr: float = Field(2e-3, gt=0, le=10)
    weight_decay: float = Field(0.05, ge=0)
    momentum: float = Field(0.9, ge=0, lt=1)
    schedule: Literal["cosine", "wsd", "step", "constant"] = "cosine"
    warmup_epochs: float = Field(0.5, ge=0)
    decay_fraction: float = Field(0.2, gt=0, le=1, description="wsd: share of steps spent decaying")
    milestones: list[float] = Field([0.5, 0.75], description="step: fractions of training where lr drops")
    gamma: float = Field(0.1, gt=0, le=1, description="step: lr factor at each milestone")
    grad_accum: int = Field(1, ge=1)
    clip_grad_norm: float | None = Field(None, gt=0)
    label_smoothing: float = Field(0.0, ge=0, lt=1)
    amp: Literal["auto", "off", "bf16", "fp16"] = "auto"
    channels_last: bool = False
    compile: bool = False
    checkpoint_blocks: list[str] = Field(default_factory=list, description="modules to run with activation checkpointing")
    checkpoint_every: int = Field(100, ge=0, description="optimizer steps between resumable checkpoints")
    augment: AugmentConfig = Field(default_factory=AugmentConfig)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    tensorboard: bool = False
    heartbeat_s: float = Field(30.0, gt=0)

    @field_validator("amp", mode="before")
    @classmethod
    def _yaml_off(cls, value):
        # YAML 1.1 reads a bare `off` as false; that is what the user meant.
        return "off" if value is False else value


class TrainStage(Stage):
    kind = "train"
    Config = TrainConfig
    input_roles = ("model",)
    produces = ("model", "history")
    deployable = ("model",)

    def run(self, ctx: StageContext, inputs: dict[str, InputArtifact]) -> StageResult:
        cfg: TrainConfig = self.config  # type: ignore[assignment]
        device = _device(cfg.device)
        data = ctx.data
        torch.manual_seed(ctx.pipeline.seed)
        model, description = (model_from_artifact(inputs["model"], data) if "model" in inputs
                              else model_from_config(ctx.pipeline.model, data))
        if device.type == "cuda":
            torch.backends.cudnn.benchmark = True
        model = model.to(device, memory_format=torch.channels_last if cfg.channels_last else torch.preserve_format)
        if cfg.checkpoint_blocks:
            try:
                checkpoint_blocks(model, cfg.checkpoint_blocks)
            except ValueError as exc:
                raise ConfigError(f"stages.{ctx.name}.{exc}") from exc

        stream_args = dict(seed=ctx.pipeline.seed, device=device, channels_last=cfg.channels_last)
        train = BatchStream(data.train, data, cfg.batch_size, shuffle=True, drop_last=True,
                            augment=Augment(cfg.augment.pad, cfg.augment.hflip), **stream_args)
        val = BatchStream(data.val, data, cfg.eval_batch_size, shuffle=False, drop_last=False, **stream_args)
        test = BatchStream(data.test, data, cfg.eval_batch_size, shuffle=False, drop_last=False, **stream_args)
        steps_per_epoch = len(train) // cfg.grad_accum
        if steps_per_epoch == 0:
            raise ConfigError(f"stages.{ctx.name}.batch_size: {cfg.batch_size} × grad_accum {cfg.grad_accum} is more "
                              f"than the {len(data.train)} training images; lower it")
        total = steps_per_epoch * cfg.epochs
        precision = make_precision(cfg.amp, device)
        optimizer = make_optimizer(model, cfg.optimizer, cfg.lr, cfg.weight_decay, cfg.momentum)
        scheduler = make_scheduler(optimizer, lr_factor(
            cfg.schedule, total, int(cfg.warmup_epochs * steps_per_epoch), cfg.decay_fraction, tuple(cfg.milestones), cfg.gamma))
        ctx.log(f"{type(model).__name__} ({count_params(model):,} params) on {device}, {precision.name}, "
                f"{len(data.train)} train images, {cfg.epochs} epochs × {steps_per_epoch} steps")

        hooks = Hooks(on_epoch=_tensorboard_logger(ctx) if cfg.tensorboard else None)
        settings = LoopSettings(epochs=cfg.epochs, grad_accum=cfg.grad_accum, clip_grad_norm=cfg.clip_grad_norm,
                                label_smoothing=cfg.label_smoothing, checkpoint_every=cfg.checkpoint_every,
                                label=ctx.name, heartbeat_s=cfg.heartbeat_s, run_key=ctx.cache_key)
        try:
            result = fit(model, train, val, optimizer, scheduler, precision, settings, hooks,
                         checkpoint_dir=ctx.stage_dir / "checkpoints", compile_model=cfg.compile)
        except NonFiniteLoss as exc:
            raise StageError(str(exc)) from exc

        test_metrics = evaluate(model, test, precision.autocast)
        metrics = {
            "best_val_top1": round(result.best_val_top1, 3), "best_epoch": result.best_epoch,
            "test_top1": round(test_metrics["top1"], 3), "test_top5": round(test_metrics["top5"], 3),
            "images_per_s": round(result.images_per_s, 1), "train_time_s": round(result.train_time_s, 2),
            "peak_memory_mb": round(result.peak_memory_bytes / 2**20, 1), "peak_memory_kind": result.peak_memory_kind,
            "precision": precision.name, "device": str(device), "epochs": cfg.epochs, "steps": result.steps,
            "effective_batch": result.effective_batch, "amp_skipped_steps": result.skipped_steps,
            "resumed_from_step": result.resumed_from_step, "params": count_params(model),
            "macs": count_macs(model, data.input_shape),
        }
        if not data.meaningful_accuracy:
            metrics["accuracy_meaningless"] = "synthetic data: random images and labels, so this accuracy is meaningless"
            ctx.log("synthetic data: the accuracy below is meaningless (use it for latency only)", style="yellow")
        ctx.log(f"test top1 {metrics['test_top1']:.2f}% (best val {metrics['best_val_top1']:.2f}% at epoch "
                f"{result.best_epoch}), {metrics['images_per_s']:,.0f} img/s, {result.skipped_steps} AMP-skipped steps")

        description["training"] = {"stage": ctx.name, "test_top1": metrics["test_top1"], "precision": precision.name}
        with ctx.atomic_output_dir("model") as folder:
            save_model(model.to("cpu", memory_format=torch.contiguous_format), folder, description)
        with ctx.atomic_output_dir("history") as folder:
            (folder / "history.json").write_text(json.dumps(result.history, indent=2))
        return StageResult(
            outputs=[Output("model", "torch-model", ctx.stage_dir / "model",
                            meta={"params": metrics["params"], "macs": metrics["macs"], "test_top1": metrics["test_top1"],
                                  "preprocessing": description["preprocessing"]}),
                     Output("history", "report", ctx.stage_dir / "history")],
            metrics=metrics,
        )


def _device(choice: str) -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: cuda was asked for but torch sees no CUDA device; use device: auto or cpu")
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(choice)


def _tensorboard_logger(ctx: StageContext):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise ConfigError(f"stages.{ctx.name}.tensorboard: true needs the tensorboard package (pip install tensorboard)") from exc
    writer = SummaryWriter(log_dir=str(ctx.stage_dir / "tensorboard"))

    def log(record: dict) -> None:
        for key, value in record.items():
            if key not in ("epoch", "step"):
                writer.add_scalar(key, value, record["step"])
        writer.flush()

    return log
