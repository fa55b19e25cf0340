"""Per-operator profiles: onnxruntime kernel times (with unfused Q/DQ found by name), torch self times,
the TensorRT refusal when it is absent, and the table and sentence the report shows."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from export.onnx_export import export_onnx
from serve_bench.latency.operator_profile import profile_artifact
from serve_bench.report.profile import profile_table, unfused_qdq_line
from serve_bench.runners import RUNNERS, RunnerError
from serve_bench.runners.kernel_census import census, census_line
from train.model_io import describe, save_model
from train.models import build_model

ITERS = 20


def _conv_net() -> nn.Module:
    """Three 3×3 convolutions at 16×16: nearly all of the work is convolution."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(32, 10)).eval()


def _conv_chain(path) -> None:
    """input → (Conv → Relu) × 3 → output, written by hand: every op has an 8-bit integer kernel on the CPU."""
    rng = np.random.default_rng(0)
    inits, nodes, source, channels = [], [], "input", 3
    for i in range(3):
        weight = (rng.standard_normal((16, channels, 3, 3)) * 0.2).astype(np.float32)
        inits += [numpy_helper.from_array(weight, f"w{i}"),
                  numpy_helper.from_array(np.zeros(16, np.float32), f"b{i}")]
        nodes += [helper.make_node("Conv", [source, f"w{i}", f"b{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}")]
        source, channels = f"r{i}", 16
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["n", 3, 16, 16])],
        [helper.make_tensor_value_info(source, TensorProto.FLOAT, ["n", 16, 16, 16])],
        initializer=inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]), str(path))


class _Calibration:
    def __init__(self, name: str) -> None:
        rng = np.random.default_rng(1)
        self._batches = iter([{name: rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(4)])

    def get_next(self):
        return next(self._batches, None)


@pytest.fixture(scope="module")
def onnx_files(tmp_path_factory):
    """An exported float net (conv, ReLU, mean pooling, linear), its QDQ quantizations with 8- and 16-bit
    activations, and an 8-bit quantization of a hand-written conv chain."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    folder = tmp_path_factory.mktemp("profile")
    export_onnx(_conv_net(), torch.randn(2, 3, 16, 16), folder / "fp32.onnx")
    _conv_chain(folder / "chain_fp32.onnx")
    for source, target, activations in (("fp32", "int8", QuantType.QInt8), ("fp32", "int16", QuantType.QInt16),
                                        ("chain_fp32", "chain_int8", QuantType.QInt8)):
        name = onnx.load(str(folder / f"{source}.onnx")).graph.input[0].name
        quantize_static(str(folder / f"{source}.onnx"), str(folder / f"{target}.onnx"), _Calibration(name),
                        quant_format=QuantFormat.QDQ, activation_type=activations, weight_type=QuantType.QInt8)
    batch = np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32)
    return folder, batch


@pytest.fixture(scope="module")
def profiles(onnx_files):
    folder, batch = onnx_files
    return {flavour: profile_artifact("onnxruntime", str(folder / f"{flavour}.onnx"), batch, threads=1, iters=ITERS)
            for flavour in ("fp32", "int8", "int16", "chain_int8")}


def _ops(profile: dict) -> dict[str, dict]:
    return {o["op"]: o for o in profile["ops"]}


def _qdq_nodes(path) -> dict[str, onnx.NodeProto]:
    return {n.name: n for n in onnx.load(str(path)).graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")}


def test_a_conv_net_spends_its_time_in_conv_and_only_measured_runs_count(profiles):
    profile = profiles["fp32"]
    ops = _ops(profile)
    assert profile["runs"] == ITERS and profile["batch_size"] == 2 and profile["threads"] == 1
    assert abs(sum(o["share"] for o in profile["ops"]) - 1) < 1e-6
    assert [o["ms_per_run"] for o in profile["ops"]] == sorted((o["ms_per_run"] for o in profile["ops"]), reverse=True)
    # Conv+ReLU is fused; the kernel is reported as Conv (NCHWc layout) or FusedConv, depending on the CPU.
    conv = [op for op in ops if op in ("Conv", "FusedConv")]
    assert len(conv) == 1, list(ops)
    conv_share = ops[conv[0]]["share"]
    assert conv_share > 0.5 and conv_share > 3 * max(o["share"] for op, o in ops.items() if op != conv[0]), ops
    # Exactly three convolutions per run: the warm-up runs' events were left out.
    assert ops[conv[0]]["calls_per_run"] == 3.0
    assert profile["run_ms"] >= profile["ops_ms"] > 0  # node time lies inside the whole-run time
    assert profile["top_nodes"][0]["op"] == conv[0]
    assert profile["unfused_qdq"] == [] and profile["edge_qdq"] == []
    assert unfused_qdq_line("fp32", profile) is None
    kernels = profile["kernels"]  # three convolutions and the classifier, all in float
    assert (kernels["integer"], kernels["float"], kernels["float_precisions"]) == (0, 4, ["fp32"])
    assert census_line(kernels) == "0 of 4 compute layers in int8 (4 in fp32)"


def test_cleanly_quantized_convs_fold_their_qdq_into_integer_kernels(profiles, onnx_files):
    folder, _ = onnx_files
    profile = profiles["chain_int8"]
    ops = _ops(profile)
    assert "QLinearConv" in ops and ops["QLinearConv"]["calls_per_run"] == 3.0, list(ops)
    assert "Conv" not in ops and "FusedConv" not in ops and "DequantizeLinear" in ops
    assert profile["unfused_qdq"] == [] and unfused_qdq_line("chain", profile) is None
    assert (profile["kernels"]["integer"], profile["kernels"]["float"]) == (3, 0)
    assert census_line(profile["kernels"], 0) == "3 of 3 compute layers in int8"
    # What still runs is the conversion at the float interface: the input's Q and the output's DQ.
    graph = onnx.load(str(folder / "chain_int8.onnx")).graph
    expected = {n.name for n in graph.node if (n.op_type == "QuantizeLinear" and n.input[0] == "input")
                or (n.op_type == "DequantizeLinear" and n.output[0] == graph.output[0].name)}
    assert len(expected) == 2 and {n["node"] for n in profile["edge_qdq"]} == expected


def test_a_dq_in_front_of_an_op_without_an_integer_kernel_is_flagged(profiles, onnx_files):
    folder, _ = onnx_files
    profile = profiles["int8"]  # the exported net: its mean pooling is a ReduceMean, which has no 8-bit CPU kernel
    assert "QLinearConv" in _ops(profile) and "Conv" not in _ops(profile)
    graph = onnx.load(str(folder / "int8.onnx")).graph
    mean_inputs = {i for n in graph.node if n.op_type == "ReduceMean" for i in n.input}
    before_mean = {n.name for n in graph.node if n.op_type == "DequantizeLinear" and n.output[0] in mean_inputs}
    unfused = {n["node"]: n for n in profile["unfused_qdq"]}
    assert len(before_mean) == 1 and before_mean <= set(unfused), (before_mean, set(unfused))
    assert unfused[next(iter(before_mean))]["in_file"] is True


def test_sixteen_bit_activations_leave_named_qdq_nodes_running_around_a_float_conv(profiles, onnx_files):
    folder, _ = onnx_files
    profile = profiles["int16"]
    ops = _ops(profile)
    assert "QLinearConv" not in ops and {"Conv", "FusedConv"} & set(ops), list(ops)
    assert profile["kernels"]["integer"] == 0 and profile["kernels"]["float"] == 4  # Q/DQ asked for, none fused
    in_file = _qdq_nodes(folder / "int16.onnx")
    unfused = {n["node"]: n for n in profile["unfused_qdq"]}
    named = {name for name, n in unfused.items() if n["in_file"]}
    assert named <= set(in_file) and len(named) >= len(unfused) - 2, set(unfused) - set(in_file)
    assert all(n["op"] == in_file[name].op_type and n["ms_per_run"] > 0 for name, n in unfused.items()
               if name in named)
    # Every DequantizeLinear that feeds a convolution in the file (activation and weight) still ran.
    graph = onnx.load(str(folder / "int16.onnx")).graph
    conv_inputs = {i for n in graph.node if n.op_type == "Conv" for i in n.input}
    feeding_conv = {name for name, n in in_file.items()
                    if n.op_type == "DequantizeLinear" and n.output[0] in conv_inputs}
    assert len(feeding_conv) >= 6 and feeding_conv <= set(unfused), feeding_conv - set(unfused)
    edge = {n["node"] for n in profile["edge_qdq"]}
    assert not edge & set(unfused)
    line = unfused_qdq_line("int16", profile)
    first = profile["unfused_qdq"][0]["node"]
    assert line.startswith(f"int16: onnxruntime ran {len(unfused)} Q/DQ nodes unfused ({first}, ") and "more" in line


def test_openvino_names_the_precision_each_compute_layer_ran_in(onnx_files):
    pytest.importorskip("openvino")
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    folder, batch = onnx_files
    # uint8 activations: OpenVINO 2026.4's CPU plugin has no kernel for asymmetric int8 ones ("No suitable
    # implementations" at compile time), the layout of chain_int8
    quantize_static(str(folder / "chain_fp32.onnx"), str(folder / "chain_u8.onnx"), _Calibration("input"),
                    quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    fp32, int8 = (profile_artifact("openvino", str(folder / f"{name}.onnx"), batch[:1], threads=1, iters=3)
                  for name in ("chain_fp32", "chain_u8"))
    assert fp32["kernels"]["integer"] == 0 and fp32["kernels"]["float"] == 3  # bf16 or fp32, as the CPU has it
    assert fp32["kernels"]["float_precisions"][0] in ("bf16", "fp32")
    assert int8["kernels"]["integer"] == 3 and int8["kernels"]["float"] == 0


def test_the_census_reads_kernel_names_not_op_types():
    nodes = {"a": ("Convolution", "brgconv_avx512_amx_1x1_I8", 3.0), "b": ("GroupConvolution", "jit_avx512_dw_bf16", 6.0),
             "c": ("FullyConnected", "brgemm_avx512_amx_f32", 1.5), "d": ("FakeQuantize", "jit_avx512_f32", 9.0)}
    kernels = census("openvino", nodes, runs=3)
    assert (kernels["integer"], kernels["float"], kernels["float_precisions"]) == (1, 2, ["bf16", "fp32"])
    assert [n["node"] for n in kernels["float_layers"]] == ["b", "c"] and kernels["float_ms"] == 2.5
    assert census("torch", nodes, runs=1) is None and census_line(None) == "—"
    assert census_line(kernels, 4) == "1 of 3 compute layers in int8 (2 in bf16/fp32), 4 Q/DQ unfused"


def test_the_profile_takes_the_benchs_thread_count_once(monkeypatch):
    """The bench hands a worker's runner options, its thread count among them, to the profiler; passed on as they
    were, `threads` reached the inductor runner's constructor twice and left every compiled file unprofiled (a
    TypeError). The same count is taken once; a different one is refused, never silently replaced."""
    seen = {}

    class Recording:
        @classmethod
        def profile(cls, path, batch, *, threads, iters, options, top):
            seen.update(threads=threads, options=options)
            return {}

    monkeypatch.setitem(RUNNERS, "recording", Recording)
    batch = np.zeros((1, 3, 8, 8), np.float32)
    profile_artifact("recording", "model", batch, threads=2, options={"threads": 2, "freezing": True})
    assert seen == {"threads": 2, "options": {"freezing": True}}
    profile_artifact("recording", "model", batch, threads=2, options={"threads": None})  # no count asked: the bench's
    assert seen == {"threads": 2, "options": {}}
    with pytest.raises(RunnerError, match="ask for 8 threads, the profile for 2"):
        profile_artifact("recording", "model", batch, threads=2, options={"threads": 8})


def test_torch_profile_counts_each_convolution_and_splits_the_run(tmp_path):
    torch.manual_seed(0)
    model = build_model("resnet20", 10, 1, {"width": 8}).eval()
    save_model(model, tmp_path / "model", describe("resnet20", 10, 1, {"width": 8}, {}))
    batch = np.random.default_rng(0).standard_normal((4, 1, 16, 16)).astype(np.float32)
    threads_before = torch.get_num_threads()
    profile = profile_artifact("torch", str(tmp_path / "model"), batch, threads=1, iters=10)
    assert torch.get_num_threads() == threads_before
    # what the profile says of the model's structure; how the time splits is real time, which a busy neighbour moves
    ops = profile["ops"]
    conv = next(o for o in ops if "convolution" in o["op"])
    assert conv["calls_per_run"] == sum(isinstance(m, nn.Conv2d) for m in model.modules())
    assert [o["ms_per_run"] for o in ops] == sorted((o["ms_per_run"] for o in ops), reverse=True)
    assert abs(sum(o["share"] for o in ops) - 1) < 1e-6
    assert "model_run" not in {o["op"] for o in ops}
    assert profile["run_ms"] > conv["ms_per_run"] > 0
    assert profile["top_nodes"] == [] and profile["unfused_qdq"] == []


def _tensorrt_reason() -> str | None:
    from export.tensorrt_engine import unavailable_reason

    return unavailable_reason()


def test_tensorrt_absent_is_a_runner_error_naming_it(tmp_path):
    if _tensorrt_reason() is None:
        pytest.skip("TensorRT and a CUDA device are present here")
    with pytest.raises(RunnerError, match="TensorRT"):
        profile_artifact("tensorrt", str(tmp_path / "engine"), np.zeros((1, 3, 16, 16), np.float32), threads=1)


def test_tensorrt_layers_of_a_built_engine(onnx_files, tmp_path):
    reason = _tensorrt_reason()
    if reason:
        pytest.skip(reason)
    from export.tensorrt_engine import BuildSettings, build_engine

    folder, batch = onnx_files
    name = onnx.load(str(folder / "fp32.onnx")).graph.input[0].name
    build_engine(folder / "fp32.onnx", tmp_path / "engine", BuildSettings(precision="fp32", max_batch=4), name,
                 (3, 16, 16))
    profile = profile_artifact("tensorrt", str(tmp_path / "engine" / "model.engine"), batch, threads=1, iters=10)
    assert profile["runtime"] == "tensorrt" and profile["top_nodes"] and profile["run_ms"] > 0
    assert abs(sum(o["share"] for o in profile["ops"]) - 1) < 1e-6 and profile["ops_ms"] > 0
    # Layer types depend on the tactics TensorRT picks (a Myelin region can hold the whole net): check sums only.
    layer_ms = [n["ms_per_run"] for n in profile["top_nodes"]]
    assert layer_ms == sorted(layer_ms, reverse=True) and sum(layer_ms) <= profile["ops_ms"] + 1e-5


def test_an_unknown_runtime_is_refused():
    with pytest.raises(RunnerError, match="unknown runtime 'tflite'"):
        profile_artifact("tflite", "model.tflite", np.zeros((1, 3, 8, 8), np.float32), threads=1)


def test_a_file_onnxruntime_cannot_load_is_a_runner_error_naming_it(tmp_path):
    (tmp_path / "broken.onnx").write_bytes(b"not a model")
    with pytest.raises(RunnerError, match="could not load .*broken.onnx"):
        profile_artifact("onnxruntime", str(tmp_path / "broken.onnx"), np.zeros((1, 3, 8, 8), np.float32), threads=1)


def test_the_table_lists_the_top_ops_in_order_and_sums_the_rest(profiles):
    synthetic = {"runtime": "onnxruntime", "ops": [
        {"op": "Conv", "ms_per_run": 0.6, "calls_per_run": 3.0, "share": 0.6},
        {"op": "Gemm", "ms_per_run": 0.25, "calls_per_run": 1.0, "share": 0.25},
        {"op": "Relu", "ms_per_run": 0.1, "calls_per_run": 3.0, "share": 0.1},
        {"op": "Flatten", "ms_per_run": 0.05, "calls_per_run": 1.0, "share": 0.05}]}
    head, rows = profile_table(synthetic, top=2)
    assert head == ["op", "ms/run", "share", "calls/run"]
    assert rows == [["Conv", "0.600", "60.0%", "3.0"], ["Gemm", "0.250", "25.0%", "1.0"],
                    ["other (2 op types)", "0.150", "15.0%", "4.0"]]
    real = profiles["int16"]
    _, rows = profile_table(real)
    assert [r[0] for r in rows[:len(real["ops"][:8])]] == [o["op"] for o in real["ops"][:8]]


def test_the_unfused_line_names_the_first_nodes_and_counts_the_rest():
    nodes = [{"node": f"dq_{i}", "op": "DequantizeLinear", "ms_per_run": 0.01} for i in range(5)]
    line = unfused_qdq_line("resnet-int8", {"runtime": "onnxruntime", "unfused_qdq": nodes})
    assert line.startswith("resnet-int8: onnxruntime ran 5 Q/DQ nodes unfused (dq_0, dq_1, dq_2 and 2 more), 0.050 ms")
    one = unfused_qdq_line("m", {"runtime": "onnxruntime", "unfused_qdq": nodes[:1]})
    assert "ran 1 Q/DQ node unfused (dq_0)" in one


def test_native_lines_on_stderr_go_to_the_log_not_the_console(capfd, caplog):
    from serve_bench.runners.native_output import native_stderr_to_log

    with caplog.at_level(logging.DEBUG, logger="serve_bench.runners.native_output"):
        with native_stderr_to_log("a library"):
            os.write(2, b"USDT:2026 x.cpp:39] profiler_start\nERROR: something real\n")
        os.write(2, b"after\n")
        with pytest.raises(ValueError), native_stderr_to_log("a library"):
            os.write(2, b"USDT:2026 x.cpp:46] profiler_stop\n")
            raise ValueError("inside")
        os.write(2, b"restored\n")
    assert capfd.readouterr().err == "ERROR: something real\nafter\nrestored\n"  # only the known noise is held back
    assert "a library: USDT:2026 x.cpp:39] profiler_start" in caplog.text and "profiler_stop" in caplog.text


def test_a_torch_profile_prints_no_profiler_line(tmp_path):
    """torch's profiler writes USDT lines to fd 2 whatever its log level; a fresh process (as a bench worker is)
    profiling a model leaves its stderr clean, the lines kept in the DEBUG log."""
    model = build_model("resnet20", 10, 1, {"width": 8}).eval()
    save_model(model, tmp_path / "model", describe("resnet20", 10, 1, {"width": 8}, {}))
    code = ("import logging, sys, numpy as np\n"
            "logging.basicConfig(level=logging.DEBUG, stream=sys.stdout, format='%(name)s %(message)s')\n"
            "from serve_bench.latency.operator_profile import profile_artifact\n"
            f"p = profile_artifact('torch', {str(tmp_path / 'model')!r}, np.zeros((1, 1, 16, 16), np.float32), "
            "threads=1, iters=3)\n"
            "print('ops', len(p['ops']))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    assert "USDT" not in done.stderr and "profiler_start" not in done.stderr, done.stderr
    assert "torch profiler: USDT" in done.stdout and "ops " in done.stdout
