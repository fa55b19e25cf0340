"""Why an INT8 file is no faster than its float file, read from the two operator profiles.

The instruction set says whether the CPU has fast int8 kernels at all; the profiles say where the
time went on this model. Op types are grouped into families a runtime's names map to (onnxruntime's
``QLinearConv`` and OpenVINO's ``Convolution`` are both convolutions; its ``GroupConvolution`` is a
depthwise or grouped one), and the families whose time grew are named with their estimated times in both files.
The kernel names OpenVINO records also say a layer's precision, and its runner records the inference
precision: on a CPU with AMX or AVX-512 BF16 it runs a float file in bf16 by default, so the INT8 file
competes with bf16 kernels, not fp32 ones. onnxruntime's depthwise convolutions are ``Conv`` nodes like any
other (their group count is not in the profile), so only OpenVINO's are counted apart.

Both profiles carry the profiler's overhead, paid per node, so a family's time is estimated from its share of
each profile and the file's un-profiled p50 (``int8_loss_reasons``).
"""
from __future__ import annotations

FAMILIES = {
    "convolutions": ("Conv", "QLinearConv", "ConvInteger", "FusedConv", "NhwcFusedConv", "Convolution"),
    "depthwise/grouped convolutions (OpenVINO)": ("GroupConvolution",),
    "matrix products": ("Gemm", "QGemm", "MatMul", "MatMulInteger", "QLinearMatMul", "FusedMatMul", "FullyConnected",
                        "FullyConnectedQuantizedLegacy", "FullyConnectedQuantized", "aten::linear", "aten::addmm"),
    "quantize/dequantize and layout conversions": ("QuantizeLinear", "DequantizeLinear", "FakeQuantize", "Reorder",
                                                   "Convert", "ReorderInput", "ReorderOutput", "Transpose"),
    "element-wise": ("Add", "QLinearAdd", "Mul", "QLinearMul", "Eltwise", "Relu", "Clip", "HardSwish",
                     "HardSigmoid", "Sigmoid", "QLinearSigmoid", "Concat", "QLinearConcat"),
    "pooling": ("MaxPool", "AveragePool", "GlobalAveragePool", "QLinearGlobalAveragePool", "QLinearAveragePool",
                "ReduceMean", "Pooling"),
}
_FAMILY_OF = {op: family for family, ops in FAMILIES.items() for op in ops}
OTHER = "other operators"
OUTSIDE = "time outside the operators (session, copies)"
COMPUTE = ("convolutions", "depthwise/grouped convolutions (OpenVINO)", "matrix products")
# A family's growth is named when it is at least this share of the float file's p50: smaller moves are the
# profiler's own noise at these run counts.
NOTABLE = 0.05
SLOWED = 2.0  # a profile this many times slower than the un-profiled p50 is mostly the profiler's overhead
_PRECISIONS = {"bf16": "bf16", "fp16": "f16", "f16": "f16", "i8": "int8", "u8": "int8", "fp32": "f32", "f32": "f32"}


def family_times(profile: dict) -> dict[str, float]:
    """Milliseconds per run by family (op types no family names are "other operators")."""
    times: dict[str, float] = {}
    for op in profile.get("ops") or []:
        family = _FAMILY_OF.get(op["op"], OTHER)
        times[family] = times.get(family, 0.0) + float(op["ms_per_run"] or 0.0)
    return times


def _kernel_precision(node: dict) -> str | None:
    kernel = str(node.get("provider", "")).lower()
    return next((name for suffix, name in _PRECISIONS.items() if kernel.endswith("_" + suffix)), None)


def kernel_precisions(profile: dict, ops: tuple[str, ...] | None = None) -> set[str]:
    """The precisions the runtime's kernel names state for the profile's top layers (OpenVINO's ``…_bf16``,
    ``…_I8``, ``…_f32``; ``ops``: only layers of those families); empty where the runtime's names state none
    (onnxruntime)."""
    return {p for node in profile.get("top_nodes") or []
            if (ops is None or _FAMILY_OF.get(node.get("op", ""), OTHER) in ops)
            and (p := _kernel_precision(node)) is not None}


def int8_loss_reasons(int8: dict | None, int8_p50: float, fp32: dict | None, fp32_p50: float,
                      float_precision: str | None = None) -> str | None:
    """One sentence on why ``int8`` (a profile) did not beat ``fp32`` (the same model's float file on the same
    runtime and device), or None where either has no usable profile. ``*_p50``: each file's un-profiled p50
    (ms); ``float_precision``: the precision the runtime says it ran the float file in, where it says.

    A profiler's overhead is paid per node, and an INT8 graph has more nodes (its Q/DQ and layout
    conversions), so profiled milliseconds overstate it. Each family's time is therefore estimated as its
    share of the profile's operator time, times the operators' share of the profiled run, times the file's
    un-profiled p50; what the operators leave of the p50 is "time outside the operators". A profile the
    profiler slowed more than ``SLOWED`` times is said to give rough shares."""
    if not _usable(int8) or not _usable(fp32) or int8.get("runtime") != fp32.get("runtime"):
        return None
    if not (int8_p50 > 0 and fp32_p50 > 0):
        return None
    q, f = _estimated(int8, int8_p50), _estimated(fp32, fp32_p50)
    grew = sorted(((q.get(k, 0.0) - f.get(k, 0.0), k) for k in set(q) | set(f)), reverse=True)
    named = [f"{k} ≈{q.get(k, 0.0):.3f} ms against ≈{f.get(k, 0.0):.3f}" for delta, k in grew
             if delta > NOTABLE * fp32_p50]
    parts = [("more of the int8 file's p50 goes to " + "; ".join(named)) if named else
             f"no part of the int8 file's p50 is longer than the float file's by more than {NOTABLE:.0%} of it"]
    stated = {float_precision} if float_precision else kernel_precisions(fp32, COMPUTE)
    halves = stated & {"bf16", "f16"}
    if halves:
        parts.append(f"the float file ran {sorted(halves)[0]} kernels (the runtime's inference precision on this "
                     "CPU), so the int8 file competes with those, not with fp32")
    compute = [n for n in int8.get("top_nodes") or [] if _FAMILY_OF.get(n.get("op", ""), OTHER) in COMPUTE
               and _kernel_precision(n) is not None]
    if compute and all(_kernel_precision(n) != "int8" for n in compute):
        parts.append(f"none of the int8 file's {len(compute)} slowest convolution or matrix layers ran an int8 "
                     "kernel")
    slowed = [f"{which} file {p['run_ms'] / p50:.1f}×" for which, p, p50 in (("int8", int8, int8_p50),
                                                                             ("float", fp32, fp32_p50))
              if p.get("run_ms") and p["run_ms"] / p50 > SLOWED]
    if slowed:
        parts.append(f"the profiler slowed the {' and the '.join(slowed)}, so these shares are rough")
    return "; ".join(parts)


def _estimated(profile: dict, p50: float) -> dict[str, float]:
    """Each family's share of the p50: its share of the operator time, times the operators' share of the profiled
    run (where the profile timed the whole run), times the un-profiled p50; the rest is outside the operators."""
    times = family_times(profile)
    total = sum(times.values())
    run = profile.get("run_ms")
    in_ops = min(1.0, total / run) if run else 1.0
    out = {k: v / total * in_ops * p50 for k, v in times.items()}
    if in_ops < 1.0:
        out[OUTSIDE] = (1.0 - in_ops) * p50
    return out


def _usable(profile: dict | None) -> bool:
    return (bool(profile) and not profile.get("error") and bool(profile.get("ops"))
            and sum(family_times(profile).values()) > 0)
