"""Split bench entries and reports as the search's bench writes them, for the search's tests."""
from __future__ import annotations

from compress.search.contenders import BASELINE, TRIAL, Contender
from serve_bench.limits import Limits
from serve_bench.report_model import Report
from tests.report_entries import as_report
from serve_bench.stats.paired import PairedCounts, drop_interval

BASELINE_P99 = 4.0


def entry(name: str, p99: float, baseline_only: int, artifact_only: int, p99_ci, macs: int = 1000, n: int = 1000,
          trial: int = 0, metric_values: dict | None = None, role: str = TRIAL) -> dict:
    """One contender's entry, its drop interval computed from the per-image counts and its p99 ratio to a
    baseline at BASELINE_P99 ms measured in the same bench."""
    counts = PairedCounts(n, baseline_only, artifact_only)
    low, high = drop_interval(counts)
    drop = 100.0 * (baseline_only - artifact_only) / n
    contender = Contender(role, name, f"trials/{trial:03d}" if role == TRIAL else "reference",
                          trial=trial if role == TRIAL else None)
    ratio = p99 / BASELINE_P99
    return {"name": contender.name, "contender": contender.as_dict(), "run": contender.run_dir, "run_artifact": name,
            "accuracy": metric_values or {"top1": 95.0 - drop}, "accuracy_ci": {"top1": [93.0, 96.0]},
            "accuracy_drop": round(drop, 4), "macs": macs, "size_bytes": 10,
            "accuracy_paired": {"drop_ci": [low, high], "n": n, "baseline_only": baseline_only,
                                "artifact_only": artifact_only, "discordant": baseline_only + artifact_only},
            "latency_ms": {"p50": p99 / 2, "p99": p99, "p99_ci_blocks": list(p99_ci), "p50_ci_blocks": [p99 / 3, p99]},
            "latency_ratio": {"p99": {"ratio": ratio, "ci": [ratio * 0.95, ratio * 1.05], "rounds": 12,
                                      "verdict": "faster" if ratio < 0.95 else "not distinguishable"},
                              "p50": {"ratio": ratio, "ci": [ratio * 0.97, ratio * 1.03], "rounds": 12,
                                      "verdict": "faster" if ratio < 0.97 else "not distinguishable"}}}


def baseline_entry(n: int = 1000) -> dict:
    e = entry("train.model", BASELINE_P99, 0, 0, [3.9, 4.1], role=BASELINE, n=n)
    e["accuracy_paired"] = {"reference": True, "n": n, "baseline_only": 0, "artifact_only": 0, "discordant": 0,
                            "drop": 0.0, "drop_ci": [0.0, 0.0]}
    e["latency_ratio"] = None
    return e


def split_report(decision: str, entries: list[dict], split: str = "val", max_drop: float = 1.0,
                 p99_budget_ms: float | None = 5.0, metric: str = "top1", n: int = 1000) -> Report:
    limits = Limits(metric=metric, max_drop=max_drop, p99_budget_ms=p99_budget_ms, decision=decision)
    base = baseline_entry(n)
    return as_report({"split": split, "baseline": base["name"], "metric": metric, "limits": limits.as_dict(),
                      "data": {"meaningful_accuracy": True, "test_images": n}, "artifacts": [base, *entries]})
