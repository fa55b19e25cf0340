"""Why an INT8 file loses to its float file, read from the two operator profiles: known answers on made-up
profiles, and the gate's flag carrying the answer."""
from __future__ import annotations

import pytest

from serve_bench.report.int8_flags import quantized_not_faster
from serve_bench.latency.profile_comparison import family_times, int8_loss_reasons, kernel_precisions
from tests.report_entries import as_entries


def _profile(runtime: str, ops: dict[str, float], kernels: tuple[str, ...] = (), run_ms: float | None = None,
             kernel_op: str = "Convolution") -> dict:
    return {"runtime": runtime, "run_ms": run_ms, "ops": [{"op": op, "ms_per_run": ms} for op, ms in ops.items()],
            "top_nodes": [{"node": f"n{i}", "op": kernel_op, "provider": k} for i, k in enumerate(kernels)]}


def test_op_types_of_either_runtime_fall_into_families_and_kernel_names_give_precisions():
    times = family_times(_profile("openvino", {"Convolution": 0.5, "GroupConvolution": 0.2, "FakeQuantize": 0.1,
                                               "ReduceMean": 0.05}))
    assert times == pytest.approx({"convolutions": 0.5, "depthwise/grouped convolutions (OpenVINO)": 0.2,
                                   "quantize/dequantize and layout conversions": 0.1, "pooling": 0.05})
    assert family_times(_profile("onnxruntime", {"QLinearConv": 0.3, "Conv": 0.1}))["convolutions"] == pytest.approx(0.4)
    assert kernel_precisions(_profile("openvino", {}, ("brgconv_avx512_amx_bf16", "jit_avx512_I8"))) == {"bf16", "int8"}
    assert kernel_precisions(_profile("onnxruntime", {}, ("CPUExecutionProvider",))) == set()


def test_the_family_that_grew_is_named_with_times_scaled_to_each_files_p50():
    """Shares times the un-profiled p50: the int8 file's depthwise share (50% of 1.0 ms) against the float file's
    (20% of 1.0 ms) is 0.5 against 0.2 ms; the convolutions (0.4 against 0.7) shrank and are not named."""
    int8 = _profile("openvino", {"Convolution": 4.0, "GroupConvolution": 5.0, "FakeQuantize": 1.0})
    fp32 = _profile("openvino", {"Convolution": 7.0, "GroupConvolution": 2.0, "Reorder": 1.0})
    words = int8_loss_reasons(int8, 1.0, fp32, 1.0)
    assert words.startswith("more of the int8 file's p50 goes to depthwise/grouped convolutions (OpenVINO) ≈0.500 ms "
                            "against ≈0.200")
    assert "convolutions ≈0.400" not in words and "rough" not in words and "bf16" not in words


def test_a_float_file_run_in_bf16_and_a_slowing_profiler_are_said():
    int8 = _profile("openvino", {"Convolution": 1.0}, ("brgconv_avx512_amx_I8",))
    fp32 = _profile("openvino", {"Convolution": 1.0}, ("brgconv_avx512_amx_bf16",), run_ms=1.0)
    words = int8_loss_reasons(int8, 1.0, fp32, 1.0)
    assert words.startswith("no part of the int8 file's p50 is longer than the float file's by more than 5%")
    assert "the float file ran bf16 kernels" in words and "rough" not in words
    slowed = _profile("openvino", {"Convolution": 1.0}, ("brgconv_avx512_amx_I8",), run_ms=3.0)
    assert "the profiler slowed the int8 file 3.0×, so these shares are rough" in int8_loss_reasons(slowed, 1.0,
                                                                                                   fp32, 1.0)
    kept_float = _profile("openvino", {"Convolution": 1.0}, ("brgconv_avx512_amx_f32",))
    assert "none of the int8 file's 1 slowest convolution or matrix layers ran an int8 kernel" in \
        int8_loss_reasons(kept_float, 1.0, fp32, 1.0)
    # a layout conversion's f32 kernel among the top layers says nothing about the convolutions
    reorder = _profile("openvino", {"Convolution": 1.0}, ("jit_avx512_f32",), kernel_op="Reorder")
    assert "int8 kernel" not in int8_loss_reasons(reorder, 1.0, fp32, 1.0)
    # what the runner says it ran the float file in decides over the kernel names
    assert "bf16" not in int8_loss_reasons(int8, 1.0, fp32, 1.0, float_precision="f32")


def test_time_outside_the_operators_is_its_own_part_of_the_p50():
    """The operators took half of each profiled run: half of each p50 is theirs, shared by family; the int8
    file's larger time outside them (its p50 is 2.0 against 1.0) is named as such, not spread over families."""
    int8 = _profile("onnxruntime", {"QLinearConv": 1.0}, run_ms=2.0)
    fp32 = _profile("onnxruntime", {"Conv": 1.0}, run_ms=2.0)
    words = int8_loss_reasons(int8, 2.0, fp32, 1.0)
    assert words.startswith("more of the int8 file's p50 goes to ")
    assert "convolutions ≈1.000 ms against ≈0.500" in words
    assert "time outside the operators (session, copies) ≈1.000 ms against ≈0.500" in words


def test_no_answer_without_two_profiles_of_one_runtime():
    ok = _profile("onnxruntime", {"Conv": 1.0})
    assert int8_loss_reasons(None, 1.0, ok, 1.0) is None
    assert int8_loss_reasons({"error": "no profiler"}, 1.0, ok, 1.0) is None
    assert int8_loss_reasons(_profile("openvino", {"Convolution": 1.0}), 1.0, ok, 1.0) is None
    assert int8_loss_reasons(_profile("onnxruntime", {"Conv": 0.0}), 1.0, ok, 1.0) is None  # no time to share


def test_the_int8_flag_carries_the_profiles_answer():
    fp32 = {"name": "export.onnx", "precision": "fp32", "format": "onnx", "runtime": "openvino",
            "source_model": "prune.model", "latency_ms": {"p50": 1.0, "p99": 2.0}, "runner": {"device": "cpu"},
            "operator_profile": _profile("openvino", {"Convolution": 1.0}, ("brgconv_avx512_amx_bf16",))}
    int8 = {**fp32, "name": "quantize.onnx_cpu", "precision": "int8", "latency_ms": {"p50": 1.1, "p99": 2.2},
            "operator_profile": _profile("openvino", {"Convolution": 1.0, "FakeQuantize": 0.5})}
    flag = quantized_not_faster(as_entries([fp32, int8]), {"int8_dot_product": "AMX-INT8"})[0]
    assert ". From the operator profiles: more of the int8 file's p50 goes to quantize/dequantize" in flag
    assert "the float file ran bf16 kernels" in flag
    on_gpu = {**int8, "runner": {"device": "cuda"}}  # timed on a GPU: a CPU profile does not explain it
    assert "From the operator profiles" not in quantized_not_faster(as_entries([fp32, on_gpu]))[0]
    del int8["operator_profile"]
    assert "From the operator profiles" not in quantized_not_faster(as_entries([fp32, int8]))[0]
