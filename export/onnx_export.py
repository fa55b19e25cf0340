"""torch → ONNX with the dynamo exporter: dynamic batch, pinned opset, one self-contained file.

The opset is pinned (not "latest") so an artifact built today loads in the runtime a
user deploys next year, and recorded with the file. fp16 export casts inside the graph
by default so callers keep feeding float32 images and reading float32 logits.
"""
from __future__ import annotations

import contextlib
import copy
import io
import time
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import torch
from torch import nn

from export.errors import ExportLibraryError

TWO_GB = 2 * 1024**3
INPUT_NAME, OUTPUT_NAME = "input", "logits"


class ExportError(ExportLibraryError):
    """The exporter or the ONNX checker rejected the model."""


@dataclass
class ExportInfo:
    path: Path
    opset: int
    precision: str
    io_dtype: str
    input_name: str
    output_name: str
    external_data: bool
    seconds: float
    simplified: bool = False
    files: list[str] = field(default_factory=list)


class _HalfPrecision(nn.Module):
    """Weights and compute in fp16; the graph casts at its edges unless fp16 I/O is declared."""

    def __init__(self, model: nn.Module, cast_io: bool) -> None:
        super().__init__()
        self.model, self.cast_io = model.half(), cast_io

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.cast_io:
            return self.model(x.half()).float()
        return self.model(x)


def _param_bytes(model: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def export_onnx(model: nn.Module, sample: torch.Tensor, path: str | Path, *, opset: int = 18,
                precision: str = "fp32", io_dtype: str = "fp32", simplify: bool = False,
                captured: bool = False) -> ExportInfo:
    """Export ``model`` (left unchanged) to ``path``; the batch dimension stays dynamic.

    ``captured``: ``model`` is already a ``torch.export`` graph (a converted QAT model with
    quantize/dequantize ops); it is exported as it is, without a copy or ``.eval()``, which
    such graphs refuse, and with the batch bounds it was captured with.
    """
    path = Path(path)
    if precision not in ("fp32", "fp16"):
        raise ValueError(f"precision must be fp32 or fp16, got {precision!r}")
    if precision == "fp32" and io_dtype != "fp32":
        raise ValueError("io_dtype fp16 needs precision fp16")
    module = model if captured else copy.deepcopy(model).eval().cpu()
    if precision == "fp16":
        module = _HalfPrecision(module, cast_io=(io_dtype == "fp32")).eval()
    example = sample.to(torch.float16) if io_dtype == "fp16" else sample.float()
    external = _param_bytes(module) >= TWO_GB
    start = time.perf_counter()
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log), torch.no_grad():
            program = torch.onnx.export(
                module, (example,), dynamo=True, opset_version=opset, input_names=[INPUT_NAME],
                output_names=[OUTPUT_NAME], dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=4096)},),
                external_data=external)
    except Exception as exc:  # the exporter raises many types; all mean "this model did not export"
        raise ExportError(f"torch.onnx.export failed for {type(model).__name__}: {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''}") from exc
    program.save(str(path), external_data=external)
    if captured:
        _drop_trace_metadata(path)
    simplified = False
    if simplify:
        _simplify(path)
        simplified = True
    check(path)
    files = sorted(p.name for p in path.parent.iterdir() if p.name.startswith(path.name))
    return ExportInfo(path=path, opset=opset, precision=precision, io_dtype=io_dtype, input_name=INPUT_NAME,
                      output_name=OUTPUT_NAME, external_data=external, seconds=time.perf_counter() - start,
                      simplified=simplified, files=files)


def _drop_trace_metadata(path: Path) -> None:
    """A converted QAT graph carries the exporter's per-node stack traces: over half the file for a
    small model. They help debugging the exporter, not deploying, so the file keeps only the graph."""
    model = onnx.load(str(path))
    for node in model.graph.node:
        del node.metadata_props[:]
    onnx.save(model, str(path))


def _simplify(path: Path) -> None:
    try:
        import onnxslim
    except ImportError as exc:
        raise ExportError("simplify: true needs onnxslim (pip install onnxslim)") from exc
    slimmed = onnxslim.slim(onnx.load(str(path)))
    onnx.save(slimmed, str(path))


def check(path: str | Path) -> None:
    """onnx.checker's full check (shape inference included); by path so files over 2 GB work."""
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise ExportError(f"onnx.checker rejected {path}: {str(exc).splitlines()[0]}") from exc
