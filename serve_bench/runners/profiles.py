"""Each runtime's own operator profiler, behind its runner's ``profile`` (why profiles exist and how to read
them: serve_bench.latency.operator_profile). They share one result shape, so the report's tables read any
runtime's profile alike; each runs on the artifact file itself, after a warm-up.
"""
from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from serve_bench.runners.base import RunnerError
from serve_bench.runners.kernel_census import census
from serve_bench.runners.native_output import native_stderr_to_log

logger = logging.getLogger(__name__)

WARMUP_RUNS = 3
QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
_NOTES = {
    "onnxruntime": "onnxruntime kernel time per node (CPU provider, after graph optimisation); profiling adds "
                   "overhead, so the totals exceed the un-profiled latency.",
    "torch": "self CPU time of each torch op (time inside the op, not in the ops it calls); profiling adds "
             "overhead, so the totals exceed the un-profiled latency.",
    "openvino": "OpenVINO per-layer CPU time (PERF_COUNT) of the compiled graph, after its fusions: a layer's "
                "kernel name says its precision (I8, f32, bf16); profiling adds overhead, so the totals exceed the "
                "un-profiled latency.",
    "tensorrt": "TensorRT per-layer GPU time reported by IProfiler; profiling adds overhead (a synchronisation "
                "per layer), so the totals exceed the un-profiled latency.",
}


def _r(value: float | None) -> float | None:
    return None if value is None else round(float(value), 6)


def _shares(times: list[float]) -> list[float]:
    """Fractions of the total, rounded to 6 decimals so that they still sum to 1 (largest remainders)."""
    total = sum(times)
    if total <= 0:
        return [0.0 for _ in times]
    exact = [t / total * 1_000_000 for t in times]
    units = [math.floor(e) for e in exact]
    for i in sorted(range(len(exact)), key=lambda i: units[i] - exact[i])[:max(0, 1_000_000 - sum(units))]:
        units[i] += 1
    return [u / 1_000_000 for u in units]


def _result(backend: str, batch: np.ndarray, iters: int, threads: int | None, run_ms: float | None,
            per_op: dict[str, list[float]], top_nodes: list[dict], unfused: list[dict] | None = None,
            edge: list[dict] | None = None, kernels: dict | None = None) -> dict:
    """The common shape; ``per_op`` maps op type → [summed ms over all runs, calls over all runs]; ``kernels``:
    the compute layers the runtime ran in integer and in float (``kernel_census``), where its profile says."""
    ordered = sorted(per_op.items(), key=lambda kv: (-kv[1][0], kv[0]))
    shares = _shares([ms for _, (ms, _) in ordered])
    ops = [{"op": op, "ms_per_run": _r(ms / iters), "calls_per_run": _r(calls / iters), "share": share}
           for (op, (ms, calls)), share in zip(ordered, shares)]
    return {"backend": backend, "runs": iters, "batch_size": int(batch.shape[0]), "threads": threads,
            "run_ms": _r(run_ms), "ops_ms": _r(sum(ms for ms, _ in per_op.values()) / iters), "ops": ops,
            "top_nodes": top_nodes, "unfused_qdq": unfused or [], "edge_qdq": edge or [], "note": _NOTES[backend],
            **({"kernels": kernels} if kernels is not None else {})}


def _qdq_in_file(path: str) -> tuple[set[str], set[str], set[str]]:
    """Names of the file's Q/DQ nodes, of its Q nodes reading a graph input and its DQ nodes writing an output
    (none for an OpenVINO IR, which has no ONNX graph: every FakeQuantize it runs then counts as unfused)."""
    import onnx

    if str(path).lower().endswith(".xml"):
        return set(), set(), set()
    graph = onnx.load(str(path), load_external_data=False).graph
    inputs, outputs = {i.name for i in graph.input}, {o.name for o in graph.output}
    named = {n.name for n in graph.node if n.op_type in QDQ_OPS}
    quant_in = {n.name for n in graph.node if n.op_type == "QuantizeLinear" and n.input[0] in inputs}
    dequant_out = {n.name for n in graph.node if n.op_type == "DequantizeLinear" and set(n.output) & outputs}
    return named, quant_in, dequant_out


def profile_onnxruntime(path: str, batch: np.ndarray, *, threads: int, iters: int, inter_op_threads: int = 1,
                        top: int = 15) -> dict:
    """Kernel time per node from onnxruntime's own profiler (CPU provider, the graph as optimised)."""
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise RunnerError("onnxruntime is not installed: pip install 'compress[cpu]' (or [gpu])") from exc
    with tempfile.TemporaryDirectory() as folder:
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.intra_op_num_threads, options.inter_op_num_threads = threads, inter_op_threads
        options.enable_profiling, options.profile_file_prefix = True, os.path.join(folder, "ort_profile")
        try:
            session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime's error types (NoSuchFile, InvalidProtobuf...) derive from Exception
            raise RunnerError(f"onnxruntime could not load {path} to profile it: {exc}") from exc
        first = session.get_inputs()[0]
        dtype = np.float16 if first.type == "tensor(float16)" else np.float32
        feed = {first.name: np.ascontiguousarray(batch, dtype=dtype)}
        # One session, warm-up included, and the warm-up runs' events dropped by time: Python cannot switch
        # profiling on mid-session, and a second session would only be cold again (arena growth, thread-pool
        # start). A run's node events lie inside its model_run event, so those from the first measured
        # model_run's start on are the measured runs' and nothing else's.
        for _ in range(WARMUP_RUNS + iters):
            session.run(None, feed)
        trace_file = Path(session.end_profiling())
        events = json.loads((trace_file if trace_file.is_absolute() else Path.cwd() / trace_file).read_text())
    runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                  key=lambda e: e["ts"])
    if len(runs) != WARMUP_RUNS + iters:
        logger.warning("onnxruntime profile of %s holds %d model_run events, expected %d", path, len(runs),
                       WARMUP_RUNS + iters)
    measured = runs[-iters:]
    if not measured:
        raise RunnerError(f"onnxruntime wrote no model_run events profiling {path}")
    cutoff = measured[0]["ts"]
    per_op: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    per_node: dict[str, list] = {}
    for e in events:
        name = e.get("name", "")
        if e.get("cat") != "Node" or not name.endswith("_kernel_time") or e["ts"] < cutoff:
            continue
        args = e.get("args", {})
        op, ms = args.get("op_name", "?"), e["dur"] / 1000.0
        per_op[op][0] += ms
        per_op[op][1] += 1
        node = per_node.setdefault(name[:-len("_kernel_time")], [op, args.get("provider", "?"), 0.0])
        node[2] += ms
    n = len(measured)
    run_ms = sum(e["dur"] for e in measured) / 1000.0 / n
    nodes = sorted(per_node.items(), key=lambda kv: (-kv[1][2], kv[0]))
    top_nodes = [{"node": name, "op": op, "provider": provider, "ms_per_run": _r(ms / n)}
                 for name, (op, provider, ms) in nodes[:top]]
    named, quant_in, dequant_out = _qdq_in_file(path)
    unfused, edge = [], []
    for name, (op, _, ms) in nodes:
        if op in QDQ_OPS:
            # A Q reading a graph input or a DQ writing a graph output converts at the model's edge: a float
            # interface needs it whatever the fusions did. Any other Q/DQ still running was not folded.
            # in_file False: a node onnxruntime's optimiser made (it moves Q/DQ across Reshape and the like).
            at_edge = name in (quant_in if op == "QuantizeLinear" else dequant_out)
            (edge if at_edge else unfused).append({"node": name, "op": op, "ms_per_run": _r(ms / n),
                                                   "in_file": name in named})
    result = _result("onnxruntime", batch, n, threads, run_ms, per_op, top_nodes, unfused, edge,
                     census("onnxruntime", {k: tuple(v) for k, v in per_node.items()}, n))
    logger.info("profiled %s with onnxruntime: %d runs, %.3f ms per run, %d op types, %d unfused Q/DQ",
                path, n, run_ms, len(per_op), len(unfused))
    return result


def profile_openvino(path: str, batch: np.ndarray, *, threads: int, iters: int, options: dict | None = None,
                     top: int = 15) -> dict:
    """OpenVINO's per-layer counters, summed over ``iters`` runs after a warm-up.

    Layers OpenVINO fused away or never ran are left out. Q/DQ pairs become FakeQuantize layers there:
    one still executed converts in float on every run (not folded into an integer kernel), except the one
    quantizing the graph's input, which a float interface always needs.
    """
    from serve_bench.runners.openvino_runner import OpenVinoRunner

    settings = {k: v for k, v in (options or {}).items() if k in ("hint", "inference_precision")}
    with OpenVinoRunner(path, threads=threads, perf_count=True, **settings) as runner:
        for _ in range(WARMUP_RUNS):
            runner.infer(batch)
        per_op: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        per_node: dict[str, list] = {}
        run_total = 0.0
        for _ in range(iters):
            start = time.perf_counter()
            runner.infer(batch)
            run_total += time.perf_counter() - start
            for layer in runner.requests()[0].get_profiling_info():
                if str(layer.status).rsplit(".", 1)[-1] != "EXECUTED":
                    continue
                ms = layer.real_time.total_seconds() * 1e3
                per_op[layer.node_type][0] += ms
                per_op[layer.node_type][1] += 1
                node = per_node.setdefault(layer.node_name, [layer.node_type, layer.exec_type, 0.0])
                node[2] += ms
    nodes = sorted(per_node.items(), key=lambda kv: (-kv[1][2], kv[0]))
    top_nodes = [{"node": name, "op": op, "provider": kernel, "ms_per_run": _r(ms / iters)}
                 for name, (op, kernel, ms) in nodes[:top]]
    named, quant_in, _ = _qdq_in_file(path)
    unfused, edge = [], []
    for name, (op, _, ms) in nodes:
        if op == "FakeQuantize":
            (edge if name in quant_in else unfused).append({"node": name, "op": op, "ms_per_run": _r(ms / iters),
                                                            "in_file": name in named})
    result = _result("openvino", batch, iters, threads, run_total * 1e3 / iters, per_op, top_nodes, unfused, edge,
                     census("openvino", {k: tuple(v) for k, v in per_node.items()}, iters))
    logger.info("profiled %s with OpenVINO: %d runs, %d layer types, %d unfused FakeQuantize", path, iters,
                len(per_op), len(unfused))
    return result


def profile_torch(path: str, batch: np.ndarray, *, threads: int, iters: int, top: int = 15) -> dict:
    """Self CPU time per torch op over ``iters`` eager runs (``top`` unused: torch has no single nodes)."""
    # Kineto (torch's profiler) probes for a GPU on its first use and logs an ERROR line to stderr where there is
    # none; on a CPU-only profile that line is noise in the run's console. Its log level is read at that first use.
    # Its USDT lines no level silences: native_stderr_to_log sends them to the log.
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from train.model_io import load_model

    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model, _ = load_model(path)
        model = model.eval()
        x = torch.from_numpy(np.ascontiguousarray(batch, dtype=np.float32))
        with torch.inference_mode():
            for _ in range(WARMUP_RUNS):
                model(x)
            with native_stderr_to_log("torch profiler", logger), profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(iters):
                    with record_function("model_run"):  # the whole run, Python overhead included
                        model(x)
    finally:
        torch.set_num_threads(previous_threads)
    per_op: dict[str, list[float]] = {}
    run_ms = None
    for event in prof.key_averages():
        if event.key == "model_run":
            run_ms = event.cpu_time_total / 1000.0 / iters
        else:
            per_op[event.key] = [event.self_cpu_time_total / 1000.0, float(event.count)]
    result = _result("torch", batch, iters, threads, run_ms, per_op, [])
    logger.info("profiled %s with torch: %d runs, %d op types", path, iters, len(per_op))
    return result


def _layer_types(engine, trt) -> dict[str, str]:
    """Layer name → layer type from the engine inspector (engines are built with DETAILED verbosity)."""
    try:
        info = json.loads(engine.create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON))
    except (RuntimeError, ValueError, AttributeError) as exc:
        logger.warning("TensorRT engine inspector gave no layer types: %s", exc)
        return {}
    return {layer["Name"]: str(layer.get("LayerType", "unknown")) for layer in info.get("Layers", [])
            if isinstance(layer, dict) and "Name" in layer}


def profile_tensorrt(path: str, batch: np.ndarray, *, iters: int, top: int = 15) -> dict:
    """GPU time per engine layer from an IProfiler, grouped by the inspector's layer type."""
    try:
        import tensorrt as trt
    except ImportError as exc:
        raise RunnerError("TensorRT is not installed (pip install 'compress[tensorrt]')") from exc
    import torch

    if not torch.cuda.is_available():
        raise RunnerError("the TensorRT profiler needs a CUDA device; none is visible")
    from export.tensorrt_engine import EngineMismatch, TensorRTUnavailable, load_engine

    path = Path(path)
    try:  # as TensorRTRunner._load: the engine artifact is its folder or the engine file in it
        engine, _ = load_engine(path if path.is_dir() else path.parent)
    except (EngineMismatch, TensorRTUnavailable, OSError) as exc:
        raise RunnerError(f"TensorRT engine {path}: {exc}") from exc

    class LayerTimes(trt.IProfiler):
        def __init__(self) -> None:
            trt.IProfiler.__init__(self)
            self.ms: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])

        def report_layer_time(self, layer_name: str, ms: float) -> None:
            self.ms[layer_name][0] += ms
            self.ms[layer_name][1] += 1

    dtypes = {"HALF": torch.float16, "FLOAT": torch.float32, "BF16": torch.bfloat16, "INT32": torch.int32,
              "INT64": torch.int64, "INT8": torch.int8, "BOOL": torch.bool}
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
    if len(inputs) != 1:
        raise RunnerError(f"TensorRT engine {path}: expected one input tensor, found {inputs}")
    context, stream = engine.create_execution_context(), torch.cuda.Stream()
    in_dtype = dtypes[engine.get_tensor_dtype(inputs[0]).name]
    staged = torch.from_numpy(np.ascontiguousarray(batch)).to("cuda", dtype=in_dtype)
    context.set_input_shape(inputs[0], tuple(staged.shape))
    context.set_tensor_address(inputs[0], staged.data_ptr())
    outputs = []
    with torch.cuda.stream(stream):
        for name in names:
            if name not in inputs:
                outputs.append(torch.empty(tuple(context.get_tensor_shape(name)),
                                           dtype=dtypes[engine.get_tensor_dtype(name).name], device="cuda"))
                context.set_tensor_address(name, outputs[-1].data_ptr())
    stream.wait_stream(torch.cuda.current_stream())  # the staged input's copy is complete

    def run() -> None:
        if not context.execute_async_v3(stream.cuda_stream):
            raise RunnerError(f"TensorRT execute_async_v3 failed profiling {path}")
        stream.synchronize()

    for _ in range(WARMUP_RUNS):
        run()
    profiler = LayerTimes()
    context.profiler = profiler  # attached after the warm-up, so only the measured runs report
    start = time.perf_counter()
    for _ in range(iters):
        run()
    run_ms = (time.perf_counter() - start) * 1000.0 / iters
    if not profiler.ms:
        raise RunnerError(f"TensorRT reported no layer times profiling {path}")
    types = _layer_types(engine, trt)
    per_op: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for layer, (ms, calls) in profiler.ms.items():
        per_op[types.get(layer, "unknown")][0] += ms
        per_op[types.get(layer, "unknown")][1] += calls
    layers = sorted(profiler.ms.items(), key=lambda kv: (-kv[1][0], kv[0]))
    top_nodes = [{"node": layer, "op": types.get(layer, "unknown"), "ms_per_run": _r(ms / iters)}
                 for layer, (ms, _) in layers[:top]]
    result = _result("tensorrt", batch, iters, None, run_ms, per_op, top_nodes)
    logger.info("profiled %s with TensorRT: %d runs, %d layers", path, iters, len(profiler.ms))
    return result
