"""The release gate: ship the fastest artifact that meets both the accuracy red line and the p99 budget."""
from __future__ import annotations


def quantized_not_faster(artifacts: list[dict]) -> list[str]:
    """INT8 artifacts that are not faster than the fp32 ONNX of the same model, measured in this run."""
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
                                 f"p50 {a['p50']:.3f} vs {r['p50']:.3f} ms, p99 {a['p99']:.3f} vs {r['p99']:.3f} ms")
    return flags


def evaluate(artifacts: list[dict], p99_budget_ms: float | None, max_accuracy_drop: float) -> dict:
    """``artifacts`` are report entries with ``accuracy_drop`` (points, positive = worse) and ``latency_ms.p99``."""
    reasons, candidates = [], []
    for art in artifacts:
        drop, p99 = art.get("accuracy_drop"), (art.get("latency_ms") or {}).get("p99")
        problems = [art["refused"]] if art.get("refused") else []
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
        reasons.insert(0, "no artifact meets both the accuracy red line and the p99 budget")
    return {"p99_budget_ms": p99_budget_ms, "max_accuracy_drop": max_accuracy_drop, "passed": release is not None,
            "release": release, "reasons": reasons}
