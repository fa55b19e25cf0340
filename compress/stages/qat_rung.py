"""The ladder's last rung: fake-quantized finetuning with the project's loop, then a Q/DQ ONNX.

Kept apart from the algorithm (``qat_pt2e``) because this part needs the pipeline: the
training settings, the run's seed and data, distillation from the float model, progress.
"""
from __future__ import annotations

from pathlib import Path

import torch
from pydantic import Field
from torch import nn

from compress.distillation.loss import DistillSettings
from compress.errors import ConfigError, StageError
from compress.quantization.qat_pt2e import convert, freeze_ranges, observe, observers_paused, prepare
from compress.stages.base import StageContext
from compress.stages.training_run import BatchNormSettings, TrainingSettings, refresh_batchnorm, run_training, teacher_loss
from export.onnx_export import ExportError, export_onnx
from train.loop import Hooks


class QATSettings(TrainingSettings):
    enabled: bool = Field(True, description="climb to QAT when PTQ and the fallback miss the red line")
    epochs: int = Field(2, ge=1, description="passes over the train split with fake quantization")
    lr: float = Field(1e-4, gt=0, le=10, description="low: the weights only adapt to the quantization grid")
    weight_decay: float = Field(0.0, ge=0, description="none by default: decay would pull weights off the grid")
    warmup_epochs: float = Field(0.0, ge=0, description="epochs of linear warm-up (the weights start trained)")
    amp: str = Field("off", description="fake quantization runs in fp32")  # type: ignore[assignment]
    freeze_ranges_epoch: int | None = Field(None, ge=0, description="stop range updates from this epoch "
                                            "(0-based); default: the last epoch")
    distill: DistillSettings | None = Field(None, description="distil from the float model, e.g. {teacher: train}")
    batchnorm: BatchNormSettings = Field(default_factory=BatchNormSettings, description="BatchNorm statistics "
                                         "re-estimated after QAT, the quantization ranges held")


def run_qat(ctx: StageContext, model: nn.Module, cfg: QATSettings, calib: torch.Tensor, out: Path, field: str,
            teacher: nn.Module | None = None) -> dict:
    """Train a fake-quantized copy of ``model`` and write its symmetric-int8 Q/DQ ONNX to ``out``."""
    if cfg.amp not in ("off", "auto"):
        raise ConfigError(f"{field}.amp: QAT runs fake quantization in fp32; use amp: off")
    cfg = cfg.model_copy(update={"amp": "off", "channels_last": False, "compile": False})
    sample = calib[:1].repeat(2, 1, 1, 1)  # a batch of 2: a batch of 1 would pin the batch dimension
    prepared = prepare(model, sample)  # QATUnavailable: the caller keeps the rungs it already has
    observe(prepared, calib)  # ranges start from the calibration split, as the PTQ rung's did
    freeze_at = cfg.epochs - 1 if cfg.freeze_ranges_epoch is None else cfg.freeze_ranges_epoch
    if freeze_at == 0:
        freeze_ranges(prepared)

    def on_epoch(record: dict) -> None:
        if record["epoch"] == freeze_at:  # epochs completed so far
            freeze_ranges(prepared)

    hooks = Hooks(on_epoch=on_epoch, evaluation=lambda: observers_paused(prepared))
    if cfg.distill is not None and teacher is not None:
        d = cfg.distill
        hooks.loss = teacher_loss(teacher, cfg, d, f"{field}.distill")
        ctx.log(f"qat distils from {d.teacher} (T={d.temperature:g}, α={d.alpha:g})")
    run = run_training(ctx, prepared, cfg, field=field, label=f"{ctx.name}.qat", hooks=hooks,
                       checkpoint_dir=ctx.stage_dir / "checkpoints-qat")
    with observers_paused(prepared):
        refresh_batchnorm(ctx, prepared, cfg.batchnorm, cfg, "after QAT", run.device)
    prepared.to("cpu")
    converted = convert(prepared)
    try:
        export_onnx(converted, sample.float().cpu(), out, captured=True)
    except ExportError as exc:
        raise StageError(f"{field}: the QAT model did not export to ONNX: {exc}") from exc
    return {"qat": {"epochs": cfg.epochs, "lr": cfg.lr, "optimizer": cfg.optimizer, "freeze_ranges_epoch": freeze_at,
                    "distill": cfg.distill.model_dump() if cfg.distill else None,
                    "best_val_top1_fake_quant": run.metrics["best_val_top1"],
                    "precision": run.metrics["precision"], "precision_reason": run.metrics["precision_reason"],
                    "train_time_s": run.metrics["train_time_s"],
                    "engine": "torchao PT2E (prepare_qat_pt2e → convert_pt2e), x86 quantizer without conv-add "
                              "fusion, symmetric int8"}}
