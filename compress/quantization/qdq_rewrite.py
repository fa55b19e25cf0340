"""Derives the CPU Q/DQ flavour from a symmetric-int8 one without changing a single value.

A QAT model is trained once, with symmetric int8 activations (the TensorRT layout). The
CPU layout wants uint8 activations; shifting every activation zero-point from 0 (int8) to
128 (uint8) is exact: ``q_u8 = q_i8 + 128`` over the whole int8 range, and dequantization
subtracts the same 128. Weights stay int8. One training run therefore yields both files.

After a ReLU the zero-point goes to 0 instead: onnxruntime then drops the ReLU into the
quantization and fuses DQ → Conv → Q into QLinearConv; with zero-point 128 it cannot (the
range would still hold negatives) and the convolution stays in float. The scale becomes
127/255 of the int8 one, so the tensor still saturates exactly where QAT trained it to
(127 · scale) but on a grid twice as fine: not bit-exact there, never coarser. The CPU file
is measured on its own, so any difference shows in its accuracy.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from compress.quantization.qdq_lint import graph_constants


def _non_negative(consts: dict[str, np.ndarray], node: onnx.NodeProto | None) -> bool:
    """A ReLU, or a Clip with a constant lower bound ≥ 0 (ReLU6): the tensor has no negatives."""
    if node is None:
        return False
    if node.op_type == "Relu":
        return True
    if node.op_type == "Clip" and len(node.input) > 1 and node.input[1]:
        low = consts.get(node.input[1])
        return low is not None and float(np.min(low)) >= 0
    return False


def int8_to_uint8_activations(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` with every activation Q/DQ pair moved to uint8; returns it and the pairs moved."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    constants = graph_constants(graph)  # the original graph's, looked up by name below
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    shapes = {vi.name: vi for vi in graph.value_info}
    producer = {out: node for node in graph.node for out in node.output}
    moved = 0
    for node in list(graph.node):
        if node.op_type != "QuantizeLinear" or node.input[0] in constants:
            continue
        if len(node.input) < 3 or not node.input[2]:
            raise ValueError(f"QuantizeLinear {node.name}: no zero-point, so it is already uint8")
        zero = constants.get(node.input[2])
        if zero is None or zero.dtype != np.int8 or np.any(zero != 0):
            raise ValueError(f"QuantizeLinear {node.name}: expected a constant int8 zero-point of 0, got {zero}")
        after_relu = _non_negative(constants, producer.get(node.input[0]))
        base = node.name or node.output[0]
        shifted = numpy_helper.from_array(np.full(zero.shape, 0 if after_relu else 128, dtype=np.uint8), f"{base}_zp_u8")
        graph.initializer.append(shifted)
        node.input[2] = shifted.name
        if after_relu:
            scale = constants.get(node.input[1])
            if scale is None:
                raise ValueError(f"QuantizeLinear {node.name}: scale {node.input[1]} is not a constant")
            finer = numpy_helper.from_array((scale * (127.0 / 255.0)).astype(scale.dtype), f"{base}_scale_u8")
            graph.initializer.append(finer)
            node.input[1] = finer.name
        if node.output[0] in shapes:  # the exporter's recorded type of the quantized tensor
            shapes[node.output[0]].type.tensor_type.elem_type = onnx.TensorProto.UINT8
        for dq in consumers.get(node.output[0], []):
            if dq.op_type != "DequantizeLinear":
                raise ValueError(f"QuantizeLinear {node.name} feeds {dq.op_type} {dq.name}, not a DequantizeLinear")
            while len(dq.input) < 3:
                dq.input.append("")
            dq.input[1], dq.input[2] = node.input[1], shifted.name
        moved += 1
    _drop_unused_initializers(graph)  # the int8 zero-points replaced above
    return model, moved


def _drop_unused_initializers(graph: onnx.GraphProto) -> None:
    used = {name for node in graph.node for name in node.input}
    for tensor in [t for t in graph.initializer if t.name not in used]:
        graph.initializer.remove(tensor)


# onnxruntime's own reduce_range range for signed weights: |q| ≤ 64, so a uint8 × int8 pair
# sums to at most 2 · 255 · 64 = 32,640, inside the 16 bits that vpmaddubsw adds pairs into.
WEIGHT_7BIT_MAX = 64


def weights_to_7bit(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` whose constant int8 weights use 7 bits (q/2 on a grid twice as coarse).

    Full-range int8 weights make onnxruntime's u8s8 kernels saturate on x86 CPUs without VNNI:
    measured on the quickstart's INT8 file, the same file gave logits up to 21% of their scale
    apart on AVX2 and on AVX-512 VNNI (3 of 1,000 test images changed class); with 7-bit
    weights both compute bit-identically. PTQ gets this from onnxruntime's ``reduce_range``;
    a QAT file, trained with 8-bit weights, gets it here. Unlike the activation rewrite this
    changes values (by at most one new step per weight), so the result is measured on its own.
    """
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    constants = graph_constants(graph)
    moved = 0
    for node in graph.node:
        weight = constants.get(node.input[0]) if node.op_type == "DequantizeLinear" else None
        if weight is None or weight.dtype != np.int8 or weight.ndim < 2:
            continue
        if int(np.abs(weight.astype(np.int16)).max()) <= WEIGHT_7BIT_MAX:
            continue
        scale = constants.get(node.input[1])
        if scale is None:
            raise ValueError(f"DequantizeLinear {node.name}: scale {node.input[1]} is not a constant")
        base = node.name or node.output[0]
        halved = np.clip(np.round(weight.astype(np.float32) / 2), -WEIGHT_7BIT_MAX, WEIGHT_7BIT_MAX).astype(np.int8)
        graph.initializer.append(numpy_helper.from_array(halved, f"{base}_w7"))
        graph.initializer.append(numpy_helper.from_array((scale * 2).astype(scale.dtype), f"{base}_w7_scale"))
        node.input[0], node.input[1] = f"{base}_w7", f"{base}_w7_scale"
        moved += 1
    _drop_unused_initializers(graph)  # the 8-bit weights and scales replaced above
    return model, moved
