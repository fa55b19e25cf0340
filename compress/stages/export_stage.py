"""``kind: export``: a model artifact → ONNX (checked, parity-tested) and optionally a TensorRT engine."""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from compress.config import StageConfig, Strict
from compress.errors import ArtifactError, ConfigError, StageError
from compress.quantization.flavours import TRT
from compress.stages.base import InputArtifact, Output, Stage, StageContext, StageResult
from compress.stages.int8_records import input_onnx
from compress.stages.model_source import model_from_artifact, onnx_description
from compress.stages.onnx_labels import label_onnx
from export.onnx_export import export_onnx
from export.parity import as_dicts, check_parity
from export.tensorrt_engine import ENGINE_KIND, BuildSettings, build_engine, unavailable_reason
from train.data import BatchStream

DEFAULT_TOLERANCE = {"fp32": 1e-4, "fp16": 1e-2}


class ParityConfig(Strict):
    tolerance: float | None = Field(None, gt=0, description="max |Δlogit| / max |logit|; default 1e-4 fp32, 1e-2 fp16")
    min_top1_agreement: float = Field(99.9, ge=0, le=100, description="percent of images with the same top-1 class")
    batch_sizes: list[int] = Field([1, 32], min_length=1, description="batch sizes checked (1 and a larger one)")
    samples: int = Field(512, ge=1, description="validation images used (at most 64 at batch 1)")


class TensorRTConfig(Strict):
    precision: Literal["fp32", "fp16", "int8"] = Field("fp16", description="int8 builds from the quantize stage's "
                                                                           "TensorRT Q/DQ file")
    min_batch: int = Field(1, ge=1, description="smallest batch the engine accepts")
    opt_batch: int = Field(1, ge=1, description="the batch TensorRT tunes its kernels for")
    max_batch: int = Field(32, ge=1, description="largest batch the engine accepts")
    workspace_mb: int = Field(1024, ge=16, description="GPU memory TensorRT may use while building, in MiB")
    timing_cache: str | None = Field(None, description="default: <run dir>/tensorrt.timing-cache, shared by builds")
    required: bool = Field(False, description="fail instead of recording 'skipped' where TensorRT or CUDA is absent")

    @model_validator(mode="after")
    def _profile(self) -> "TensorRTConfig":
        if not self.min_batch <= self.opt_batch <= self.max_batch:
            raise ValueError(f"need min_batch ≤ opt_batch ≤ max_batch, got {self.min_batch}, {self.opt_batch}, {self.max_batch}")
        return self


class ExportConfig(StageConfig):
    kind: Literal["export"] = Field("export", description="write the deployable files: ONNX, and TensorRT engines "
                                                          "where TensorRT and a GPU exist")
    formats: list[Literal["onnx", ENGINE_KIND]] = Field(["onnx"], min_length=1, description="the files to write")
    precision: Literal["fp32", "fp16"] = Field("fp32", description="the ONNX file's weights and arithmetic")
    io_dtype: Literal["fp32", "fp16"] = Field("fp32", description="fp16 models keep fp32 inputs/outputs unless fp16")
    opset: int = Field(18, ge=18, le=23, description="ONNX opset")
    simplify: bool = Field(False, description="simplify the graph with onnxslim; parity is checked after")
    parity: ParityConfig = Field(default_factory=ParityConfig, description="how the file's outputs are checked "
                                                                           "against the torch model's")
    tensorrt: TensorRTConfig = Field(default_factory=TensorRTConfig, description="the TensorRT engine's build")

    @model_validator(mode="after")
    def _io(self) -> "ExportConfig":
        if self.io_dtype == "fp16" and self.precision != "fp16":
            raise ValueError("io_dtype: fp16 needs precision: fp16")
        return self


class ExportStage(Stage):
    kind = "export"
    makes_files_from_model = True
    Config = ExportConfig
    input_roles = ("model", "onnx", "qdq")
    produces = ("onnx", ENGINE_KIND)
    deployable = ("onnx", ENGINE_KIND)
    renamed = {"engine": ENGINE_KIND}
    latest_of = {"qdq": f"onnx_{TRT.name}"}  # an INT8 engine is built from the quantize stage's TensorRT Q/DQ file
    optional_inputs = ("qdq",)  # a quantize stage may leave its TensorRT file out (it fails the lint)
    keyed_on_environment = True
    judges_on_data = False  # parity compares two runtimes on the same images; no accuracy is judged

    @classmethod
    def latest_of_for(cls, config: ExportConfig) -> dict[str, str]:  # type: ignore[override]
        """The Q/DQ file only where an INT8 engine is asked for: an fp32/fp16 export is made from the model
        alone, so re-quantizing must not re-export it."""
        wants_qdq = ENGINE_KIND in config.formats and config.tensorrt.precision == "int8"
        return cls.latest_of if wants_qdq else {}

    def run(self, ctx: StageContext, inputs: dict[str, InputArtifact]) -> StageResult:
        cfg: ExportConfig = self.config  # type: ignore[assignment]
        outputs, metrics = [], {}
        source = None  # the ONNX an engine is built from: (file, its metadata, its artifact name)
        if "onnx" in cfg.formats:
            onnx_output, metrics["onnx"] = self._onnx(ctx, cfg, inputs)
            outputs.append(onnx_output)
            source = (onnx_output.path / onnx_output.meta["file"], onnx_output.meta, f"{ctx.name}.onnx")
        if ENGINE_KIND in cfg.formats:
            reason = unavailable_reason()
            if cfg.tensorrt.precision == "int8":
                given = inputs.get("qdq") or inputs.get("onnx")
                if given is None and "qdq" in ctx.left_out:  # wired, but the quantize stage could not ship it
                    if not reason:
                        raise StageError(f"stage {ctx.name!r}: no INT8 engine: {ctx.left_out['qdq']}")
                elif given is None:
                    raise ConfigError(f"stages.{ctx.name}.tensorrt.precision: int8 needs a Q/DQ ONNX: add a "
                                      f"quantize stage with {TRT.name} in its flavours before this one (its "
                                      f"onnx_{TRT.name} "
                                      f"file is used; a quantize stage whose TensorRT file fails the lint leaves "
                                      f"it out, see its log) or set inputs: {{qdq: <artifact>}}")
                else:
                    source = (input_onnx(given), given.meta, given.name)
            elif source is None:
                if "onnx" not in inputs:
                    raise ConfigError(f"stages.{ctx.name}: formats [tensorrt] without onnx needs an ONNX input "
                                      f"(inputs: {{onnx: <stage>}}) or add onnx to formats")
                source = (input_onnx(inputs["onnx"]), inputs["onnx"].meta, inputs["onnx"].name)
            if reason and cfg.tensorrt.required:
                raise ConfigError(f"stages.{ctx.name}.tensorrt.required is true but {reason}")
            if reason:
                ctx.log(f"tensorrt: skipped: {reason}", style="yellow")
            engine, metrics[ENGINE_KIND] = (None, {"skipped": reason}) if reason else self._tensorrt(ctx, cfg, *source)
            outputs += [engine] if engine is not None else []
        metrics["summary"] = _summary(metrics)
        return StageResult(outputs=outputs, metrics=metrics)

    def _onnx(self, ctx: StageContext, cfg: ExportConfig, inputs: dict[str, InputArtifact]) -> tuple[Output, dict]:
        if "model" not in inputs:
            raise ArtifactError(f"stage {ctx.name!r} exports a model but has none: add a train stage before it "
                                f"or set stages.{ctx.name}.inputs.model")
        if inputs["model"].kind == "onnx":
            return self._pass_through(ctx, cfg, inputs["model"])
        if cfg.simplify and importlib.util.find_spec("onnxslim") is None:
            raise ConfigError(f"stages.{ctx.name}.simplify: true needs onnxslim: pip install onnxslim (or pip "
                              "install -e '.[simplify]' in this checkout)")
        data = ctx.data
        model, description = model_from_artifact(inputs["model"], data)
        images = next(BatchStream(data.val, data, min(cfg.parity.samples, len(data.val)), shuffle=False,
                                  drop_last=False).epoch(0))[0]
        too_large = [b for b in cfg.parity.batch_sizes if b > len(images)]
        if too_large:  # said before anything is exported, as a setting to change, not as a failed parity check
            more = (f"raise stages.{ctx.name}.parity.samples" if cfg.parity.samples < len(data.val)
                    else "give the validation split more images (data.val_fraction)")
            raise ConfigError(
                f"stages.{ctx.name}.parity.batch_sizes: batch {max(too_large)} needs as many validation images, "
                f"the check has {len(images)} (parity.samples {cfg.parity.samples}, validation split "
                f"{len(data.val)}); lower it to {len(images)} or less, or {more}")
        tolerance = cfg.parity.tolerance or DEFAULT_TOLERANCE[cfg.precision]
        with ctx.atomic_output_dir("onnx") as folder:
            info = export_onnx(model, images[:2], folder / "model.onnx", opset=cfg.opset,
                               precision=cfg.precision, io_dtype=cfg.io_dtype, simplify=cfg.simplify)
            parity = check_parity(info.path, model, images, cfg.parity.batch_sizes, tolerance=tolerance,
                                  min_agreement=cfg.parity.min_top1_agreement, io_dtype=cfg.io_dtype)
            # the data identity: which data its weights were made on, where the model records it
            label_onnx(info.path, ctx, inputs["model"], description, data_identity=description.get("data"))
        worst = max(parity, key=lambda r: r.rel_diff)
        ctx.log(f"ONNX opset {info.opset} {info.precision}, parity max |Δ| {worst.max_abs_diff:.2g} "
                f"({worst.rel_diff:.2g} of the logit scale), top-1 agreement "
                f"{min(r.top1_agreement for r in parity):.2f}% at batch sizes {cfg.parity.batch_sizes}")
        meta = {"file": "model.onnx", "files": info.files, "opset": info.opset, "precision": info.precision,
                "io_dtype": info.io_dtype, "input_name": info.input_name, "output_name": info.output_name,
                "dynamic_batch": True, "external_data": info.external_data, "simplified": info.simplified,
                "preprocessing": description["preprocessing"], "num_classes": data.num_classes,
                "params": inputs["model"].meta.get("params"), "macs": inputs["model"].meta.get("macs"),
                "source_model": inputs["model"].name, "parity": {"tolerance": tolerance, "min_top1_agreement": cfg.parity.min_top1_agreement,
                           "results": as_dicts(parity)}}
        metrics = {"opset": info.opset, "precision": info.precision, "export_s": round(info.seconds, 2),
                   "parity": meta["parity"], "simplified": info.simplified}
        # made from the model alone: a Q/DQ input wired for an engine build is not part of this file
        return Output("onnx", "onnx", ctx.stage_dir / "onnx", meta=meta, made_from=[inputs["model"].name]), metrics

    def _pass_through(self, ctx: StageContext, cfg: ExportConfig, given: InputArtifact) -> tuple[Output, dict]:
        """A brought ONNX file (model.onnx) is already the deployable file: copied as it is, with this project's
        metadata (preprocessing, classes, lineage) added. Converting its precision or simplifying it would need
        the parity check against a torch model it does not have, so those settings are refused."""
        changes = [f for f, v in (("precision", cfg.precision != "fp32"), ("simplify", cfg.simplify),
                                  ("io_dtype", cfg.io_dtype != "fp32")) if v]
        if changes:
            raise ConfigError(f"stages.{ctx.name}.{changes[0]}: {given.name} is an ONNX file the user brought, "
                              "which export passes through unchanged (fp32, not simplified); drop the setting")
        source = input_onnx(given)
        with ctx.atomic_output_dir("onnx") as folder:
            for name in given.meta.get("files", [source.name]):
                shutil.copy2(source.parent / name, folder / name)
            label_onnx(folder / source.name, ctx, given, onnx_description(given), data_identity=ctx.data.identity())
        ctx.log(f"{given.name} passed through as ONNX opset {given.meta.get('opset')} (no parity check: nothing "
                "was converted)")
        meta = {k: v for k, v in given.meta.items() if k not in ("description", "origin", "test_top1")}
        meta.update(source_model=given.name, passed_through=True, parity=None)
        metrics = {"opset": given.meta.get("opset"), "precision": "fp32", "passed_through": True, "parity": None}
        return Output("onnx", "onnx", ctx.stage_dir / "onnx", meta=meta, made_from=[given.name]), metrics

    def _tensorrt(self, ctx: StageContext, cfg: ExportConfig, onnx_file: Path, source_meta: dict,
                  source_name: str) -> tuple[Output, dict]:
        trt = cfg.tensorrt
        cache = ctx.run_dir / "tensorrt.timing-cache" if trt.timing_cache is None else ctx.run_dir / trt.timing_cache
        settings = BuildSettings(precision=trt.precision, min_batch=trt.min_batch, opt_batch=trt.opt_batch,
                                 max_batch=trt.max_batch, workspace_mb=trt.workspace_mb, timing_cache=cache)
        chw = tuple(ctx.data.input_shape)
        with ctx.atomic_output_dir(ENGINE_KIND) as folder:
            meta = build_engine(onnx_file, folder, settings, source_meta.get("input_name", "input"), chw)
        ctx.log(f"TensorRT {meta['tensorrt_version']} engine on {meta['gpu_name']}: layers {meta['layers']}"
                + (f"; float compute layers: {', '.join(meta['float_compute_layers'])}" if meta["float_compute_layers"] else ""))
        meta = {**meta, "params": source_meta.get("params"), "macs": source_meta.get("macs")}
        return (Output(ENGINE_KIND, ENGINE_KIND, ctx.stage_dir / ENGINE_KIND, meta=meta, made_from=[source_name]),
                meta)


def _summary(metrics: dict) -> str:
    parts = []
    if "onnx" in metrics and metrics["onnx"].get("passed_through"):
        parts.append(f"onnx opset {metrics['onnx']['opset']}: the brought file, passed through")
    elif "onnx" in metrics:
        results = metrics["onnx"]["parity"]["results"]
        parts.append(f"onnx opset {metrics['onnx']['opset']} {metrics['onnx']['precision']}: parity rel "
                     f"{max(r['rel_diff'] for r in results):.1e}, top-1 {min(r['top1_agreement'] for r in results):.1f}%")
    if ENGINE_KIND in metrics:
        trt = metrics[ENGINE_KIND]
        parts.append(f"tensorrt: skipped ({trt['skipped']})" if "skipped" in trt
                     else f"tensorrt {trt['precision']}: layers {trt['layers']}")
    return "; ".join(parts)
