"""The release gate: ship the fastest artifact that meets both the accuracy red line and the p99 budget."""
from __future__ import annotations


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


def quantized_not_faster(artifacts: list[dict], isa: dict | None = None) -> list[str]:
    """INT8 artifacts that are not faster than the fp32 ONNX of the same model, measured in this run,
    each with why (``isa``: the run's instruction-set facts)."""
    flags = []
    for art in artifacts:
        if art.get("precision") != "int8" or not art.get("source_model"):
            continue
        for ref in artifacts:
            if (ref.get("format") == "onnx" and ref.get("precision") == "fp32"
                    and ref.get("source_model") == art["source_model"] and ref["backend"] == art["backend"]):
                a, r = art["latency_ms"], ref["latency_ms"]
                if a["p50"] >= r["p50"] or a["p99"] >= r["p99"]:
                    flags.append(f"{art['name']} (int8) is not faster than {ref['name']} (fp32) of the same model: "
                                 f"p50 {a['p50']:.3f} vs {r['p50']:.3f} ms, p99 {a['p99']:.3f} vs {r['p99']:.3f} ms; "
                                 f"{why_int8_not_faster(isa)}")
    return flags


LATENCY_ONLY = ("accuracy not gated: the test labels are random (synthetic data), so accuracy drops measure "
                "noise; the gate decided on latency only")


def evaluate(artifacts: list[dict], p99_budget_ms: float | None, max_accuracy_drop: float,
             accuracy_meaningful: bool = True) -> dict:
    """``artifacts`` are report entries with ``accuracy_drop`` (points, positive = worse) and ``latency_ms.p99``.

    ``accuracy_meaningful`` false (synthetic data): a drop of random labels says nothing about
    the artifact, so the red line is not applied and the result says the gate saw latency only.
    """
    reasons, candidates = [], []
    for art in artifacts:
        drop, p99 = art.get("accuracy_drop"), (art.get("latency_ms") or {}).get("p99")
        problems = []
        if accuracy_meaningful:
            if art.get("refused"):
                problems.append(art["refused"])
            if drop is None:
                problems.append("no accuracy measured")
            elif drop > max_accuracy_drop:
                problems.append(f"accuracy drop {drop:.2f} points > red line {max_accuracy_drop:g}")
        if p99 is None:
            problems.append("no p99 measured")
        elif p99_budget_ms is not None and p99 > p99_budget_ms:
            problems.append(f"p99 {p99:.3f} ms > budget {p99_budget_ms:g} ms")
        if problems:
            reasons.append(f"{art['name']}: " + "; ".join(problems))
        else:
            candidates.append(art)
    release = min(candidates, key=lambda a: a["latency_ms"]["p99"])["name"] if candidates else None
    if release is None:
        reasons.insert(0, "no artifact meets both the accuracy red line and the p99 budget" if accuracy_meaningful
                       else "no artifact meets the p99 budget")
    return {"p99_budget_ms": p99_budget_ms, "max_accuracy_drop": max_accuracy_drop, "passed": release is not None,
            "release": release, "reasons": reasons,
            "decided_on": "accuracy and latency" if accuracy_meaningful else "latency only",
            "notes": [] if accuracy_meaningful else [LATENCY_ONLY]}
