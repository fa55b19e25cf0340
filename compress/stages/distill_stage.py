"""``kind: distill``: train a student against a frozen teacher with the KL-temperature loss."""
from __future__ import annotations

import json
from typing import Literal

import torch
from pydantic import Field
from torch import nn

from compress.config import ModelConfig, StageConfig
from compress.distillation.loss import LossSettings, check_pair
from compress.errors import ConfigError
from compress.stages.base import InputArtifact, Output, Stage, StageContext, StageResult
from compress.stages.model_source import model_from_artifact, model_from_config, model_meta, trained_on
from compress.stages.training_run import (BatchNormSettings, Distributable, TrainingSettings, headline,
                                          refresh_batchnorm, resolve_device, run_training, stop_if_collapsed,
                                          teacher_loss, test_accuracy, test_metrics, val_score)
from train.loop import Hooks
from train.model_io import save_model
from train.models import ModelError, build_model, count_macs, count_params, load_weights


class ExternalTeacher(ModelConfig):
    """A model section whose weights are required: a teacher must already know the task."""

    name: str = Field(..., description="package.module:callable (or any registry name)")
    weights: str = Field(..., description="local state dict, read with weights_only=True or as safetensors")


class DistillConfig(StageConfig, TrainingSettings, LossSettings, Distributable):
    kind: Literal["distill"] = Field("distill", description="train a student from a teacher's softened outputs")
    teacher: str | None = Field(None, description="an earlier stage or artifact; default: the trained baseline")
    external_teacher: ExternalTeacher | None = Field(None, description="a teacher from outside the run (a model "
                                                                       "file), instead of teacher")
    student: ModelConfig | None = Field(None, description="build a fresh student; default: the latest earlier model")
    batchnorm: BatchNormSettings = Field(default_factory=BatchNormSettings, description="BatchNorm statistics "
                                         "re-estimated after the training")


class DistillStage(Stage):
    kind = "distill"
    Config = DistillConfig
    input_roles = ("model", "teacher")
    produces = ("model", "history")
    deployable = ("model",)
    default_teacher = True
    distributable = True
    uses = ("seed", "data", "model", "red_line")  # the collapse guard reads red_line.collapse_margin

    @classmethod
    def config_refs(cls, config: DistillConfig) -> dict[str, str]:  # type: ignore[override]
        return {"teacher": config.teacher} if config.teacher else {}

    def run(self, ctx: StageContext, inputs: dict[str, InputArtifact]) -> StageResult:
        cfg: DistillConfig = self.config  # type: ignore[assignment]
        field, data = f"stages.{ctx.name}", ctx.data
        torch.manual_seed(ctx.pipeline.seed)
        teacher, teacher_desc, teacher_name = self._teacher(ctx, cfg, inputs, field)
        if cfg.student is not None:
            student, description = model_from_config(cfg.student, data)
            student_name = cfg.student.name
        elif "model" in inputs:
            student, description = model_from_artifact(inputs["model"], data)
            student_name = inputs["model"].name
        else:
            raise ConfigError(f"{field}: no student: set student: {{name: ...}} or add a stage that makes a model")
        check_pair(teacher_desc, description, teacher_name, student_name)
        loss = teacher_loss(teacher, cfg, cfg, field, data, student)
        ctx.log(f"student {student_name} ({count_params(student):,} params) from teacher {teacher_name} "
                f"({count_params(teacher):,} params), T={cfg.temperature:g}, α={cfg.alpha:g}")
        # a student that is an earlier stage's model is judged against itself: distillation must not break it
        judged = cfg.student is None and data.meaningful_accuracy
        before = val_score(student, data, cfg, resolve_device(cfg.device), ctx.group) if judged else None
        run = run_training(ctx, student, cfg, field=field, label=ctx.name, hooks=Hooks(loss=loss),
                           checkpoint_dir=ctx.stage_dir / "checkpoints")
        refresh_batchnorm(ctx, student, cfg.batchnorm, cfg, "after the distillation", run.device)
        if before is not None:
            metric, after = val_score(student, data, cfg, run.device, ctx.group)
            stop_if_collapsed(ctx, metric, before[1], after, f"distilled {cfg.epochs} epochs from {teacher_name}",
                              "Try a lower lr, more epochs, or a teacher closer to the student.")
        test = test_accuracy(ctx.data, student, cfg, run)
        metrics = {**run.metrics, **test_metrics(test),
                   "params": count_params(student), "macs": count_macs(student, data.input_shape),
                   "temperature": cfg.temperature, "alpha": cfg.alpha, "teacher": teacher_name,
                   "loss_parts": [{k: round(v, 5) for k, v in r.items() if k.startswith("train_") or k == "epoch"}
                                  for r in run.result.history]}
        metrics["summary"] = f"student {headline(metrics)} (T={cfg.temperature:g}, α={cfg.alpha:g})"
        ctx.log(f"student {headline(metrics)}")
        description["training"] = {"stage": ctx.name, **{k: metrics[k] for k in ("test_top1", "test_map") if k in metrics},
                                   "distilled_from": teacher_name}
        with ctx.atomic_output_dir("model") as folder:
            save_model(student.to("cpu", memory_format=torch.contiguous_format), folder,
                       trained_on(description, data))
        with ctx.atomic_output_dir("history") as folder:
            (folder / "history.json").write_text(json.dumps(run.result.history, indent=2))
        return StageResult(outputs=[Output("model", "torch-model", ctx.stage_dir / "model",
                                           meta=model_meta(metrics, description)),
                                    Output("history", "report", ctx.stage_dir / "history")], metrics=metrics)

    def _teacher(self, ctx: StageContext, cfg: DistillConfig, inputs: dict[str, InputArtifact],
                 field: str) -> tuple[nn.Module, dict, str]:
        data = ctx.data
        if cfg.external_teacher is not None:
            ext = cfg.external_teacher
            try:
                teacher = build_model(ext.name, data.num_classes, data.input_shape[0], ext.args)
                load_weights(teacher, ext.weights)
            except ModelError as exc:
                raise ConfigError(f"{field}.external_teacher: {exc}") from exc
            desc = {"architecture": {"num_classes": data.num_classes}, "preprocessing": data.preprocessing()}
            return teacher, desc, ext.name
        if "teacher" not in inputs:
            raise ConfigError(f"{field}: no teacher: set teacher: <stage> or external_teacher, or add a train stage")
        teacher, desc = model_from_artifact(inputs["teacher"], data)
        return teacher, desc, inputs["teacher"].name
