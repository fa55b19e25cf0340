"""Gate logic: pass, accuracy fail, latency fail, both; the release is the fastest passing artifact."""
from __future__ import annotations

import numpy as np
import pytest

from serve_bench.accuracy import accuracy
from serve_bench.gate import evaluate


def _art(name, drop, p99):
    return {"name": name, "accuracy_drop": drop, "latency_ms": {"p99": p99}}


def test_pass_picks_the_fastest_artifact_within_both_limits():
    gate = evaluate([_art("torch", 0.0, 4.0), _art("onnx", 0.1, 1.5), _art("int8", 0.4, 0.9)], 2.0, 0.5)
    assert gate["passed"] and gate["release"] == "int8"
    assert gate["reasons"] == ["torch: p99 4.000 ms > budget 2 ms"]


def test_accuracy_fail():
    gate = evaluate([_art("int8", 1.2, 0.5)], 2.0, 0.5)
    assert not gate["passed"] and gate["release"] is None
    assert gate["reasons"] == ["no artifact meets both the accuracy red line and the p99 budget",
                               "int8: accuracy drop 1.20 points > red line 0.5"]


def test_latency_fail():
    gate = evaluate([_art("onnx", 0.0, 3.0)], 2.0, 0.5)
    assert not gate["passed"] and "onnx: p99 3.000 ms > budget 2 ms" in gate["reasons"]


def test_both_fail_and_fastest_fails_accuracy():
    gate = evaluate([_art("int8", 2.0, 0.5), _art("torch", 0.0, 9.0)], 2.0, 0.5)
    assert not gate["passed"]
    assert "int8: accuracy drop 2.00 points > red line 0.5" in gate["reasons"]
    assert "torch: p99 9.000 ms > budget 2 ms" in gate["reasons"]


def test_no_budget_means_accuracy_alone_decides():
    assert evaluate([_art("a", 0.2, 50.0)], None, 0.5)["release"] == "a"


def test_meaningless_accuracy_is_not_gated_and_the_result_says_so():
    artifacts = [_art("torch", 0.0, 4.0), _art("int8", 7.5, 0.9),
                 {**_art("refused", 9.0, 0.5), "refused": "no rung within the red line"}]
    judged = evaluate(artifacts, 2.0, 0.5)
    assert judged["release"] is None and judged["decided_on"] == "accuracy and latency" and not judged["notes"]
    gate = evaluate(artifacts, 2.0, 0.5, accuracy_meaningful=False)
    assert gate["passed"] and gate["release"] == "refused"  # the fastest within the budget: latency alone decides
    assert gate["decided_on"] == "latency only" and "random" in gate["notes"][0]
    assert gate["reasons"] == ["torch: p99 4.000 ms > budget 2 ms"]
    slow = evaluate([_art("int8", 0.0, 3.0)], 2.0, 0.5, accuracy_meaningful=False)
    assert not slow["passed"] and slow["reasons"][0] == "no artifact meets the p99 budget"


def test_accuracy_from_logits():
    logits = np.array([[0.1, 0.9, 0, 0, 0, 0, 0], [0.8, 0.1, 0, 0, 0, 0, 0.05], [0, 0, 0, 0, 0, 0.2, 0.7]])
    result = accuracy(logits, np.array([1, 6, 5]), per_class=True)
    assert result["top1"] == pytest.approx(100 / 3, abs=1e-3) and result["top5"] == 100.0
    assert result["per_class"] == {1: 100.0, 5: 0.0, 6: 0.0}
