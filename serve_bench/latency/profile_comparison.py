"""Why an INT8 file is no faster than its float file, read from the two operator profiles.

The instruction set says whether the CPU has fast int8 kernels at all; the profiles say where the
time went on this model. Op types are grouped into families a runtime's names map to (onnxruntime's
``QLinearConv`` and OpenVINO's ``Convolution`` are both convolutions; its ``GroupConvolution`` is a
depthwise or grouped one), and the families whose time grew are named with their estimated times in both files.
The kernel names OpenVINO records also say a layer's precision: on a CPU with AMX or AVX-512 BF16 it
runs a float file in bf16 by default, so the INT8 file competes with bf16 kernels, not fp32 ones.

Both profiles carry the profiler's overhead, paid per node, so a family's time is estimated from its share of
each profile and the file's un-profiled p50 (``int8_loss_reasons``).
"""
from __future__ import annotations

FAMILIES = {
    "convolutions": ("Conv", "QLinearConv", "ConvInteger", "FusedConv", "NhwcFusedConv", "Convolution"),
    "depthwise/grouped convolutions": ("GroupConvolution",),
    "matrix products": ("Gemm", "QGemm", "MatMul", "MatMulInteger", "QLinearMatMul", "FusedMatMul", "FullyConnected",
                        "FullyConnectedQuantizedLegacy", "FullyConnectedQuantized", "aten::linear", "aten::addmm"),
    "quantize/dequantize and layout conversions": ("QuantizeLinear", "DequantizeLinear", "FakeQuantize", "Reorder",
                                                   "Convert", "ReorderInput", "ReorderOutput", "Transpose"),
    "element-wise": ("Add", "QLinearAdd", "Mul", "QLinearMul", "Eltwise", "Relu", "Clip", "HardSwish",
                     "HardSigmoid", "Sigmoid"),
}
_FAMILY_OF = {op: family for family, ops in FAMILIES.items() for op in ops}
# A family's growth is named when it is at least this share of the float file's p50: smaller moves are the
# profiler's own noise at these run counts.
NOTABLE = 0.05
SLOWED = 2.0  # a profile this many times slower than the un-profiled p50 is mostly the profiler's overhead


def family_times(profile: dict) -> dict[str, float]:
    """Milliseconds per run by family (op types no family names are "other")."""
    times: dict[str, float] = {}
    for op in profile.get("ops") or []:
        family = _FAMILY_OF.get(op["op"], "other")
        times[family] = times.get(family, 0.0) + float(op["ms_per_run"] or 0.0)
    return times


def kernel_precisions(profile: dict) -> set[str]:
    """The precisions the runtime's kernel names state for the profile's top layers (OpenVINO's ``…_bf16``,
    ``…_I8``, ``…_f32``); empty where the runtime's names state none (onnxruntime)."""
    found = set()
    for node in profile.get("top_nodes") or []:
        kernel = str(node.get("provider", "")).lower()
        for precision in ("bf16", "f16", "i8", "u8", "f32"):
            if kernel.endswith("_" + precision):
                found.add("int8" if precision in ("i8", "u8") else precision)
    return found


def int8_loss_reasons(int8: dict | None, int8_p50: float, fp32: dict | None, fp32_p50: float) -> str | None:
    """One sentence on why ``int8`` (a profile) did not beat ``fp32`` (the same model's float file on the same
    runtime), or None where either has no usable profile. ``*_p50``: each file's un-profiled p50 (ms).

    A profiler's overhead is paid per node, and an INT8 graph has more nodes (its Q/DQ and layout conversions),
    so profiled milliseconds overstate it. Each family's time is therefore estimated as its share of the
    profile times the file's un-profiled p50, and a profile the profiler slowed more than ``SLOWED`` times
    is said to give rough shares."""
    if not _usable(int8) or not _usable(fp32) or int8.get("backend") != fp32.get("backend"):
        return None
    q, f = _estimated(int8, int8_p50), _estimated(fp32, fp32_p50)
    grew = sorted(((q.get(k, 0.0) - f.get(k, 0.0), k) for k in set(q) | set(f)), reverse=True)
    named = [f"{k} ≈{q.get(k, 0.0):.3f} ms against ≈{f.get(k, 0.0):.3f}" for delta, k in grew
             if delta > NOTABLE * fp32_p50]
    parts = [("more of the int8 file's p50 goes to " + "; ".join(named)) if named else
             f"no operator family takes more than {NOTABLE:.0%} of the float file's p50 longer in the int8 file"]
    precisions = kernel_precisions(fp32)
    if "bf16" in precisions or "f16" in precisions:
        half = "bf16" if "bf16" in precisions else "f16"
        parts.append(f"the float file ran {half} kernels (the runtime's default inference precision on this CPU), "
                     "so the int8 file competes with those, not with fp32")
    if "int8" not in kernel_precisions(int8) and kernel_precisions(int8):
        parts.append("none of the int8 file's top layers ran an int8 kernel: the runtime kept it in float")
    slowed = [f"{which} file {p['run_ms'] / p50:.1f}×" for which, p, p50 in (("int8", int8, int8_p50),
                                                                             ("float", fp32, fp32_p50))
              if p.get("run_ms") and p50 > 0 and p["run_ms"] / p50 > SLOWED]
    if slowed:
        parts.append(f"the profiler slowed the {' and the '.join(slowed)}, so these shares are rough")
    return "; ".join(parts)


def _estimated(profile: dict, p50: float) -> dict[str, float]:
    """Each family's share of the profiled operator time, times the file's un-profiled p50."""
    times = family_times(profile)
    total = sum(times.values())
    return {k: v / total * p50 for k, v in times.items()} if total > 0 else {}


def _usable(profile: dict | None) -> bool:
    return bool(profile) and not profile.get("error") and bool(profile.get("ops"))
