"""``kind: quantize``: INT8 by the ladder PTQ → partial fallback → QAT, judged on the real files."""
from __future__ import annotations

import json
import logging
import shutil
from typing import Literal

import torch
from pydantic import Field, field_validator

from compress.config import StageConfig, Strict
from compress.distillation.loss import check_pair
from compress.errors import ConfigError, StageError
from compress.quantization.ladder import Attempt, Ladder, LadderSettings, choose, climb, latency_fallback
from compress.quantization.latency_fallback import LatencyFallbackSettings
from compress.quantization.ptq import Calibration, preprocess
from compress.quantization.qdq_lint import lint_qdq
from compress.quantization.qdq_rewrite import int8_to_uint8_activations, weights_to_7bit
from compress.stages.base import InputArtifact, Output, Stage, StageContext, StageResult
from compress.stages.int8_records import (input_onnx, onnx_meta, reference_accuracy, rung_records, split_arrays,
                                         split_scorer)
from compress.stages.model_source import model_from_artifact, onnx_description
from compress.stages.native_int8 import make_native_files, native_check, native_runtimes
from compress.stages.native_int8 import output_name as native_output
from compress.stages.onnx_labels import label_onnx
from compress.stages.qat_rung import QATSettings, run_qat
from compress.stages.quantize_record import RedLineCheck
from compress.quantization.flavours import CPU, FLAVOURS, FORMER_FLAVOUR_NAMES, OPENVINO, TRT, Check, ships_on
from compress.stages.int8_flavours import OpenVinoFlavour, flavour_plan, kernel_census
from compress.stages.training_run import stop_if_collapsed
from compress.quantization.detection_int8 import tail_nodes
from compress.quantization.task_int8 import INT8
from train.tasks import task_of
from export.onnx_export import export_onnx
from serve_bench.report.int8_flags import why_int8_not_faster
from serve_bench.runners import ONNX_RUNTIMES
from train.hardware import isa_facts


class CalibrationConfig(Calibration):
    samples: int = Field(256, ge=1, description="calibration images (from the calib split, at most data.calib_size)")


class FallbackConfig(Strict):
    """The ladder's second rung: the layers whose quantization costs the most accuracy kept in float."""

    enabled: bool = Field(True, description="try keeping the most sensitive layers in float when PTQ misses the "
                                            "red line")
    max_float_layers: int = Field(4, ge=1, description="at most this many layers kept in float")
    sensitivity_samples: int = Field(256, ge=1, description="validation images used to rank the layers")


logger = logging.getLogger(__name__)

FlavourName = Literal[tuple(FLAVOURS)]  # type: ignore[valid-type]  # the names the flavour table gives


class LatencyFallbackConfig(Strict):
    """The ladder's latency counterpart: layer groups whose INT8 costs the CPU file time kept in float."""

    enabled: bool = Field(True, description="after the accuracy ladder, try squeeze-excite, depthwise and "
                                            "hard-activation convolutions in float on onnxruntime; keep a group "
                                            "float where its file is measurably faster and within the red line")
    max_rounds: int = Field(3, ge=1, description="greedy rounds (each makes and times one file per remaining group)")
    min_iters: int = Field(300, ge=50, description="timed requests per file per round, interleaved, batch 1")


OnnxRuntimeName = Literal[ONNX_RUNTIMES]  # the runtimes that run an ONNX file, from the registry


class QuantizeConfig(StageConfig):
    kind: Literal["quantize"] = Field("quantize", description="INT8: post-training quantization, then layers kept "
                                                              "in float, then QAT, until within the red line")
    flavours: list[FlavourName] = Field(  # type: ignore[valid-type]
        list(FLAVOURS), min_length=1,
        description="one INT8 file per runtime, made the way it fuses: cpu for onnxruntime (uint8 activations), "
                    "tensorrt for TensorRT (symmetric int8; trt before, read with a warning), openvino by NNCF (left out, with the reason logged, where OpenVINO "
                    "or NNCF is not usable here and the list is the default)")
    openvino: OpenVinoFlavour = Field(default_factory=OpenVinoFlavour, description="how NNCF makes the openvino file")
    calibration: CalibrationConfig = Field(default_factory=CalibrationConfig, description="how activation ranges "
                                                                                       "are found")
    fallback: FallbackConfig = Field(default_factory=FallbackConfig, description="the float-layer rung")
    latency_fallback: LatencyFallbackConfig = Field(default_factory=LatencyFallbackConfig,
                                                    description="layers kept in float for speed, by measurement")
    qat: QATSettings = Field(default_factory=QATSettings, description="the quantization-aware training rung")
    opset: int = Field(18, ge=18, le=23, description="ONNX opset of the quantized files")
    cpu_weights: Literal["7bit", "8bit"] = Field(
        "7bit", description="weights of the CPU file: 7bit computes the same on x86 CPUs with and without VNNI "
                            "(8bit weights saturate onnxruntime's u8s8 kernels where VNNI is missing)")
    native: list[str] = Field(
        default_factory=list, description="runtimes that also make an INT8 file of their own from the torch model, "
                                          "each an output native_<runtime> the bench measures (inductor: PyTorch's "
                                          "PT2E with X86InductorQuantizer, run by torch.compile); post-training "
                                          "quantization only, judged against the same red line")
    runtimes: list[OnnxRuntimeName] | None = Field(  # type: ignore[valid-type]
        None, min_length=1, description="runtimes the CPU file's red line is checked on (each answers with its own "
                                        "kernels; OpenVINO only where no openvino file is made); default: every one "
                                        "usable here, as the bench measures it on")


    @field_validator("flavours", mode="before")
    @classmethod
    def _former_names(cls, value):
        if not isinstance(value, list) or not any(v in FORMER_FLAVOUR_NAMES for v in value):
            return value
        logger.warning("quantize flavours: %s (deprecated names) read as %s", ", ".join(
            v for v in value if v in FORMER_FLAVOUR_NAMES), ", ".join(FORMER_FLAVOUR_NAMES.get(v, v) for v in value))
        return [FORMER_FLAVOUR_NAMES.get(v, v) for v in value]

    @field_validator("native")
    @classmethod
    def _native_runtimes(cls, value: list[str]) -> list[str]:
        unknown = [name for name in value if name not in native_runtimes()]
        if unknown:
            raise ValueError(f"{', '.join(map(repr, unknown))} makes no INT8 file of its own; runtimes that do: "
                             f"{', '.join(native_runtimes()) or 'none'}")
        return list(dict.fromkeys(value))


def recipe(flavour: str, cfg: QuantizeConfig, meta: dict, nncf: dict | None = None) -> dict:
    """How a shipped file was quantized, as its ONNX metadata states it."""
    q = meta["quantization"]
    return {"flavour": flavour, "format": "QDQ", "scheme": meta["qdq"], "rung": q["rung"],
            "float_layers": q["float_layers"], "calibration": cfg.calibration.model_dump(mode="json"),
            "qat": cfg.qat.model_dump(mode="json") if q["rung"] == "qat" else None, "opset": cfg.opset,
            **({"nncf": nncf} if FLAVOURS[flavour].made_by == "nncf" and q["rung"] != "qat" and nncf else {})}


class QuantizeStage(Stage):
    kind = "quantize"
    makes_files_from_model = True
    Config = QuantizeConfig
    input_roles = ("model", "baseline", "teacher")
    required_inputs = ("model",)
    produces = (*(f"onnx_{f}" for f in FLAVOURS), *map(native_output, native_runtimes()), "report")
    renamed = {f"onnx_{old}": f"onnx_{new}" for old, new in FORMER_FLAVOUR_NAMES.items()}
    deployable = ("onnx_cpu", "onnx_openvino", *map(native_output, native_runtimes()))
    # it judges files on this machine's runtimes and times them (the latency fallback, the kernel census): another
    # machine or runtime version re-runs it
    keyed_on_environment = True
    uses = ("seed", "data", "red_line")

    @classmethod
    def produces_for(cls, config: QuantizeConfig) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(r for r in cls.produces if (not r.startswith("onnx_") or r.removeprefix("onnx_") in config.flavours)
                     and (r not in map(native_output, native_runtimes()) or r in map(native_output, config.native)))

    @classmethod
    def config_refs(cls, config: QuantizeConfig) -> dict[str, str]:  # type: ignore[override]
        return {"teacher": config.qat.distill.teacher} if config.qat.distill else {}

    @classmethod
    def key_extra(cls, config: StageConfig, pipeline) -> dict | None:
        native = native_check(config.native, pipeline.stages) if config.native else None  # type: ignore[attr-defined]
        return {"runtime_check": cls.runtime_check(config, pipeline), **({"native_check": native} if native else {})}

    @staticmethod
    def runtime_check(cfg: QuantizeConfig, pipeline) -> dict:
        """The flavours made here and the runtimes besides onnxruntime the CPU file's red line is checked on, and
        how (see int8_flavours.flavour_plan)."""
        return flavour_plan(cfg.flavours, "flavours" in cfg.model_fields_set, cfg.runtimes, pipeline.stages,
                            pipeline.latency.batch_size, f"stages.{cfg.name}")

    def run(self, ctx: StageContext, inputs: dict[str, InputArtifact]) -> StageResult:
        cfg: QuantizeConfig = self.config  # type: ignore[assignment]
        field, data, red = f"stages.{ctx.name}", ctx.data, ctx.pipeline.red_line
        if cfg.calibration.samples > len(data.calib):
            raise ConfigError(f"{field}.calibration.samples: {cfg.calibration.samples} is more than the "
                              f"{len(data.calib)} calibration images; lower it or raise data.calib_size")
        torch.manual_seed(ctx.pipeline.seed)
        given_onnx = inputs["model"].kind == "onnx"  # a file the user brought (model.onnx): no torch model
        model, description = (None, onnx_description(inputs["model"])) if given_onnx else \
            model_from_artifact(inputs["model"], data)
        ref_artifact = inputs.get("baseline") or inputs["model"]
        calib, _ = split_arrays(data, "calib", cfg.calibration.samples)
        val_x, val_y = split_arrays(data, "val")
        ref_val, ref_test = (reference_accuracy(ref_artifact, data, split, model if ref_artifact.name ==
                                                inputs["model"].name else None) for split in ("val", "test"))
        ctx.log(f"reference {ref_artifact.name}: val {red.metric} {ref_val[red.metric]:.2f}, test "
                f"{ref_test[red.metric]:.2f}; red line {red.max_drop:g} points")

        work = ctx.stage_dir / "work"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        if given_onnx:
            exported = input_onnx(inputs["model"])
        else:
            exported = export_onnx(model, torch.from_numpy(val_x[:2]), work / "float.onnx", opset=cfg.opset).path
        float_onnx = preprocess(exported, work / "float.prep.onnx")
        check = self.runtime_check(cfg, ctx.pipeline)
        cpu_runtimes = tuple(check["runtimes"])
        for flavour, why in check["left_out"].items():
            ctx.log(f"{flavour} flavour not made here: {why}", style="yellow")
        settings = LadderSettings(
            flavours=tuple(check["flavours"]), nncf=cfg.openvino.settings(len(calib)),
            openvino_usable=OPENVINO.name in check["flavours"],
            calibration=Calibration(**cfg.calibration.model_dump(exclude={"samples"})),
            metric=red.metric, max_drop=red.max_drop, max_float_layers=cfg.fallback.max_float_layers,
            sensitivity_samples=cfg.fallback.sensitivity_samples, cpu_weights=cfg.cpu_weights,
            cpu_runtimes=cpu_runtimes, serve_batch=check["serve_batch"], runtime_options=check["options"],
            runtime_threads=check["threads"], keep_float=tuple(self._decode_tail(ctx, model, float_onnx, field)))
        ladder = Ladder(float_onnx, work, settings, calib, val_x, val_y, ref_val[red.metric], log=ctx.log,
                        score=split_scorer(data, "val"),
                        exported_onnx=exported,
                        **({"output_error": INT8[task_of(data).name].output_error}
                           if INT8[task_of(data).name].output_error is not None else {}))
        score_test = split_scorer(data, "test")
        attempts, climbed = self._climb(ctx, cfg, ladder, model, description, inputs, calib, field)
        chosen = choose(attempts)
        if data.meaningful_accuracy:
            latency_fallback(ladder, chosen, LatencyFallbackSettings(**cfg.latency_fallback.model_dump()))
        if data.meaningful_accuracy:  # against the float model quantized, not the baseline earlier stages moved from
            worst = max(chosen.drops, key=chosen.drops.get)
            input_val = ref_val if ref_artifact.name == inputs["model"].name else reference_accuracy(
                inputs["model"], data, "val", model)
            stop_if_collapsed(ctx, red.metric, input_val[red.metric], ref_val[red.metric] - chosen.drops[worst],
                              f"the closest INT8 rung, {chosen.rung} ({worst.flavour} file)",
                              "Check the calibration (calibration.method, samples) and give QAT more epochs "
                              "(qat.epochs); a model this far off is not a rounding error.")
        lints = {a.rung: lint_qdq(a.files[TRT.name], set(a.float_layers)).as_dict() for a in attempts
                 if TRT.name in a.files}
        cpu_runtimes = tuple(settings.cpu_runtimes)  # OpenVINO comes back where its own file could not be made
        left_out = {**check["left_out"], **ladder.left_out, **self._left_out(ctx, cfg, chosen, lints)}
        shipped = [f for f in cfg.flavours if f in chosen.files and f not in left_out]
        test = {Check.own(f): ladder.judge(chosen.files[f], FLAVOURS[f].judged_on, score_test) for f in shipped}
        if CPU.name in shipped:
            test.update(ladder.cpu_elsewhere(chosen.files[CPU.name], score_test))
        drops = {f: round(ref_test[red.metric] - t[red.metric], 4) for f, t in test.items()}
        # Within only if the ladder's choice passed on validation and the test split confirms it;
        # not judged at all (None) where the labels are random.
        within = (chosen.within and all(d <= red.max_drop for d in drops.values())) if data.meaningful_accuracy \
            else None
        # each file is released or refused on its own figures: validation and test, on every runtime it ships on
        own = {f: [d for runs in (chosen.drops, drops) for c, d in runs.items() if c.flavour == f] for f in shipped}
        within_by_file = {f: all(d <= red.max_drop for d in own[f]) if data.meaningful_accuracy else None
                          for f in shipped}
        rungs = rung_records(attempts, lints, float_onnx, val_x, red.metric)
        kernels = kernel_census({f: chosen.files[f] for f in shipped}, cpu_runtimes, val_x, check["threads"],
                                check["options"])
        ctx.log("compute layers as the runtimes ran them: " + "; ".join(
            f"{name} {k.get('line') or k.get('error')}" for name, k in kernels.items()))
        cpu_latency = next((r["latency"] for r in rungs if r["rung"] == chosen.rung and "latency" in r), None)
        flags = []
        if cpu_latency and cpu_latency["int8_p50_ms"] >= cpu_latency["fp32_p50_ms"]:
            flags.append(f"INT8 CPU file is not faster than the fp32 ONNX of the same model "
                         f"(p50 {cpu_latency['int8_p50_ms']:.3f} vs {cpu_latency['fp32_p50_ms']:.3f} ms); "
                         f"{why_int8_not_faster(isa_facts())}")
        verdict = {True: "within the red line", False: "OVER the red line",
                   None: "red line not judged (random labels)"}[within]
        ctx.log(f"rung reached: {chosen.rung}; test {red.metric} " + ", ".join(
            f"{f} {t[red.metric]:.2f} (drop {drops[f]:+.2f})" for f, t in test.items()) + f" — {verdict}"
            + "".join(f"\n  ! {flag}" for flag in flags), style="red" if within is False else None)
        summary = {"rung": chosen.rung, "climbed": climbed, "cpu_weights": cfg.cpu_weights,
                   **({"float_tail": list(settings.keep_float)} if settings.keep_float else {}),
                   "reference": ref_artifact.name,
                   "reference_val": ref_val[red.metric], "reference_test": ref_test[red.metric],
                   "red_line": {"metric": red.metric, "max_drop": red.max_drop, "within": within,
                                "within_by_file": within_by_file, "test_drop": {str(c): d for c, d in drops.items()},
                                "test": {str(c): t[red.metric] for c, t in test.items()}},
                   "flags": flags, "rungs": rungs, "kernels": kernels}
        if left_out:
            summary["left_out"] = left_out
        outputs = []
        for f in shipped:
            with ctx.atomic_output_dir(f"onnx_{f}") as folder:
                shutil.copy2(chosen.files[f], folder / "model.onnx")
                check = RedLineCheck(within=within_by_file[f], test_drop={
                    c.runtime: d for c, d in drops.items() if c.flavour == f})
                meta = onnx_meta(f, chosen, inputs["model"], description, summary, test[Check.own(f)],
                                 ships_on(f, cpu_runtimes), check)
                label_onnx(folder / "model.onnx", ctx, inputs["model"], description, data_identity=data.identity(),
                           quantization=recipe(f, cfg, meta, chosen.details.get("nncf")))
            outputs.append(Output(f"onnx_{f}", "onnx", ctx.stage_dir / f"onnx_{f}", made_from=[inputs["model"].name],
                                  meta=meta))
        if cfg.native:
            if model is None:
                raise ConfigError(f"{field}.native: a runtime's own INT8 file is made from the torch model, and "
                                  f"{inputs['model'].name} is an ONNX file; give model.name and model.weights, or "
                                  "drop native")
            natives, summary["native"] = make_native_files(ctx, cfg.native, model, description, inputs["model"],
                                                           calib, {"val": ref_val, "test": ref_test}, red, field)
            outputs += natives
        with ctx.atomic_output_dir("report") as folder:
            (folder / "ladder.json").write_text(json.dumps(summary, indent=2))
        shutil.rmtree(work, ignore_errors=True)
        metrics = {**summary, **{f"onnx_{f}": {"skipped": why} for f, why in left_out.items()},
                   "summary": f"rung {chosen.rung}, test drop " + ", ".join(
            f"{f} {d:+.2f}" for f, d in drops.items()) + f" ({verdict}, {red.max_drop:g} points)"
                   + "".join(f"; {f} file left out" for f in left_out)}
        return StageResult(outputs=[*outputs, Output("report", "report", ctx.stage_dir / "report")], metrics=metrics)

    @staticmethod
    def _left_out(ctx: StageContext, cfg: QuantizeConfig, chosen: Attempt, lints: dict) -> dict[str, str]:
        """The flavours the stage cannot ship, each with its reason: a TensorRT file whose chosen rung fails the
        lint (a layer TensorRT would run in float) is left out while the others ship; alone, it stops the stage."""
        lint = lints.get(chosen.rung)
        if lint is None or lint["ok"]:
            return {}
        violations = lint["violations"]
        why = (f"the TensorRT Q/DQ file of rung {chosen.rung} fails the lint ({len(violations)} violation"
               f"{'s' if len(violations) != 1 else ''}: " + "; ".join(violations[:4])
               + ("; …" if len(violations) > 4 else "") + ")")
        if list(chosen.files) == [TRT.name]:
            raise StageError(f"stage {ctx.name!r}: {why}; add cpu to stages.{ctx.name}.flavours to ship the CPU "
                             "file, or keep those layers in float on purpose")
        ctx.log(f"trt flavour left out: {why}; TensorRT would run those layers in float. The other flavours ship; "
                "an INT8 engine needs a clean file", style="yellow")
        return {TRT.name: why}

    @staticmethod
    def _decode_tail(ctx: StageContext, model, float_onnx, field: str) -> list[str]:
        """A detector's decode nodes (kept float on every rung); nothing for a classifier."""
        if not INT8[task_of(ctx.data).name].decode_tail:
            return []
        heads = getattr(model, "head_convs", None)
        if model is None or not heads:
            raise ConfigError(f"{field}: a detector's decode tail is found from its head convolutions (head_convs), "
                              "which needs the torch detector (model.name), not an ONNX file")
        try:
            tail = tail_nodes(float_onnx, tuple(heads))
        except ValueError as exc:
            raise StageError(f"stage {ctx.name!r}: {exc}") from exc
        ctx.log(f"decode tail kept in float: {len(tail)} nodes after {', '.join(heads)}")
        return tail

    def _climb(self, ctx, cfg: QuantizeConfig, ladder: Ladder, model, description, inputs, calib,
               field: str) -> tuple[list[Attempt], list[str]]:
        if not ctx.data.meaningful_accuracy:
            ctx.log(f"{ctx.data.name} data: the labels are random, so an accuracy drop measures noise; the "
                    "ladder stays at PTQ (nothing to recover) and the red line is not judged", style="yellow")
        no_qat = INT8[task_of(ctx.data).name].no_qat
        qat = cfg.qat.enabled and model is not None and no_qat is None
        if cfg.qat.enabled and no_qat is not None:
            ctx.log(f"{field}.qat: {no_qat}: the ladder stops at the fallback rung", style="yellow")
        if cfg.qat.enabled and model is None:
            ctx.log(f"{field}.qat: QAT trains the torch model, and {inputs['model'].name} is an ONNX file: the ladder "
                    "stops at the fallback rung (give model.name and model.weights to climb to QAT)", style="yellow")
        rungs = [] if not ctx.data.meaningful_accuracy else [
            *([("fallback", ladder.fallback)] if cfg.fallback.enabled else []),
            *([("qat", lambda _: self._qat(ctx, cfg, ladder, model, description, inputs, calib, field))]
              if qat else [])]
        return climb(ladder.ptq, rungs, ladder.settings.max_drop, log=lambda m: ctx.log(m, style="red"))

    def _qat(self, ctx, cfg: QuantizeConfig, ladder: Ladder, model, description, inputs, calib, field) -> Attempt:
        teacher = None
        if cfg.qat.distill is not None:
            teacher, teacher_desc = model_from_artifact(inputs["teacher"], ctx.data)
            check_pair(teacher_desc, description, inputs["teacher"].name, inputs["model"].name)
        folder = ladder.work / "qat"
        folder.mkdir(parents=True, exist_ok=True)
        files = {TRT.name: folder / f"model-{TRT.name}.onnx"}  # QAT writes the symmetric int8 layout
        details = run_qat(ctx, model, cfg.qat, torch.from_numpy(calib), files[TRT.name], f"{field}.qat", teacher)
        if OPENVINO.name in ladder.flavours:  # OpenVINO reads the symmetric int8 Q/DQ the QAT graph converts to
            files[OPENVINO.name] = folder / f"model-{OPENVINO.name}.onnx"
            shutil.copy2(files[TRT.name], files[OPENVINO.name])
        if "cpu" in ladder.flavours:
            import onnx

            cpu, moved = int8_to_uint8_activations(onnx.load(str(files[TRT.name])))
            details["qat"]["cpu_flavour"] = f"{moved} activation Q/DQ pairs moved to uint8"
            if cfg.cpu_weights == "7bit":
                cpu, halved = weights_to_7bit(cpu)
                details["qat"]["cpu_flavour"] += f", {halved} weight tensors to 7 bits"
            onnx.save(cpu, str(folder / "model-cpu.onnx"))
            files["cpu"] = folder / "model-cpu.onnx"
        return ladder.measure("qat", {f: files[f] for f in ladder.flavours}, details)
