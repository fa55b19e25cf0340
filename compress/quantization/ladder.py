"""The INT8 escalation ladder: PTQ → partial float fallback → QAT, stopping at the first rung
whose real quantized files are within the accuracy red line on the validation split.

Each rung yields both Q/DQ flavours; a rung passes only when every flavour asked for is
within the red line, because each of them ships somewhere — and the CPU file on every runtime
it may be released on, because each runtime answers with its own kernels. The rung records keep every
number the decision was made on, and why the ladder climbed past it.
"""
from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx

from compress.quantization import measure as int8_measure
from compress.quantization.flavours import CPU, FLAVOURS, ONNX_RUNTIME, OPENVINO, TRT, Check
from compress.quantization.latency_fallback import LatencyFallbackSettings, greedy, layer_groups, resize_nodes
from compress.quantization.nncf_ptq import NNCFQuantizationError, NNCFSettings, quantize_onnx as nncf_quantize
from compress.quantization.ptq import Calibration, QuantizationError, compute_nodes, quantize
from serve_bench.runners import RUNNERS, RunnerError

logger = logging.getLogger(__name__)


class RungUnavailable(QuantizationError):
    """A rung cannot run here (its engine is missing or cannot take the model); the earlier rungs stand."""


@dataclass
class LadderSettings:
    flavours: tuple[str, ...] = (CPU.name, TRT.name)
    nncf: NNCFSettings = field(default_factory=lambda: NNCFSettings(preset="auto", model_type="auto"))
    calibration: Calibration = field(default_factory=Calibration)
    metric: str = "top1"
    max_drop: float = 0.5
    max_float_layers: int = 4
    sensitivity_samples: int = 256
    eval_batch: int = 64
    cpu_weights: str = "7bit"  # "7bit": the CPU file computes the same with and without VNNI; "8bit": full range
    # Runtimes besides onnxruntime the CPU file may be released on: its red-line check runs there too (as
    # "cpu@<runtime>"), at the batch it serves (OpenVINO's answers depend on the batch).
    cpu_runtimes: tuple[str, ...] = ()
    serve_batch: int = 1
    runtime_options: dict = field(default_factory=dict)  # runtime → runner options, as the bench runs it
    runtime_threads: int | None = None
    # Where an OpenVINO file is asked for, the CPU file is not checked on OpenVINO; if that file cannot be made or
    # run, the check on OpenVINO comes back for the CPU file (True where OpenVINO is usable here)
    openvino_usable: bool = False
    # Nodes never quantized on any rung: a detector's decode tail, which puts pixel coordinates and 0..1 scores
    # into one output that a single INT8 scale cannot hold.
    keep_float: tuple[str, ...] = ()


@dataclass
class Attempt:
    rung: str  # ptq | fallback | qat
    files: dict[str, Path]  # flavour → Q/DQ ONNX
    val: dict[Check, dict]  # each check (a flavour's file on a runtime) → accuracy on the validation split
    drops: dict[Check, float]  # each check → points below the reference
    within: bool
    details: dict = field(default_factory=dict)
    float_layers: list[str] = field(default_factory=list)

    def worst(self) -> float:
        return max(self.drops.values())

    def why_not(self, max_drop: float) -> str:
        over = [f"{f} drop {d:.2f}" for f, d in self.drops.items() if d > max_drop]
        return f"{self.rung}: {', '.join(over)} points > red line {max_drop:g} on the validation split"

    def record(self, metric: str) -> dict:
        on_runtimes = {str(k): {f"val_{metric}": v[metric], "drop": round(self.drops[k], 4)}
                       for k, v in self.val.items() if k != Check.own(k.flavour)}
        own = {f: Check.own(f) for f in self.files}
        return {"rung": self.rung, "within_red_line": self.within, "float_layers": self.float_layers,
                "flavours": {f: {f"val_{metric}": self.val[c][metric], "drop": round(self.drops[c], 4),
                                 "size_bytes": self.files[f].stat().st_size} for f, c in own.items()},
                **({"runtimes": on_runtimes} if on_runtimes else {}), **self.details}


class Ladder:
    """Climbs on plain inputs: a float ONNX file, calibration and validation arrays, a reference accuracy."""

    def __init__(self, float_onnx: Path, work: Path, settings: LadderSettings, calib: np.ndarray,
                 val_images: np.ndarray, val_labels: np.ndarray, reference: float,
                 log: Callable[[str], None] = logger.info, score: Callable[..., dict] | None = None,
                 output_error: Callable[[np.ndarray, np.ndarray], float] = int8_measure.output_error,
                 exported_onnx: Path | None = None) -> None:
        """``score(path, batch_size, runtime=, threads=, options=)`` judges a file on the validation split
        (default: top-k accuracy of its logits against ``val_labels``; a detector's: its mAP); ``output_error``
        ranks the layers for the fallback (a detector's weighs its scores, not only its pixel coordinates)."""
        self.float_onnx, self.work, self.settings = float_onnx, work, settings
        self.calib, self.val_images, self.val_labels = calib, val_images, val_labels
        self.reference, self.log, self.output_error = reference, log, output_error
        self.score = score or (lambda path, batch, **kw: int8_measure.split_accuracy(
            path, self.val_images, self.val_labels, batch, **kw))
        self.cache = work / f"calibration-{settings.calibration.method}.json"
        # NNCF quantizes the float file as exported, not onnxruntime's pre-processed one: that pass rewrites
        # hard-swish as x · hard-sigmoid(x), which OpenVINO no longer fuses (MobileNetV3: p50 3.55 against 2.08 ms)
        self.exported_onnx = exported_onnx or float_onnx
        self.left_out: dict[str, str] = {}  # flavours that could not be made or run here, with why
        self.nncf_made: dict[Path, dict] = {}  # how NNCF made each openvino file (preset, model type, float nodes)
        work.mkdir(parents=True, exist_ok=True)

    @property
    def flavours(self) -> tuple[str, ...]:
        return tuple(f for f in self.settings.flavours if f not in self.left_out)

    def _leave_out(self, flavour: str, why: str) -> None:
        self.left_out[flavour] = why
        self.log(f"{flavour} flavour left out: {why}; the other flavours go on")
        s = self.settings
        if flavour == OPENVINO.name and s.openvino_usable and CPU.name in s.flavours \
                and OPENVINO.runtime not in s.cpu_runtimes:
            s.cpu_runtimes = (*s.cpu_runtimes, OPENVINO.runtime)  # the CPU file is checked (and may ship) there again
            self.log("the CPU file is checked on OpenVINO instead")

    def judge(self, path: Path, runtime: str, score: Callable[..., dict] | None = None) -> dict:
        """Accuracy of ``path`` as ``runtime`` answers (``score``: another split's scorer): at the batch the bench
        serves where that runtime's answers depend on the batch, with the bench's threads and options."""
        s, score = self.settings, score or self.score
        if runtime == ONNX_RUNTIME:
            return score(path, s.eval_batch)
        batch = s.serve_batch if RUNNERS[runtime].answers_depend_on_batch else s.eval_batch
        return score(path, batch, runtime=runtime, threads=s.runtime_threads, options=s.runtime_options.get(runtime))

    def cpu_elsewhere(self, path: Path, score: Callable[..., dict] | None = None) -> dict[str, dict]:
        """The CPU file judged on each other runtime it may ship on: each one's answers checked."""
        return {Check(CPU.name, r): self.judge(path, r, score) for r in self.settings.cpu_runtimes}

    def measure(self, rung: str, files: dict[str, Path], details: dict | None = None,
                float_layers: list[str] | None = None) -> Attempt:
        s = self.settings
        if not files:
            raise QuantizationError(f"{rung}: no flavour could be made here ("
                                    + "; ".join(f"{f}: {why}" for f, why in self.left_out.items()) + ")")
        val = {}
        for f, p in list(files.items()):
            made = FLAVOURS[f]
            try:
                val[Check.own(f)] = self.judge(p, made.judged_on)
            except RunnerError as exc:  # e.g. no OpenVINO kernel for the layout NNCF chose
                if made.made_by != "nncf":
                    raise
                self._leave_out(f, f"{made.judged_on} could not run the {rung} file: {exc}")
                del files[f]
        if CPU.name in files:
            val.update(self.cpu_elsewhere(files[CPU.name]))
        drops = {f: self.reference - v[s.metric] for f, v in val.items()}
        within = all(d <= s.max_drop for d in drops.values())
        if files.get(OPENVINO.name) in self.nncf_made:
            details = {**(details or {}), "nncf": self.nncf_made[files[OPENVINO.name]]}
        self.log(f"{rung}: val {s.metric} " + ", ".join(f"{f} {v[s.metric]:.2f} (drop {drops[f]:+.2f})"
                                                        for f, v in val.items())
                 + (" — within the red line" if within else f" — over the red line {s.max_drop:g}"))
        return Attempt(rung=rung, files=files, val=val, drops=drops, within=within, details=details or {},
                       float_layers=float_layers or [])

    def _quantize_all(self, tag: str, exclude: list[str]) -> dict[str, Path]:
        folder = self.work / tag
        folder.mkdir(parents=True, exist_ok=True)
        keep = [*self.settings.keep_float, *exclude]
        files = {}
        for f in self.flavours:
            if FLAVOURS[f].made_by == "nncf":
                made = self._nncf(folder / f"model-{f}.onnx", keep)
                if made is not None:
                    files[f] = made
                continue
            files[f] = quantize(self.float_onnx, folder / f"model-{f}.onnx", f, self.settings.calibration, self.calib,
                                self.cache, exclude=keep, reduce_range=self._reduce(f))
        return files

    def _nncf(self, out: Path, keep: list[str]) -> Path | None:
        """The OpenVINO file, quantized by NNCF on the same calibration images; a failure leaves the flavour out.

        The float nodes are named in the pre-processed graph (the sensitivity ranking, a detector's tail); where one
        of them is not in the exported graph (onnxruntime's pass fuses MatMul + Add into a Gemm of another name),
        NNCF quantizes the pre-processed graph instead, so that every layer meant to stay float does."""
        exported = {n.name for n in onnx.load(str(self.exported_onnx), load_external_data=False).graph.node}
        unmatched = [n for n in keep if n not in exported]
        source = self.float_onnx if unmatched else self.exported_onnx
        try:
            result = nncf_quantize(source, out, self.calib, self.settings.nncf, ignored=keep)
        except (ImportError, NNCFQuantizationError, RuntimeError, ValueError) as exc:  # NNCFUnavailable: ImportError
            self._leave_out(OPENVINO.name, f"NNCF could not quantize the model: {exc}")
            return None
        self.nncf_made[out] = {"engine": f"nncf {result.nncf_version} (ONNX backend)", "preset": result.preset,
                               "model_type": result.model_type, "samples": result.samples,
                               "float_nodes": list(result.ignored), "seconds": result.seconds,
                               "graph": "as exported" if source == self.exported_onnx else
                               f"pre-processed ({len(unmatched)} float nodes are not in the exported graph)"}
        return out

    def _reduce(self, flavour: str) -> bool:
        return flavour == "cpu" and self.settings.cpu_weights == "7bit"

    def ptq(self) -> Attempt:
        cal = self.settings.calibration
        files = self._quantize_all("ptq", [])
        return self.measure("ptq", files, {"calibration": {"method": cal.method, "samples": len(self.calib),
                                                           "split": "calib (a seeded subset of train)"}})

    def sensitivity(self, flavour: str) -> list[dict]:
        """Per compute layer: the logit error when only that layer is quantized, largest first."""
        images = self.val_images[: self.settings.sensitivity_samples]
        reference = int8_measure.logits(self.float_onnx, images, self.settings.eval_batch)
        folder = self.work / "sensitivity"
        folder.mkdir(parents=True, exist_ok=True)
        ranked = []
        for node in compute_nodes(self.float_onnx):
            single = quantize(self.float_onnx, folder / "single.onnx", flavour, self.settings.calibration,
                              self.calib, self.cache, only=[node], reduce_range=self._reduce(flavour))
            error = self.output_error(reference, int8_measure.logits(single, images, self.settings.eval_batch))
            ranked.append({"node": node, "error": round(error, 6)})
        shutil.rmtree(folder, ignore_errors=True)
        return sorted(ranked, key=lambda r: -r["error"])

    def fallback(self, failed: Attempt) -> Attempt:
        """Keep the fewest most sensitive layers in float until the drop is within the red line."""
        # rank on the flavour that missed by most (the CPU file's, when it missed on another runtime); NNCF's
        # file is ranked with onnxruntime's symmetric int8 (the trt layout), the scheme closest to its default
        flavour = max(failed.drops, key=failed.drops.get).flavour
        flavour = TRT.name if FLAVOURS[flavour].made_by == "nncf" else flavour
        ranked = self.sensitivity(flavour)
        self.log(f"fallback: most sensitive layers ({flavour}): "
                 + ", ".join(f"{r['node']} {r['error']:.2e}" for r in ranked[:5]))
        tries, best = [], None
        for k in range(1, min(self.settings.max_float_layers, len(ranked)) + 1):
            exclude = [r["node"] for r in ranked[:k]]
            attempt = self.measure("fallback", self._quantize_all(f"fallback-{k}", exclude), float_layers=exclude)
            tries.append({"float_layers": k, "drops": {str(c): round(d, 4) for c, d in attempt.drops.items()}})
            if best is None or attempt.worst() < best.worst():
                best = attempt
            if attempt.within:
                break
        if best is None:  # nothing to keep in float: the model has no Conv/Gemm/MatMul
            return failed
        best.details = {**best.details, "ranked_on": flavour, "sensitivity": ranked, "tries": tries,
                        "max_float_layers": self.settings.max_float_layers}
        return best


def latency_fallback(ladder: Ladder, chosen: Attempt, settings: LatencyFallbackSettings) -> dict | None:
    """Keep in float the layer groups whose INT8 costs the CPU file time on onnxruntime (see latency_fallback),
    judged on validation like any rung (on every runtime the CPU file is checked on); the chosen attempt's CPU
    file, accuracy and drops are replaced where a faster file within the red line is found. None where nothing
    was tried (no CPU file, a QAT file, which is not re-quantized, or no such groups in the graph)."""
    s = ladder.settings
    if not settings.enabled or "cpu" not in chosen.files or chosen.rung == "qat":
        return None
    groups = layer_groups(ladder.float_onnx)
    if not groups:
        ladder.log("latency fallback: no squeeze-excite, depthwise, hard-activation or upsampling layers to try in "
                   "float")
        return None
    folder = ladder.work / "latency"
    folder.mkdir(parents=True, exist_ok=True)
    base = [*s.keep_float, *chosen.float_layers]

    def make(nodes: list[str], tag: str) -> Path:
        return quantize(ladder.float_onnx, folder / f"{tag}.onnx", "cpu", s.calibration, ladder.calib, ladder.cache,
                        exclude=[*base, *nodes], reduce_range=ladder._reduce("cpu"))

    def scores(path: Path) -> dict[str, dict]:
        return {Check.own(CPU.name): ladder.judge(path, CPU.judged_on), **ladder.cpu_elsewhere(path)}

    judged: dict[Path, dict] = {}

    def judge(path: Path) -> float:
        judged[path] = scores(path)
        return max(ladder.reference - v[s.metric] for v in judged[path].values())

    pool = ladder.val_images[:16 * s.serve_batch]

    def time_against(current: Path, files: dict[str, Path]) -> dict[str, dict]:
        # every group of a round is a comparison: their 95% intervals are widened together (Bonferroni)
        return int8_measure.p50_ratios(current, files, pool, min_iters=settings.min_iters, threads=s.runtime_threads,
                                       batch_size=s.serve_batch, level=1 - 0.05 / max(len(files), 1))

    ladder_file = chosen.files["cpu"]
    record = greedy(groups, make, time_against, judge, ladder_file, s.max_drop, settings, log=ladder.log)
    if record["kept_float"]:
        # the winner's own ratio was measured in the run that picked it: confirm it in a fresh run, or keep the
        # ladder's file
        confirm = int8_measure.p50_ratios(ladder_file, {"final": record["file"]}, pool, min_iters=settings.min_iters,
                                          threads=s.runtime_threads, batch_size=s.serve_batch)["final"]
        record["confirmed"] = confirm
        if confirm["ci"][1] >= 1.0:
            ladder.log(f"latency fallback: a fresh run did not confirm the gain (p50 ×{confirm['ratio']:.2f} "
                       f"[{confirm['ci'][0]:.2f}, {confirm['ci'][1]:.2f}]): the CPU file stays as the ladder made it")
            record.update(kept_float=[], float_nodes=[], file=ladder_file)
    if record["kept_float"]:
        chosen.files["cpu"] = record["file"]
        for key, value in judged[record["file"]].items():
            chosen.val[key], chosen.drops[key] = value, ladder.reference - value[s.metric]
        ladder.log(f"latency fallback: the CPU file keeps {', '.join(record['kept_float'])} in float "
                   f"({len(record['float_nodes'])} layers), {record['seconds']:.0f} s")
    else:
        ladder.log(f"latency fallback: no layer group was measurably faster in float ({record['seconds']:.0f} s)")
    record["resize"] = _resize_record(Path(record["file"]), "upsampling (Resize)" in record["kept_float"])
    if record["resize"]:
        ladder.log("upsampling: " + "; ".join(f"{r['node']} ({r['mode']}) {r['runs']}: {r['why']}"
                                              for r in record["resize"]))
    record["file"] = Path(record["file"]).name
    chosen.details["latency_fallback"] = record
    return record


def _resize_record(cpu_file: Path, kept: bool) -> list[dict]:
    """Each Resize of the shipped CPU file, how it runs and why."""
    out = []
    for r in resize_nodes(cpu_file):
        if r["mode"] == "nearest":
            why = "nearest: copies values, exact in INT8, so not tried in float"
        elif kept and r["runs"] == "float":
            why = "kept float: measurably faster in float, within the red line (latency fallback)"
        elif kept:
            why = ("excluded from quantization, but its input and output share one scale, so the runtime folds it to "
                   "integers anyway")
        elif r["runs"] == "int8":
            why = "float upsampling was not measurably faster (latency fallback)"
        else:
            why = "float: its neighbours were kept float (accuracy fallback)"
        out.append({**r, "why": why})
    return out


def choose(attempts: list[Attempt]) -> Attempt:
    """The first rung within the red line, else the one that came closest."""
    return next((a for a in attempts if a.within), None) or min(attempts, key=Attempt.worst)


def climb(first: Callable[[], Attempt], rungs: list[tuple[str, Callable[[Attempt], Attempt]]], max_drop: float,
          log: Callable[[str], None] = lambda message: None) -> tuple[list[Attempt], list[str]]:
    """Run ``first``, then each later rung in order while the latest attempt misses the red line.

    Returns every attempt and, per rung climbed past, why. A rung that cannot run here
    (``RungUnavailable``) ends the climb with its reason recorded; the closest earlier
    attempt is then what ``choose`` ships, marked as missing the red line.
    """
    attempts, climbed = [first()], []
    for name, rung in rungs:
        if attempts[-1].within:
            break
        climbed.append(attempts[-1].why_not(max_drop))
        try:
            attempts.append(rung(attempts[-1]))
        except RungUnavailable as exc:
            climbed.append(f"{name}: could not run: {exc}")
            log(f"{name} could not run, keeping the closest earlier rung: {exc}")
            break
    return attempts, climbed
