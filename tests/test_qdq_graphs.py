"""The TensorRT Q/DQ lint on small hand-made graphs, and the exact int8 → uint8 activation rewrite."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from compress.quantization.qdq_lint import lint_qdq
from compress.quantization.qdq_rewrite import int8_to_uint8_activations

OUT, IN = 4, 3


def _graph(*, act_scale=0.05, act_zero=0, act_type=np.int8, weight_scales=None, scale_is_input=False,
           drop_act_zero=False, float_conv=False, relu=False, clip=False) -> onnx.ModelProto:
    """x → [Relu] → Q → DQ → Conv(DQ(int8 W)) → y, with one knob per lint rule."""
    rng = np.random.default_rng(0)
    weight = rng.integers(-100, 100, size=(OUT, IN, 3, 3)).astype(np.int8)
    w_scales = np.full(OUT, 0.01, np.float32) if weight_scales is None else np.asarray(weight_scales, np.float32)
    inits = [numpy_helper.from_array(weight, "w_q"), numpy_helper.from_array(w_scales, "w_scale"),
             numpy_helper.from_array(np.zeros(w_scales.shape, np.int8), "w_zero"),
             numpy_helper.from_array(np.array(act_zero, dtype=act_type), "a_zero")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", IN, 8, 8])]
    if scale_is_input:
        inputs.append(helper.make_tensor_value_info("a_scale", TensorProto.FLOAT, []))
    else:
        inits.append(numpy_helper.from_array(np.array(act_scale, np.float32), "a_scale"))
    nodes = []
    source = "x"
    if relu:
        nodes.append(helper.make_node("Relu", ["x"], ["r"], name="relu"))
        source = "r"
    if clip:  # ReLU6 as exported: Clip(x, 0, 6)
        inits += [numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
                  numpy_helper.from_array(np.array(6.0, np.float32), "hi")]
        nodes.append(helper.make_node("Clip", ["x", "lo", "hi"], ["r"], name="relu6"))
        source = "r"
    q_inputs = [source, "a_scale"] + ([] if drop_act_zero else ["a_zero"])
    nodes += [helper.make_node("QuantizeLinear", q_inputs, ["xq"], name="q_x"),
              helper.make_node("DequantizeLinear", ["xq", "a_scale"] + ([] if drop_act_zero else ["a_zero"]),
                               ["xd"], name="dq_x"),
              helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zero"], ["wd"], name="dq_w", axis=0)]
    nodes.append(helper.make_node("Conv", ["x" if float_conv else "xd", "wd"], ["y"], name="conv", pads=[1, 1, 1, 1]))
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", OUT, 8, 8])],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def test_a_clean_symmetric_graph_passes():
    result = lint_qdq(_graph())
    assert result.ok, result.violations
    assert result.qdq_nodes == 3 and result.float_compute == []


@pytest.mark.parametrize("knobs, message", [
    ({"scale_is_input": True}, "a_scale is not a constant"),
    ({"act_scale": -0.05}, "scale has values ≤ 0"),
    ({"act_scale": 0.0}, "scale has values ≤ 0"),
    ({"act_zero": 3}, "zero-point is not 0"),
    ({"act_type": np.uint8, "act_zero": 128}, "quantized type is uint8"),
    ({"drop_act_zero": True}, "quantized type is uint8"),
    ({"weight_scales": [0.01]}, "per tensor"),
    ({"float_conv": True}, "input not quantized"),
])
def test_each_violation_is_caught_and_named(knobs, message):
    result = lint_qdq(_graph(**knobs))
    assert not result.ok
    assert any(message in v for v in result.violations), result.violations


def test_a_float_layer_kept_on_purpose_is_reported_but_allowed():
    result = lint_qdq(_graph(float_conv=True), allowed_float={"conv"})
    assert result.ok and result.float_compute == ["conv"]


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_rewrite_to_uint8_is_exact_for_signed_activations():
    model = _graph()
    x = np.random.default_rng(1).normal(size=(2, IN, 8, 8)).astype(np.float32) * 3  # some saturate at ±127
    rewritten, moved = int8_to_uint8_activations(model)
    onnx.checker.check_model(rewritten, full_check=True)
    zero = next(t for t in rewritten.graph.initializer if t.name.endswith("_zp_u8"))
    assert moved == 1 and numpy_helper.to_array(zero).dtype == np.uint8 and numpy_helper.to_array(zero) == 128
    np.testing.assert_array_equal(_run(rewritten, x), _run(model, x))
    assert lint_qdq(rewritten).violations  # the CPU layout is exactly what the TensorRT lint refuses


@pytest.mark.parametrize("activation", ["relu", "clip"])
def test_rewrite_after_relu_uses_zero_point_zero_and_keeps_the_clipping_point(activation):
    model = _graph(act_scale=0.02, **{activation: True})
    x = np.random.default_rng(2).normal(size=(2, IN, 8, 8)).astype(np.float32) * 2  # some above 127 · scale
    rewritten, _ = int8_to_uint8_activations(model)
    consts = {t.name: numpy_helper.to_array(t) for t in rewritten.graph.initializer}
    q = next(n for n in rewritten.graph.node if n.op_type == "QuantizeLinear")
    assert consts[q.input[2]] == 0 and consts[q.input[1]] == pytest.approx(0.02 * 127 / 255)
    # Rounding on the finer grid moves each activation by at most half of each step; |weight| ≤ 1.
    bound = (0.02 + 0.02 * 127 / 255) / 2 * IN * 9
    assert np.abs(_run(model, x) - _run(rewritten, x)).max() <= bound
    # Saturated activations (10 ≫ 127 · 0.02) clip at the same value in both layouts.
    big = np.full((1, IN, 8, 8), 10.0, np.float32)
    np.testing.assert_allclose(_run(rewritten, big), _run(model, big), rtol=1e-5, atol=1e-5)
    assert "a_zero" not in consts  # the replaced int8 zero-point is not left behind
