"""The tensors a served file takes and gives (names, shapes, dtypes), read from the file itself.

A server's configuration must name them exactly as the file does: Triton refuses a model whose
``config.pbtxt`` disagrees with it, and a client that guesses a name or a dtype gets an error
instead of an answer. So every configuration is written from these specs and checked against them.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import helper

from serve_bench.errors import BenchError


class ServedFileError(BenchError):
    """A file a server cannot be configured for: unreadable, or its tensors not what a server can batch."""


@dataclass(frozen=True)
class TensorSpec:
    """One input or output: its name, its numpy dtype's name and its shape, -1 where the file leaves a dimension
    open (the batch, usually)."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def batched(self) -> bool:
        """Whether the first dimension is open: then a server may batch requests along it."""
        return bool(self.shape) and self.shape[0] == -1

    def per_request(self) -> tuple[int, ...]:
        """The shape of one request's tensor without the batch dimension (what Triton's ``dims`` name)."""
        return self.shape[1:] if self.batched else self.shape


def _shape(value: onnx.ValueInfoProto) -> tuple[int, ...]:
    dims = value.type.tensor_type.shape.dim
    return tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in dims)


def onnx_tensors(path: str | Path) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The inputs (initializers left out: older exporters list weights as inputs) and the outputs of an ONNX file,
    read without its weights."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (OSError, DecodeError) as exc:
        raise ServedFileError(f"{path}: not a readable ONNX file ({type(exc).__name__}: {exc})") from exc
    weights = {init.name for init in model.graph.initializer}

    def spec(value: onnx.ValueInfoProto) -> TensorSpec:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)).name
        return TensorSpec(value.name, dtype, _shape(value))

    inputs = [spec(v) for v in model.graph.input if v.name not in weights]
    outputs = [spec(v) for v in model.graph.output]
    if not inputs or not outputs:
        raise ServedFileError(f"{path}: the graph has {len(inputs)} inputs and {len(outputs)} outputs; a served "
                              "model needs both")
    return inputs, outputs


def batchable(inputs: list[TensorSpec], outputs: list[TensorSpec]) -> bool:
    """Whether every tensor has an open first dimension, so a dynamic batcher may stack requests along it."""
    return all(t.batched for t in [*inputs, *outputs])
