"""``kind: train``: the AMP training loop as a pipeline stage."""
from __future__ import annotations

import json
from typing import Literal

import torch
from pydantic import Field

from compress.config import StageConfig
from compress.errors import ConfigError
from compress.stages.base import InputArtifact, Output, Stage, StageContext, StageResult
from compress.stages.model_source import model_from_artifact, model_from_config, model_meta, trained_on
from compress.stages.training_run import (Distributable, TrainingSettings, headline, run_training,
                                          test_accuracy, test_metrics)
from train.head_transfer import HeadMismatch, classifier_name, freeze_all_but
from train.loop import Hooks
from train.model_io import save_model
from train.models import count_macs, count_params
from train.tasks import task_of


class TrainConfig(StageConfig, TrainingSettings, Distributable):
    kind: Literal["train"] = Field("train", description="train (or finetune) the model on the data")
    tensorboard: bool = Field(False, description="write TensorBoard scalars to the stage folder")
    freeze_backbone_epochs: int = Field(0, ge=0, description="epochs that train only the classifier, the rest of the "
                                        "model frozen, before the `epochs` that train everything (linear probing, then "
                                        "finetuning): a classifier re-made for pretrained weights (model.head) would "
                                        "otherwise send random gradients into the pretrained features")


class TrainStage(Stage):
    kind = "train"
    Config = TrainConfig
    input_roles = ("model",)
    produces = ("model", "history")
    deployable = ("model",)
    distributable = True

    def run(self, ctx: StageContext, inputs: dict[str, InputArtifact]) -> StageResult:
        cfg: TrainConfig = self.config  # type: ignore[assignment]
        data = ctx.data
        torch.manual_seed(ctx.pipeline.seed)
        model, description = (model_from_artifact(inputs["model"], data) if "model" in inputs
                              else model_from_config(ctx.pipeline.model, data))
        ctx.log(f"{type(model).__name__} ({count_params(model):,} params), {len(data.train)} train images")
        asked = f"stages.{ctx.name}.tensorboard" if cfg.tensorboard else \
            "tracking.tensorboard" if ctx.pipeline.tracking.tensorboard else None
        hooks = Hooks(on_epoch=_tensorboard_logger(ctx, asked) if asked and ctx.is_main else None)
        head_run = self._head_first(ctx, cfg, model)
        run = run_training(ctx, model, cfg, field=f"stages.{ctx.name}", label=ctx.name, hooks=hooks,
                           checkpoint_dir=ctx.stage_dir / "checkpoints")
        test = test_accuracy(ctx.data, model, cfg, run)
        metrics = {**run.metrics, **test_metrics(test),
                   "params": count_params(model), "macs": count_macs(model, data.input_shape)}
        if head_run is not None:
            metrics["head_first"] = {"epochs": cfg.freeze_backbone_epochs, **{
                k: v for k, v in head_run.metrics.items() if k.startswith("best_val_") or k == "train_time_s"}}
        if not data.meaningful_accuracy:
            metrics["accuracy_meaningless"] = "synthetic data: random images and labels, so this accuracy is meaningless"
            ctx.log("synthetic data: the accuracy below is meaningless (use it for latency only)", style="yellow")
        best = f"best_val_{task_of(data).val_metric}"
        ctx.log(f"{headline(metrics)} (best val {metrics[best]:.2f} at epoch "
                f"{metrics['best_epoch']}), {metrics['images_per_s']:,.0f} img/s, "
                f"{metrics['amp_skipped_steps']} AMP-skipped steps")

        description["training"] = {"stage": ctx.name, **{k: metrics[k] for k in ("test_top1", "test_map", "test_miou") if k in metrics},
                                   "precision": metrics["precision"]}
        with ctx.atomic_output_dir("model") as folder:
            save_model(model.to("cpu", memory_format=torch.contiguous_format), folder,
                       trained_on(description, data))
        with ctx.atomic_output_dir("history") as folder:
            # the head-only epochs' curves under their own names (head.val_top1), as the prune stage's phases are
            history = ([{"epoch": row["epoch"], **{f"head.{k}": v for k, v in row.items() if k not in ("epoch", "step")}}
                        for row in head_run.result.history] if head_run else []) + run.result.history
            (folder / "history.json").write_text(json.dumps(history, indent=2))
        return StageResult(
            outputs=[Output("model", "torch-model", ctx.stage_dir / "model", meta=model_meta(metrics, description)),
                     Output("history", "report", ctx.stage_dir / "history")],
            metrics=metrics,
        )


    @staticmethod
    def _head_first(ctx: StageContext, cfg: TrainConfig, model):
        """``freeze_backbone_epochs`` that train the classifier alone, before the stage's epochs train everything.
        Only parameters are frozen: the backbone's BatchNorm statistics follow the new data in these epochs too."""
        n = cfg.freeze_backbone_epochs
        if n == 0:
            return None
        field = f"stages.{ctx.name}.freeze_backbone_epochs"
        try:
            head = classifier_name(model, ctx.pipeline.model.classifier)
        except HeadMismatch as exc:
            raise ConfigError(f"{field}: {exc}") from exc
        frozen = freeze_all_but(model, head)
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        ctx.log(f"{n} epoch{'s' if n != 1 else ''} train only the classifier {head!r} ({trainable:,} of {count_params(model):,} params), "
                f"then {cfg.epochs} everything")
        try:
            return run_training(ctx, model, cfg.model_copy(update={"epochs": n}), field=f"stages.{ctx.name}",
                                label=f"{ctx.name}.head", hooks=Hooks(), checkpoint_dir=ctx.stage_dir / "checkpoints-head")
        finally:
            for param in frozen:
                param.requires_grad_(True)


def _tensorboard_logger(ctx: StageContext, field: str):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise ConfigError(f"{field}: true needs the tensorboard package (pip install tensorboard)") from exc
    writer = SummaryWriter(log_dir=str(ctx.stage_dir / "tensorboard"))

    def log(record: dict) -> None:
        for key, value in record.items():
            if key not in ("epoch", "step"):
                writer.add_scalar(key, value, record["step"])
        writer.flush()

    return log
