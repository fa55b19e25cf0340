"""How many compute layers a runtime actually ran in integer, read from its own profile of the file.

A Q/DQ file says where quantization was *asked for*; what the runtime made of it is another matter.
onnxruntime fuses DQ → Conv → Q into ``QLinearConv`` only in the layouts its x86 kernels take (uint8
activations), and OpenVINO turns FakeQuantize + Convolution into an int8 kernel only where its
transformations match; the rest runs in float between conversions. So an INT8 file is judged by the
kernels that ran: integer compute layers against float ones, each named by the runtime's own profile
(onnxruntime's optimised node types; OpenVINO's executed kernel names, which end in their precision:
``brgconv_avx512_amx_1x1_I8``, ``…_bf16``, ``…_f32``).
"""
from __future__ import annotations

# onnxruntime's CPU node types after graph optimisation: integer compute kernels and float ones
# (``Conv`` also names the NCHWc convolution the optimiser makes; ``FusedConv`` a float conv with its activation).
ORT_INTEGER = frozenset({"QLinearConv", "QGemm", "QLinearMatMul", "MatMulInteger", "ConvInteger",
                         "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "QAttention", "QOrderedMatMul"})
ORT_FLOAT = frozenset({"Conv", "FusedConv", "Gemm", "FusedGemm", "MatMul", "FusedMatMul", "ConvTranspose",
                       "Attention", "MultiHeadAttention"})
# OpenVINO's CPU layer types that do the multiply-accumulate work
OV_COMPUTE = frozenset({"Convolution", "GroupConvolution", "FullyConnected", "FullyConnectedQuantizedLegacy",
                        "FullyConnectedCompressed", "MatMul", "Deconvolution", "ConvolutionBackpropData"})
SHOWN = 10  # float layers named in a census


def _openvino_precision(kernel: str) -> str:
    """The precision an OpenVINO kernel name ends in (``jit_avx512_I8``, ``brgconv_avx512_dw_bf16``)."""
    tail = kernel.rsplit("_", 1)[-1].lower()
    return {"i8": "int8", "u8": "int8", "bf16": "bf16", "f16": "fp16", "f32": "fp32"}.get(tail, tail or "?")


def census(runtime: str, nodes: dict[str, tuple[str, str, float]], runs: int) -> dict | None:
    """Integer and float compute layers among ``nodes`` (name → (op type, kernel, ms summed over ``runs``)).

    None where the runtime's profile cannot tell (torch, TensorRT: their layers are not named by precision here).
    """
    integer, floating = [], []
    for name, (op, kernel, ms) in nodes.items():
        if runtime == "onnxruntime":
            side = integer if op in ORT_INTEGER else floating if op in ORT_FLOAT else None
            precision = "int8" if op in ORT_INTEGER else "fp32"
        elif runtime == "openvino":
            if op not in OV_COMPUTE:
                continue
            precision = _openvino_precision(str(kernel))
            side = integer if precision == "int8" else floating
        else:
            return None
        if side is not None:
            side.append((name, op, precision, ms))
    floating.sort(key=lambda n: -n[3])
    return {"integer": len(integer), "float": len(floating),
            "integer_ms": round(sum(n[3] for n in integer) / max(runs, 1), 6),
            "float_ms": round(sum(n[3] for n in floating) / max(runs, 1), 6),
            "float_precisions": sorted({n[2] for n in floating}),
            "float_layers": [{"node": n[0], "op": n[1], "precision": n[2], "ms_per_run": round(n[3] / max(runs, 1), 6)}
                             for n in floating[:SHOWN]]}


def census_line(census_: dict | None, unfused_qdq: int | None = None) -> str:
    """``61 of 63 compute layers in int8 (2 in fp32), 12 Q/DQ unfused`` — or ``—`` without a census."""
    if not census_:
        return "—"
    total = census_["integer"] + census_["float"]
    if not total:
        return "no compute layers"
    rest = f" ({census_['float']} in {'/'.join(census_['float_precisions'])})" if census_["float"] else ""
    qdq = f", {unfused_qdq} Q/DQ unfused" if unfused_qdq else ""
    return f"{census_['integer']} of {total} compute layers in int8{rest}{qdq}"
