"""Why an INT8 file is not faster than its float file: the flag a report gives, with the instruction set's part
and the operator profiles' part of the answer (read by the bench's flags and the quantize stage's log)."""
from __future__ import annotations

from serve_bench.latency.profile_comparison import int8_loss_reasons
from serve_bench.report_model import Entry, Ratio
from serve_bench.runners import RUNNERS


def why_int8_not_faster(isa: dict | None) -> str:
    """The instruction-set part of the answer, so a user on a CPU without VNNI is not surprised."""
    kernel = (isa or {}).get("int8_dot_product")
    if not kernel:
        return "the instruction set of the machine was not recorded"
    if "no VNNI" in kernel or kernel == "none":
        return (f"this CPU multiplies int8 with {kernel}: onnxruntime's u8s8 kernels need two instructions per "
                "int8 dot product there (VNNI does it in one), so INT8 gains little over fp32 on small models; "
                "on a CPU with VNNI the same file is faster")
    return (f"this CPU has {kernel}, so the int8 kernels are not the cause: the model may be too small for "
            "INT8 to outweigh its quantize/dequantize steps, or the machine was noisy (compare the p99 intervals)")


def _ratio_words(key: str, ratio: Ratio) -> str:
    return f"{key} ×{ratio.ratio:.2f} (95% CI {ratio.ci[0]:.2f}–{ratio.ci[1]:.2f}): {ratio.verdict}"


def quantized_not_faster(artifacts: list[Entry], isa: dict | None = None) -> list[str]:
    """INT8 artifacts not shown faster than the fp32 ONNX of the same model, measured in this run, each with
    why (``isa``: the run's instruction-set facts). Where the bench paired the two (``int8_vs_fp32``), the
    verdict comes from the block-paired interval of their latency ratio: faster only when the whole
    interval is below 1; otherwise from the point estimates, against the fp32 file made from the same model of
    the same run (``compress compare`` and a search's final bench hold files of several runs, whose model names
    repeat)."""
    flags = []
    for art in artifacts:
        if art.precision != "int8" or not art.source_model:
            continue
        paired = art.int8_vs_fp32
        if paired:
            verdicts = (paired.p50.verdict, paired.p99.verdict)
            if all(v == "faster" for v in verdicts):
                continue
            slower = "slower" in verdicts
            ref = next((e for e in artifacts if e.name == paired.reference), None)
            same = ref is None or ref.source_model == art.source_model
            # paired with the baseline's own file (its model has no fp32 file there): pruning and INT8 together
            what = "of the same model" if same else "(the baseline as it is, the only fp32 file on its runtime)"
            why = why_int8_not_faster(isa) if same else ("the ratio covers every compression step together, so no "
                                                         "instruction set explains it alone")
            flags.append(f"{art.name} (int8) is {'slower than' if slower else 'not shown faster than'} "
                         f"{paired.reference} (fp32) {what}, latency int8/fp32 "
                         f"{_ratio_words('p50', paired.p50)}, {_ratio_words('p99', paired.p99)}; "
                         f"{why}{_profile_words(art, ref)}")
            continue
        for ref in artifacts:
            if (ref.format == "onnx" and ref.precision == "fp32" and ref.run == art.run  # one run's model names
                    and ref.source_model == art.source_model and ref.runtime == art.runtime):
                a, r = art.latency_ms, ref.latency_ms
                if a.p50 >= r.p50 or a.p99 >= r.p99:
                    flags.append(f"{art.name} (int8) is not faster than {ref.name} (fp32) of the same model: "
                                 f"p50 {a.p50:.3f} vs {r.p50:.3f} ms, p99 {a.p99:.3f} vs {r.p99:.3f} ms; "
                                 f"{why_int8_not_faster(isa)}{_profile_words(art, ref)}")
    return flags


def _profiled_where_timed(entry: Entry) -> bool:
    """A runtime's profiler times a file on one device (its runner's ``profiler_device``: the CPU for onnxruntime,
    OpenVINO and torch, the GPU for TensorRT): a profile explains the latency only where the file was timed there."""
    runner = RUNNERS.get(entry.runtime)
    return runner is not None and entry.runner.get("device") == runner.profiler_device


def _profile_words(int8: Entry, fp32: Entry | None) -> str:
    """The operator profiles' part of the answer (serve_bench.latency.profile_comparison), where both have one."""
    if fp32 is None or not all(_profiled_where_timed(e) for e in (int8, fp32)):
        return ""
    words = int8_loss_reasons(int8.operator_profile, int8.latency_ms.p50, fp32.operator_profile, fp32.latency_ms.p50,
                              fp32.runner.get("inference_precision"))
    return f". From the operator profiles: {words}" if words else ""
