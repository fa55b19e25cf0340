"""Channel counts read from a file, the multiple the runtimes want, and the flag on a file slower than the unpruned."""
from __future__ import annotations

import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from export.onnx_export import export_onnx
from serve_bench.report.profile import slower_than_unpruned_flags
from serve_bench.runners import OnnxRuntimeRunner, OpenVinoRunner
from serve_bench.runners.channel_widths import conv_widths, isa_class, wanted_multiple
from tests.report_entries import as_entries

AVX512 = {"avx512_f": True, "avx2": True}
AVX2 = {"avx2": True}


def test_the_widths_of_a_pruned_file_and_those_off_the_multiple(tmp_path):
    model = nn.Sequential(nn.Conv2d(3, 9, 3), nn.ReLU(), nn.Conv2d(9, 9, 3, groups=9), nn.Conv2d(9, 16, 1),
                          nn.Flatten(), nn.LazyLinear(4))
    model(torch.zeros(1, 3, 8, 8))
    path = export_onnx(model, torch.zeros(1, 3, 8, 8), tmp_path / "m.onnx").path
    widths = conv_widths(path)
    assert sorted(widths.widths.values()) == [9, 9, 16]
    assert widths.as_dict(8) == {"convolutions": 3, "multiple": 8, "off_multiple": 2, "examples": [9]}
    assert conv_widths(tmp_path / "absent.onnx") is None and conv_widths(tmp_path) is None


def test_a_qdq_file_s_weights_are_read_behind_their_dequantize(tmp_path):
    """A Q/DQ file's Conv takes its weight from a DequantizeLinear of an int8 initializer."""
    weight = numpy_helper.from_array(torch.zeros(12, 4, 1, 1, dtype=torch.int8).numpy(), "w_q")
    scale = numpy_helper.from_array(torch.ones(()).numpy(), "s")
    nodes = [helper.make_node("DequantizeLinear", ["w_q", "s"], ["w"], name="dq"),
             helper.make_node("Conv", ["x", "w"], ["y"], name="conv")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 2, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 12, 2, 2])],
                              initializer=[weight, scale])
    path = tmp_path / "qdq.onnx"
    onnx.save(helper.make_model(graph), path)
    assert conv_widths(path).widths == {"conv": 12}


def test_the_multiple_suits_every_runtime_and_says_why(monkeypatch):
    monkeypatch.setattr(OnnxRuntimeRunner, "channel_blocks", {"avx512": 16, "avx2": 8})
    monkeypatch.setattr(OpenVinoRunner, "channel_blocks", {"avx512": 8, "avx2": 4})
    multiple, reason = wanted_multiple(["onnxruntime", "openvino"], AVX512)
    assert multiple == 16 and "onnxruntime 16" in reason and "OpenVINO 8" in reason
    assert wanted_multiple(["openvino"], AVX2)[0] == 4
    assert wanted_multiple(["onnxruntime"], {})[0] == 1  # no AVX2: nothing measured, no rounding asked for
    assert isa_class({"avx512_f": True, "amx_tile": True}) == "amx" and isa_class(AVX2) == "avx2"


def _ratio(ratio, low, high):
    verdict = "faster" if high < 1 else "slower" if low > 1 else "not distinguishable"
    return {"ratio": ratio, "ci": [low, high], "verdict": verdict}


def _vs_unpruned(p50, p99):
    return {"reference": "export-alone:train.model", "p50": _ratio(*p50), "p99": _ratio(*p99)}


@pytest.mark.parametrize("off, unfused, cause", [
    (36, 0, "36 of its 49 convolutions have channel counts that are not a multiple of 16 (9, 15, 151"),
    (0, 12, "ran 12 Q/DQ nodes unfused"),
    (0, 0, "neither its channel counts nor unfused Q/DQ explain it"),
])
def test_a_file_slower_than_the_unpruned_export_is_flagged_with_its_likely_cause(off, unfused, cause):
    widths = {"file": {"convolutions": 49, "multiple": 16, "off_multiple": off, "examples": [9, 15, 151]},
              "unpruned": {"convolutions": 49, "multiple": 16, "off_multiple": 0, "examples": []}}
    slow = {"name": "prune.onnx", "vs_export_alone": _vs_unpruned((2.97, 2.72, 3.53), (2.5, 2.1, 3.0)),
            "channel_widths": widths,
            "operator_profile": {"unfused_qdq": [{"node": f"q{i}", "ms_per_run": 0.01} for i in range(unfused)]}}
    fast = {"name": "quantize.onnx_cpu", "vs_export_alone": _vs_unpruned((0.6, 0.5, 0.7), (0.9, 0.7, 1.2)),
            "channel_widths": widths}
    flags = slower_than_unpruned_flags(as_entries([slow, fast]))
    assert len(flags) == 1 and flags[0].startswith("prune.onnx is slower than the unpruned model exported")
    assert "p50 ×2.97 [2.72, 3.53]" in flags[0] and cause in flags[0]
