"""Report entries for tests of the readers (the gate, the search's scoring): a test names the fields it is about,
and the fields every entry must have but the test is not about (runtime, format, path, size) are filled in here."""
from __future__ import annotations

from serve_bench.report_model import Entry, Report, model_of

_UNRELATED = {"runtime": "onnxruntime", "precision": "fp32", "format": "onnx", "path": "model.onnx", "size_bytes": 1,
              "accuracy": {}, "accuracy_drop": None}


def as_entry(fields: dict) -> Entry:
    """``fields`` as a report entry. A latency without its request count or p50 gets them (a gate test names the
    p99); an entry without a latency (a test of its traffic sections) gets 1 ms closed-loop figures, which such a
    test does not read."""
    completed = {"name": "candidate", **_UNRELATED, **fields}
    latency = fields.get("latency_ms") or {"p50": 1.0, "p99": 1.0}
    if isinstance(latency, dict):
        completed["latency_ms"] = {"n": 1000, "p50": latency.get("p99"), **latency}
    return Entry.model_validate(completed)


def as_entries(entries: list[dict]) -> list[Entry]:
    return [as_entry(e) for e in entries]


def as_report(fields: dict) -> Report:
    """``fields`` (a search's split bench, say: its split, limits, baseline and artifacts) as a report; each artifact
    completed as ``as_entry`` does, and the sections a reader of these tests does not read given empty values."""
    limits = fields.get("limits") or {"metric": fields.get("metric", "top1"), "max_drop": 1.0, "p99_budget_ms": None,
                                      "decision": "point"}
    data = {"name": "test", "test_images": 1000, "test_digest": "0" * 40, **(fields.get("data") or {})}
    artifacts = [as_entry(a).model_dump(by_alias=True, exclude_unset=True) for a in fields["artifacts"]]
    return model_of({"pipeline": None, "baseline": artifacts[0]["name"], "metric": limits["metric"], "flags": [],
                     "gate": {"limits": limits, "passed": False, "release": None, "reasons": [],
                              "decision": limits["decision"]},
                     "environment": {}, "settings": {}, **fields, "data": data, "artifacts": artifacts})
