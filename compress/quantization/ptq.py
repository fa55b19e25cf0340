"""INT8 post-training quantization of an ONNX model with onnxruntime's quantization tools.

Two Q/DQ flavours come out of one calibration: the activation ranges are computed once per
calibration method (onnxruntime's calibration cache) and reused for both flavours and for
every partial-fallback attempt, so climbing the ladder does not re-run calibration.

- ``cpu``: uint8 activations (asymmetric) and int8 per-channel weights. onnxruntime's x86
  kernels fuse DQ → Conv → Q into QLinearConv only for this layout; symmetric int8
  activations leave about half the convolutions in float on the CPU.
- ``tensorrt``: int8 activations and weights, symmetric (zero-point 0), constant scales, float
  bias: what TensorRT's explicit quantization accepts.
"""
from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path
from typing import Iterator, Literal, get_args

import numpy as np
import onnx
from pydantic import Field

from compress.config import Strict
from compress.quantization.flavours import CPU, TRT
from compress.quantization.qdq_lint import COMPUTE_OPS

FLAVOURS = (CPU.name, TRT.name)  # the two layouts onnxruntime's quantize_static makes
Method = Literal["minmax", "percentile", "entropy", "distribution"]
METHODS: tuple[str, ...] = get_args(Method)


class QuantizationError(Exception):
    """onnxruntime could not calibrate or quantize the model (the quantization package's base error)."""

    bad_input = False


class Calibration(Strict):
    """How activation ranges are computed: onnxruntime's calibrators (it has no MSE calibrator)."""

    method: Method = Field("entropy", description="entropy (KL), percentile or minmax: how each activation's range "
                                                  "is chosen from the calibration images")
    percentile: float = Field(99.999, gt=50, le=100, description="percentile method only")
    batch_size: int = Field(32, ge=1, description="images per calibration inference")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """onnxruntime's quantizer logs every node it leaves alone on the root logger, and its histogram
    calibrators print progress; keep the stage log readable, and restore the caller's logging after."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        root.setLevel(level)


def _ort_method(name: str):
    from onnxruntime.quantization import CalibrationMethod

    return {"minmax": CalibrationMethod.MinMax, "percentile": CalibrationMethod.Percentile,
            "entropy": CalibrationMethod.Entropy, "distribution": CalibrationMethod.Distribution}[name]


def _reader(input_name: str, images: np.ndarray, batch_size: int):
    from onnxruntime.quantization import CalibrationDataReader

    class _Batches(CalibrationDataReader):
        """The calibration images in batches; ``set_range`` limits it to some of them, so that onnxruntime's
        calibrator can collect one batch at a time (its strided collection) instead of holding every activation
        of every image at once (EfficientNet-B0 at 224 px, 256 images: 23 GB, killed by the kernel)."""

        def __init__(self) -> None:
            self._range = (0, len(self))
            self._it = self._batches()

        def __len__(self) -> int:
            return -(-len(images) // batch_size)

        def _batches(self) -> Iterator[dict[str, np.ndarray]]:
            for index in range(*self._range):
                start = index * batch_size
                yield {input_name: np.ascontiguousarray(images[start:start + batch_size], dtype=np.float32)}

        def get_next(self):
            return next(self._it, None)

        def rewind(self) -> None:
            self._it = self._batches()

        def set_range(self, start_index: int, end_index: int) -> None:
            self._range = (start_index, min(end_index, len(self)))
            self._it = self._batches()

    return _Batches()


def preprocess(float_onnx: Path, out: Path) -> Path:
    """Shape inference and graph optimisation before quantization (onnxruntime's recommended first step)."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    try:
        quant_pre_process(str(float_onnx), str(out), skip_symbolic_shape=False)
    except Exception as exc:  # onnxruntime raises bare Exceptions from its optimizer
        raise QuantizationError(f"quant_pre_process failed on {float_onnx}: {exc}") from exc
    return out


def compute_nodes(model_path: Path) -> list[str]:
    """Names of the Conv/Gemm/MatMul nodes: the layers partial fallback may keep in float."""
    graph = onnx.load(str(model_path), load_external_data=False).graph
    return [n.name for n in graph.node if n.op_type in COMPUTE_OPS]


def quantize(float_onnx: Path, out: Path, flavour: str, calibration: Calibration, images: np.ndarray,
             cache: Path, exclude: list[str] | tuple[str, ...] = (), only: list[str] | None = None,
             reduce_range: bool = False) -> Path:
    """Write a Q/DQ model of ``flavour``; ``exclude`` keeps those nodes in float, ``only`` quantizes just those.

    ``reduce_range`` quantizes weights to 7 bits: x86 CPUs without VNNI multiply uint8 by int8
    in pairs summed in 16 bits, which full-range weights can saturate (see ``qdq_rewrite.weights_to_7bit``).

    ``images`` are the calibration images (never the test split); the ranges computed from
    them are cached in ``cache`` and reused by every later call with the same method.
    """
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    if flavour not in FLAVOURS:
        raise ValueError(f"flavour must be one of {FLAVOURS}, got {flavour!r}")
    if calibration.method not in METHODS:
        raise ValueError(f"calibration method must be one of {METHODS}, got {calibration.method!r}")
    input_name = onnx.load(str(float_onnx), load_external_data=False).graph.input[0].name
    trt = flavour == TRT.name
    # CalibStridedMinMax: despite its name, onnxruntime collects any method's statistics stride by stride (histograms
    # merge); one batch a stride bounds the memory by the batch, not by the calibration set
    extra = {"WeightSymmetric": True, "ActivationSymmetric": trt, "CalibPercentile": calibration.percentile,
             "CalibStridedMinMax": 1}
    if trt:
        extra["QuantizeBias"] = False  # TensorRT wants float bias, not an int32 DequantizeLinear
    try:
        with _quiet():
            quantize_static(str(float_onnx), str(out), _reader(input_name, images, calibration.batch_size),
                            quant_format=QuantFormat.QDQ, per_channel=True, reduce_range=reduce_range,
                            activation_type=QuantType.QInt8 if trt else QuantType.QUInt8,
                            weight_type=QuantType.QInt8, nodes_to_exclude=list(exclude), nodes_to_quantize=only,
                            calibrate_method=_ort_method(calibration.method), extra_options=extra,
                            calibration_cache_path=str(cache))
    except (ValueError, RuntimeError, onnx.checker.ValidationError) as exc:
        raise QuantizationError(f"onnxruntime could not quantize {float_onnx} ({flavour}, "
                                f"{calibration.method}): {exc}") from exc
    return out
