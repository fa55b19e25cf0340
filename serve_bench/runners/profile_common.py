"""What every runtime's operator profiler shares (each profiler lives with its runner, behind ``profile``; why
profiles exist and how to read them: serve_bench.latency.operator_profile). One result shape, so the report's
tables read any runtime's profile alike; each runs on the artifact file itself, after a warm-up.
"""
from __future__ import annotations

import math

import numpy as np

WARMUP_RUNS = 3
QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


def rounded(value: float | None) -> float | None:
    return None if value is None else round(float(value), 6)


def shares_of(times: list[float]) -> list[float]:
    """Fractions of the total, rounded to 6 decimals so that they still sum to 1 (largest remainders)."""
    total = sum(times)
    if total <= 0:
        return [0.0 for _ in times]
    exact = [t / total * 1_000_000 for t in times]
    units = [math.floor(e) for e in exact]
    for i in sorted(range(len(exact)), key=lambda i: units[i] - exact[i])[:max(0, 1_000_000 - sum(units))]:
        units[i] += 1
    return [u / 1_000_000 for u in units]


def profile_result(runtime: str, note: str, batch: np.ndarray, iters: int, threads: int | None, run_ms: float | None,
            per_op: dict[str, list[float]], top_nodes: list[dict], unfused: list[dict] | None = None,
            edge: list[dict] | None = None, kernels: dict | None = None) -> dict:
    """The common shape; ``per_op`` maps op type → [summed ms over all runs, calls over all runs]; ``kernels``:
    the compute layers the runtime ran in integer and in float (``kernel_census``), where its profile says."""
    ordered = sorted(per_op.items(), key=lambda kv: (-kv[1][0], kv[0]))
    shares = shares_of([ms for _, (ms, _) in ordered])
    ops = [{"op": op, "ms_per_run": rounded(ms / iters), "calls_per_run": rounded(calls / iters), "share": share}
           for (op, (ms, calls)), share in zip(ordered, shares)]
    return {"runtime": runtime, "runs": iters, "batch_size": int(batch.shape[0]), "threads": threads,
            "run_ms": rounded(run_ms), "ops_ms": rounded(sum(ms for ms, _ in per_op.values()) / iters), "ops": ops,
            "top_nodes": top_nodes, "unfused_qdq": unfused or [], "edge_qdq": edge or [], "note": note,
            **({"kernels": kernels} if kernels is not None else {})}


def qdq_in_file(path: str) -> tuple[set[str], set[str], set[str]]:
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


