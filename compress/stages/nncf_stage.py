"""``kind: nncf``: NNCF post-training quantization, as an OpenVINO user does it by hand.

The float model is exported to ONNX as the export and quantize stages export it, quantized by
``nncf.quantize`` on calibration images (the calib split, never the test split), checked, and
written as ``<stage>.onnx``: the reference the pipeline's own INT8 file is compared against in
the same bench, and one more INT8 candidate the gate may choose. Its validation accuracy is
recorded next to the float file's; the bench's gate judges it on the test split.
"""
from __future__ import annotations

import shutil
from typing import Literal

import onnx
import torch
from pydantic import Field

from compress.config import StageConfig
from compress.errors import ConfigError
from compress.quantization.task_int8 import INT8
from train.tasks import task_of
from compress.quantization.nncf_ptq import NNCFSettings, NNCFUnavailable, compare_on_split, nncf_version, quantize_onnx
from compress.stages.base import InputArtifact, Output, Stage, StageContext, StageResult
from compress.stages.int8_records import input_onnx, split_arrays
from compress.stages.model_source import model_from_artifact, onnx_description
from compress.stages.onnx_labels import label_onnx
from export.onnx_export import export_onnx

METHOD = "nncf-ptq"


class NNCFConfig(StageConfig):
    kind: Literal["nncf"] = Field("nncf", description="NNCF's post-training INT8 of a model, as an OpenVINO user "
                                                      "makes it by hand: one more candidate for the bench")
    samples: int = Field(300, ge=1, description="calibration images (NNCF's subset_size), from the calib split; "
                                                "left unset, at most data.calib_size of them")
    preset: Literal["performance", "mixed"] = Field(
        "performance", description="performance: symmetric activations and weights (NNCF's default for CNNs); "
                                   "mixed: asymmetric activations")
    model_type: Literal["auto", "cnn", "transformer"] = Field(
        "auto", description="transformer: NNCF's scheme for attention networks (model_type=TRANSFORMER); auto: "
                            "transformer where the graph has attention (a Softmax feeding a MatMul)")
    fast_bias_correction: bool = Field(
        True, description="NNCF's fast bias correction; false: the slower full one, which NNCF 3.4's ONNX backend "
                          "fails on ResNets (a convolution on the residual branch)")
    opset: int = Field(18, ge=18, le=23, description="ONNX opset of the exported float model")


class NNCFStage(Stage):
    kind = "nncf"
    makes_files_from_model = True
    Config = NNCFConfig
    input_roles = ("model",)
    required_inputs = ("model",)
    produces = ("onnx",)
    deployable = ("onnx",)
    uses = ("data",)  # the input model's digest covers the model; the calib split is picked by data.split_seed

    def run(self, ctx: StageContext, inputs: dict[str, InputArtifact]) -> StageResult:
        cfg: NNCFConfig = self.config  # type: ignore[assignment]
        try:
            version = nncf_version()
        except NNCFUnavailable as exc:
            raise ConfigError(f"stage {ctx.name!r} (nncf) needs NNCF: {exc}") from exc
        source, data = inputs["model"], ctx.data
        task = task_of(data)
        if task.name in INT8 and task.metrics != ("top1", "top5"):  # judged by top-k on the split; a detector's or
            # segmenter's file would be scored as a classifier's
            raise ConfigError(f"stage {ctx.name!r} (nncf) judges its file by top-k accuracy and cannot score a "
                              f"{task.name} model; use the quantize stage's openvino flavour (NNCF too, judged by "
                              f"{task.val_metric})")
        if "samples" in cfg.model_fields_set and cfg.samples > len(data.calib):
            raise ConfigError(f"stages.{ctx.name}.samples: {cfg.samples} is more than the {len(data.calib)} "
                              "calibration images; lower it or raise data.calib_size")
        samples = min(cfg.samples, len(data.calib))
        if samples < cfg.samples:
            ctx.log(f"calibrating on all {samples} images of the calib split (samples {cfg.samples} by default; "
                    "raise data.calib_size for more)")
        calib, _ = split_arrays(data, "calib", samples)
        val_x, val_y = split_arrays(data, "val")

        work = ctx.stage_dir / "work"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        if source.kind == "onnx":  # a file the user brought (model.onnx): quantized as it is
            float_onnx, description = input_onnx(source), onnx_description(source)
            ctx.log(f"quantizing {source.name}, the ONNX file given")
        else:
            model, description = model_from_artifact(source, data)
            ctx.log(f"exporting {source.name} to ONNX opset {cfg.opset}")
            float_onnx = export_onnx(model, torch.from_numpy(val_x[:2]), work / "float.onnx", opset=cfg.opset).path

        settings = NNCFSettings(preset=cfg.preset, samples=samples, fast_bias_correction=cfg.fast_bias_correction,
                                model_type=cfg.model_type)
        recipe = {"method": METHOD, "nncf_version": version, "preset": cfg.preset, "model_type": cfg.model_type,
                  "samples": samples,
                  "fast_bias_correction": cfg.fast_bias_correction, "format": "QDQ",
                  "calibration_split": "calib (a seeded subset of train)"}
        with ctx.atomic_output_dir("onnx") as folder:
            result = quantize_onnx(float_onnx, folder / "model.onnx", calib, settings, log=ctx.log)
            recipe["model_type"] = result.model_type  # auto resolved by the graph
            label_onnx(result.path, ctx, source, description, data_identity=data.identity(), quantization=recipe)
        ctx.log(f"wrote {ctx.name}/onnx/model.onnx: {result.qdq_pairs} QuantizeLinear and "
                f"{result.ops.get('DequantizeLinear', 0)} DequantizeLinear nodes, checked ({result.seconds:.1f}s)")

        metric = ctx.pipeline.red_line.metric
        val = compare_on_split(float_onnx, ctx.stage_dir / "onnx" / "model.onnx", val_x, val_y)
        drop = round(val["fp32"][metric] - val["int8"][metric], 4)
        ctx.log(f"val {metric} (onnxruntime): fp32 {val['fp32'][metric]:.2f}%, int8 {val['int8'][metric]:.2f}% "
                f"(drop {drop:+.2f}), top-1 agreement {val['top1_agreement']:.2f}% on {val['n']} images; "
                "the bench's gate judges it on the test split"
                + ("" if data.meaningful_accuracy else f" ({data.name}: random labels, accuracy is noise)"))
        shutil.rmtree(work, ignore_errors=True)

        graph = _io_names(ctx.stage_dir / "onnx" / "model.onnx")
        meta = {"file": "model.onnx", "files": ["model.onnx"], "precision": "int8", **graph, "dynamic_batch": True, "preprocessing": description["preprocessing"],
                "num_classes": description["architecture"]["num_classes"],
                "params": source.meta.get("params"), "macs": source.meta.get("macs"), "source_model": source.name,
                "quantization": recipe, "val": val["int8"], "val_fp32": val["fp32"]}
        metrics = {"source_model": source.name, "nncf_version": version, "preset": cfg.preset, "samples": samples,
                   "quantize_s": result.seconds, "qdq_nodes": {k: result.ops.get(k, 0) for k in
                                                               ("QuantizeLinear", "DequantizeLinear")},
                   "val": {"fp32": val["fp32"], "int8": val["int8"], "top1_agreement": val["top1_agreement"],
                           "drop": {metric: drop}},
                   "summary": f"nncf {version} {cfg.preset}, {samples} images: val {metric} "
                              f"{val['int8'][metric]:.2f}% (fp32 {val['fp32'][metric]:.2f}%, drop {drop:+.2f}), "
                              f"agreement {val['top1_agreement']:.1f}%"}
        return StageResult(outputs=[Output("onnx", "onnx", ctx.stage_dir / "onnx", meta=meta,
                                           made_from=[source.name])], metrics=metrics)


def _io_names(path) -> dict:
    """What the bench and a deployer read without opening the file (a brought file keeps its own opset)."""
    model = onnx.load(str(path), load_external_data=False)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    return {"opset": opset, "input_name": model.graph.input[0].name, "output_name": model.graph.output[0].name}
