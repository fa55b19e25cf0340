"""NNCF post-training quantization of an ONNX model, as an OpenVINO user does it by hand.

``nncf.quantize(onnx_model, nncf.Dataset(items, transform_fn), preset=..., subset_size=...)`` on
the fp32 ONNX file: NNCF's ONNX backend collects activation statistics with onnxruntime, applies
(fast) bias correction, and writes a Q/DQ ONNX file laid out for OpenVINO's INT8 kernels. It is
the reference the pipeline's own INT8 ladder (``compress.quantization.ptq``) is compared against.

Plain values in and out: a path, an image array, a small settings object; nncf is imported lazily
(it is optional), and its absence is :class:`NNCFUnavailable`.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import onnx

from compress.quantization import measure
from export.onnx_export import check
from serve_bench.accuracy.classification import accuracy

PRESETS = ("auto", "performance", "mixed")  # auto: NNCF's own choice for the model type (mixed for transformers)
MODEL_TYPES = ("auto", "cnn", "transformer")
INSTALL_HINT = "pip install 'compress[cpu]' (or pip install nncf)"


class NNCFUnavailable(ImportError):
    """nncf is not installed (or does not import)."""

    bad_input = True


class NNCFQuantizationError(Exception):
    """NNCF could not quantize the model; a failure of the run, not of the caller's input."""

    bad_input = False


@dataclass(frozen=True)
class NNCFSettings:
    preset: str = "performance"  # performance: symmetric activations and weights; mixed: asymmetric activations
    samples: int = 300  # calibration images (NNCF's subset_size)
    fast_bias_correction: bool = True
    # transformer: NNCF's scheme for attention and LayerNorm networks (model_type=TRANSFORMER); auto: when the
    # graph has attention (a Softmax between MatMuls), as NNCF's documentation asks for such models
    model_type: str = "cnn"

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(f"preset must be one of {PRESETS}, got {self.preset!r}")
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"model_type must be one of {MODEL_TYPES}, got {self.model_type!r}")
        if self.samples < 1:
            raise ValueError(f"samples must be ≥ 1, got {self.samples}")


@dataclass
class NNCFResult:
    path: Path
    nncf_version: str
    samples: int  # images NNCF actually calibrated on
    ops: dict[str, int]  # node types of the quantized graph
    seconds: float
    preset: str = "performance"  # the preset it ran with ("default" where NNCF chose by the model type)
    model_type: str = "cnn"
    ignored: tuple[str, ...] = ()  # nodes kept in float (NNCF's ignored scope)

    @property
    def qdq_pairs(self) -> int:
        return self.ops.get("QuantizeLinear", 0)


def nncf_version() -> str:
    """The installed nncf's version; :class:`NNCFUnavailable` with the install command where it does not import."""
    try:
        import nncf
    except ImportError as exc:  # absent, or blocked (sys.modules['nncf'] = None)
        raise NNCFUnavailable(f"NNCF is not installed ({exc}); install it with {INSTALL_HINT}") from exc
    return str(getattr(nncf, "__version__", "unknown"))


def _nncf_errors(nncf) -> tuple[type[Exception], ...]:
    """NNCF's own error classes (each derives from Exception directly) that mean "this model did not quantize"."""
    names = ("ValidationError", "InternalError", "UnsupportedModelError", "UnsupportedBackendError",
             "UnsupportedVersionError", "ParameterNotSupportedError", "UnsupportedDatasetError")
    return tuple(getattr(nncf.errors, name) for name in names if hasattr(nncf.errors, name))


def has_attention(model: onnx.ModelProto) -> bool:
    """A Softmax whose output feeds a MatMul: the attention NNCF's transformer scheme is made for."""
    consumers: dict[str, list[str]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node.op_type)
    return any(n.op_type == "Softmax" and "MatMul" in consumers.get(n.output[0], []) for n in model.graph.node)


def quantize_onnx(float_onnx: Path, out: Path, images: np.ndarray, settings: NNCFSettings,
                  log: Callable[[str], None] | None = None, ignored: Sequence[str] = ()) -> NNCFResult:
    """Quantize ``float_onnx`` with NNCF into ``out`` (a Q/DQ ONNX file checked by onnx's full checker).

    ``images`` are calibration images (never the test split), NCHW float32, fed one per item as
    an OpenVINO user's ``transform_fn`` does; at most ``settings.samples`` of them are used.
    ``ignored`` names nodes to keep in float (NNCF's ignored scope; names that are absent are skipped).
    """
    version = nncf_version()
    import nncf

    float_onnx, out = Path(float_onnx), Path(out)
    model = onnx.load(str(float_onnx))
    input_name = model.graph.input[0].name
    count = min(settings.samples, len(images))
    items = [np.ascontiguousarray(images[i:i + 1], dtype=np.float32) for i in range(count)]
    preset = {"auto": None, "performance": nncf.QuantizationPreset.PERFORMANCE, "mixed": nncf.QuantizationPreset.MIXED}
    model_type = settings.model_type if settings.model_type != "auto" else \
        "transformer" if has_attention(model) else "cnn"
    extra = {"model_type": nncf.ModelType.TRANSFORMER} if model_type == "transformer" else {}
    if ignored:
        extra["ignored_scope"] = nncf.IgnoredScope(names=list(ignored), validate=False)
    if log is not None:
        log(f"nncf {version}: quantizing {float_onnx.name} on {count} calibration images "
            f"(preset {settings.preset}, model type {model_type}, fast bias correction "
            f"{'on' if settings.fast_bias_correction else 'off'}"
            + (f", {len(ignored)} nodes kept in float" if ignored else "") + ")")
    start = time.perf_counter()
    try:
        quantized = nncf.quantize(model, nncf.Dataset(items, lambda image: {input_name: image}),
                                  preset=preset[settings.preset], subset_size=count,
                                  fast_bias_correction=settings.fast_bias_correction, **extra)
    except (*_nncf_errors(nncf), RuntimeError, ValueError) as exc:
        hint = "" if settings.fast_bias_correction else (
            "; NNCF's full bias correction (fast_bias_correction: false) fails on ONNX graphs whose residual branch "
            "has its own convolution (ResNet downsampling shortcuts, NNCF 3.4): try fast_bias_correction: true")
        raise NNCFQuantizationError(f"nncf.quantize failed on {float_onnx}: {type(exc).__name__}: {exc}{hint}") from exc
    seconds = time.perf_counter() - start
    onnx.save(quantized, str(out))
    check(out)  # onnx.checker, full check with shape inference
    ops = dict(Counter(n.op_type for n in quantized.graph.node))
    if not ops.get("QuantizeLinear") or not ops.get("DequantizeLinear"):
        raise NNCFQuantizationError(f"nncf.quantize returned {float_onnx.name} without QuantizeLinear/"
                                    f"DequantizeLinear nodes (node types: {ops}); nothing was quantized")
    return NNCFResult(path=out, nncf_version=version, samples=count, ops=ops, seconds=round(seconds, 2),
                      preset=settings.preset, model_type=model_type, ignored=tuple(ignored))


def compare_on_split(float_onnx: Path, int8_onnx: Path, images: np.ndarray, labels: np.ndarray) -> dict:
    """Top-k of the fp32 and the INT8 file through onnxruntime (the bench's runner), and how often their
    top-1 classes agree image by image (the measure of what quantization changed, whatever the labels)."""
    ref = measure.logits(Path(float_onnx), images)
    got = measure.logits(Path(int8_onnx), images)
    agreement = float(np.mean(ref.argmax(axis=1) == got.argmax(axis=1))) * 100.0 if len(images) else float("nan")
    return {"fp32": accuracy(ref, labels), "int8": accuracy(got, labels),
            "top1_agreement": round(agreement, 4), "n": int(len(images))}
