"""``kind: model``: the model the user already trained, as the run's first artifact.

A pipeline whose model section gives trained weights (``model.weights``) or an ONNX file
(``model.onnx``) starts from that model instead of training one: this stage, added in front
of the pipeline's stages under the name ``model``, loads it, checks that it fits the data,
measures it on the test split through the same evaluation as every later artifact (it is the
red line's baseline) and saves it as ``model.model``. Any stage may name it in ``inputs:``.

Where a model learned is unknown to this run, so its record says so (``origin.training_data:
unknown``); the bench report and model card repeat it beside every accuracy unless the user
declared ``data.independent_test``. See ``compress.stages.provenance``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
from pydantic import Field

from compress.config import ModelConfig, StageConfig
from compress.errors import ConfigError
from compress.stages.base import InputArtifact, Output, Stage, StageContext, StageResult
from compress.stages.int8_records import split_arrays
from compress.stages.model_source import model_from_config, model_meta, source_digests
from compress.stages.onnx_import import import_onnx
from compress.stages.provenance import origin_record
from compress.stages.training_run import TrainingSettings, headline, test_accuracy, test_metrics
from train.head_transfer import Transfer
from train.model_io import save_model
from train.models import count_macs, count_params

NAME = "model"  # the stage's name in a pipeline, and so its artifact's: model.model


class ModelSourceConfig(StageConfig):
    kind: Literal["model"] = Field("model", description="bring a model in: the pipeline's model (weights or a "
                                                        "callable), an ONNX file, or another run's artifact")


class ModelStage(Stage):
    kind = "model"
    Config = ModelSourceConfig
    produces = ("model",)
    deployable = ("model",)
    uses = ("seed", "data", "model")

    def run(self, ctx: StageContext, inputs: dict[str, InputArtifact]) -> StageResult:
        cfg: ModelConfig = ctx.pipeline.model
        if not cfg.given:
            raise ConfigError(f"stage {ctx.name!r} (model) starts from a trained model: set model.weights (a state "
                              "dict of model.name) or model.onnx (an ONNX file)")
        data = ctx.data
        origin = origin_record(cfg, source_digests(cfg), ctx.pipeline.data)
        if ctx.pipeline.data.mean is None:
            ctx.log("data.mean/std are not set, so the inputs are normalised with the train split's own mean and "
                    "std; a model trained elsewhere expects the normalisation it was trained with (ImageNet "
                    "weights: mean [0.485, 0.456, 0.406], std [0.229, 0.224, 0.225]): set data.mean and data.std",
                    style="yellow")
        if cfg.onnx:
            return self._onnx(ctx, cfg, origin)
        torch.manual_seed(ctx.pipeline.seed)
        model, description = model_from_config(cfg, data)
        model.eval()
        description["origin"] = origin
        transfer = description.get("transfer")
        if transfer:
            made = Transfer.from_record(transfer)
            ctx.log(f"{cfg.weights}: every tensor loaded but the classifier's ({made.classifier!r}, re-made for the data's "
                    f"{data.num_classes} classes, as logged above); until a train stage trains it, this model's "
                    "accuracy is chance", style="yellow")
        test = test_accuracy(data, model, TrainingSettings())
        metrics = {**test_metrics(test), "params": count_params(model), "macs": count_macs(model, data.input_shape),
                   "origin": origin}
        ctx.log(f"{cfg.name} from {cfg.weights}: {metrics['params']:,} params, {metrics['macs'] / 1e6:,.1f} M MACs, "
                f"{headline(metrics)} ({len(data.test)} images; test images: "
                f"{origin['test_independence']})")
        with ctx.atomic_output_dir("model") as folder:
            save_model(model.to("cpu", memory_format=torch.contiguous_format), folder, description)
        metrics["summary"] = f"{cfg.name} weights, {headline(metrics)} (training data unknown)"
        return StageResult(outputs=[Output("model", "torch-model", ctx.stage_dir / "model",
                                           meta=model_meta(metrics, description))], metrics=metrics)

    def _onnx(self, ctx: StageContext, cfg: ModelConfig, origin: dict) -> StageResult:
        data = ctx.data
        source = Path(cfg.onnx or "")
        test_x, test_y = split_arrays(data, "test")
        with ctx.atomic_output_dir("model") as folder:
            imported = import_onnx(source, folder, data, ctx, origin, test_x, test_y)
        meta = {**imported.meta, "origin": origin}
        ctx.log(f"ONNX {source.name}: input {imported.meta['input_name']} {imported.shape}, opset "
                f"{imported.meta['opset']}, {imported.meta['params']:,} params, test top1 "
                f"{imported.test['top1']:.2f}% ({len(test_y)} images; test images: {origin['test_independence']})")
        metrics = {**test_metrics(imported.test), "params": imported.meta["params"], "origin": origin,
                   "summary": f"ONNX {source.name}, test top1 {imported.test['top1']:.2f}% (training data unknown)"}
        return StageResult(outputs=[Output("model", "onnx", ctx.stage_dir / "model", meta=meta)], metrics=metrics)

