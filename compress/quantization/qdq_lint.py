"""Checks a Q/DQ ONNX model against what TensorRT's explicit quantization needs.

TensorRT builds an INT8 engine from a Q/DQ graph only when every scale is a constant, every
zero-point is 0 and every quantized type is int8; a weight quantized per tensor instead of
per output channel, or a Conv/Gemm/MatMul whose inputs are not dequantized, silently stays
in float and shows up later as the slowest layer of the engine. Finding these on the ONNX
file takes milliseconds; finding them in an engine profile takes a GPU and an afternoon.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
COMPUTE_OPS = ("Conv", "Gemm", "MatMul")


@dataclass
class LintResult:
    violations: list[str] = field(default_factory=list)
    float_compute: list[str] = field(default_factory=list)  # Conv/Gemm/MatMul without quantized inputs
    qdq_nodes: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations

    def as_dict(self) -> dict:
        return {"ok": self.ok, "violations": self.violations, "float_compute": self.float_compute,
                "qdq_nodes": self.qdq_nodes}


def graph_constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Every constant of the graph by name: initializers and Constant nodes (the dynamo exporter writes both)."""
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    values[node.output[0]] = numpy_helper.to_array(attr.t)
    return values


def _axis(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "axis"), 1)


def lint_qdq(model: onnx.ModelProto | str | Path, allowed_float: set[str] | frozenset[str] = frozenset()) -> LintResult:
    """Every violation, named by node; ``allowed_float`` are compute nodes deliberately kept in float."""
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model), load_external_data=False)
    graph = model.graph
    consts = graph_constants(graph)
    producer = {out: node for node in graph.node for out in node.output}
    result = LintResult()
    for node in graph.node:
        if node.op_type not in QDQ_OPS:
            continue
        result.qdq_nodes += 1
        label = f"{node.op_type} {node.name or node.output[0]}"
        scale = consts.get(node.input[1]) if len(node.input) > 1 else None
        if scale is None:
            result.violations.append(f"{label}: scale {node.input[1] if len(node.input) > 1 else '?'} is not a constant")
        elif not np.all(np.isfinite(scale)) or not np.all(scale > 0):
            result.violations.append(f"{label}: scale has values ≤ 0 or not finite (min {float(np.min(scale)):g})")
        zero_name = node.input[2] if len(node.input) > 2 else ""
        zero = consts.get(zero_name) if zero_name else None
        if zero_name and zero is None:
            result.violations.append(f"{label}: zero-point {zero_name} is not a constant")
            continue
        data = consts.get(node.input[0]) if node.op_type == "DequantizeLinear" else None
        # The quantized type is the zero-point's; without one, a constant's own type, else uint8 (ONNX default).
        qtype = zero.dtype if zero is not None else data.dtype if data is not None else np.dtype(np.uint8)
        if qtype != np.int8:
            result.violations.append(f"{label}: quantized type is {qtype}, TensorRT needs int8")
        if zero is not None and np.any(zero != 0):
            result.violations.append(f"{label}: zero-point is not 0 (asymmetric); TensorRT needs symmetric")
    for node in graph.node:
        if node.op_type not in COMPUTE_OPS:
            continue
        label = f"{node.op_type} {node.name or node.output[0]}"
        ins = [producer.get(name) for name in node.input[:2]]
        dequantized = [p is not None and p.op_type == "DequantizeLinear" for p in ins]
        if not all(dequantized):
            result.float_compute.append(node.name or node.output[0])
            if (node.name or node.output[0]) not in allowed_float:
                missing = " and ".join(("input", "weight")[i] for i, ok in enumerate(dequantized) if not ok)
                result.violations.append(f"{label}: {missing} not quantized, the layer runs in float")
            continue
        weight_dq = ins[1]
        assert weight_dq is not None
        weight = consts.get(weight_dq.input[0])
        scale = consts.get(weight_dq.input[1])
        if weight is None or scale is None:
            continue
        out_axis = 0 if node.op_type == "Conv" else _out_axis(node, weight)
        channels = weight.shape[out_axis] if weight.ndim else 1
        if channels > 1 and (scale.size != channels or _axis(weight_dq) % max(weight.ndim, 1) != out_axis):
            result.violations.append(f"{label}: weight quantized per tensor (scale of {scale.size}), "
                                     f"not per output channel ({channels} channels on axis {out_axis})")
    return result


def _out_axis(node: onnx.NodeProto, weight: np.ndarray) -> int:
    if node.op_type == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return 0 if trans_b else 1
    return weight.ndim - 1  # MatMul: x @ W, output channels last
