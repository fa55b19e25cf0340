"""The report as a typed model: what ``report.json`` holds, checked when it is written and when it is read.

The gate, the release, the card, compare, the search and the renderers all read the same file. As a
dict whose shape only the writer knew, a renamed key broke a reader without a word; as a model, a
report that does not fit is refused where it is written, with the field named, and the JSON schema
beside every ``report.json`` (``report.schema.json``) tells another tool what to expect.

Every report carries ``report_version``. Version 1 is a report written before the version was (its
gate's limits under the old names ``max_accuracy_drop`` and ``p99_budget_ms``): it is read, its
limits moved to the names the pipeline file gives them. A report of a newer version than this code
knows is refused with both versions named. The models type what every reader relies on and allow the
rest (per-runtime facts, profiles, traffic details), so a runtime can add a fact without a schema bump.
"""
from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from serve_bench.limits import Limits

REPORT_VERSION = 2
SCHEMA_FILE = "report.schema.json"
Interval = tuple[float, float]


class ReportVersionError(ValueError):
    """A report this code cannot read as it is: its version is newer, or it does not fit the model."""


class _Open(BaseModel):
    """A section whose named fields are typed and whose other facts are kept as written."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


class LimitsModel(BaseModel):
    """The pipeline file's limits the gate judged under (``serve_bench.limits.Limits``)."""

    model_config = ConfigDict(extra="forbid")
    metric: str
    max_drop: float
    p99_budget_ms: float | None
    decision: Literal["point", "confident"]

    def limits(self) -> Limits:
        return Limits(**self.model_dump())


class LatencyFigures(_Open):
    """Closed-loop service time of one candidate (ms), with its intervals."""

    p50: float
    p99: float
    n: int = Field(description="timed requests")
    p99_9: float | None = Field(None, alias="p99.9")
    mean: float | None = None
    max: float | None = None
    p50_ci: Interval | None = None
    p99_ci: Interval | None = None
    p50_ci_blocks: Interval | None = None
    p99_ci_blocks: Interval | None = None


class Entry(_Open):
    """One candidate (a file on a runtime) as measured and judged."""

    name: str
    artifact: str | None = None
    backend: str
    precision: str
    format: str
    path: str
    size_bytes: int
    params: int | None = None
    macs: int | None = None
    accuracy: dict[str, Any] = Field(description="metric → value (percent, or mAP), with n")
    accuracy_ci: dict[str, Interval] = Field(default_factory=dict)
    accuracy_drop: float | None = Field(description="points below the baseline; None where not paired")
    accuracy_paired: dict[str, Any] | None = None
    latency_ms: LatencyFigures
    runner: dict[str, Any] = Field(default_factory=dict, description="what the runtime ran with, read back from it")
    traffic: dict[str, Any] | None = None


class Gate(_Open):
    limits: LimitsModel
    passed: bool
    release: str | None
    reasons: list[str]
    notes: list[str] = Field(default_factory=list)
    decision: Literal["point", "confident"]
    decided_on: str | None = None


class DataFacts(_Open):
    name: str
    test_images: int
    meaningful_accuracy: bool = True
    test_digest: str


class Report(BaseModel):
    """A bench report: the bench stage's, ``compress compare``'s, or a search's split bench (which adds its key,
    split, limits and contenders)."""

    model_config = ConfigDict(extra="forbid")
    report_version: int = REPORT_VERSION
    pipeline: str | None
    baseline: str
    metric: str
    artifacts: list[Entry] = Field(min_length=1)
    gate: Gate
    flags: list[str]
    environment: dict[str, Any]
    traffic: dict[str, Any] | None = None
    settings: dict[str, Any]
    data: DataFacts
    comparison: dict[str, Any] | None = Field(None, description="compress compare: the runs and the reference")
    format: str | None = Field(None, description="a search's split bench: its format")
    key: str | None = Field(None, description="a search's split bench: what it stands for, for its cache")
    split: Literal["val", "test"] | None = None
    limits: LimitsModel | None = None
    contenders: list[dict[str, Any]] | None = None
    measured_in: dict[str, Any] | None = None
    upgraded_from: int | None = Field(None, description="the version a report was written in, where it was read "
                                                        "in today's names: facts added since are absent, not zero")

    def entry(self, name: str) -> Entry:
        found = next((a for a in self.artifacts if a.name == name), None)
        if found is None:
            raise KeyError(f"no candidate {name!r} in this report ({', '.join(a.name for a in self.artifacts)})")
        return found


def checked(report: dict) -> dict:
    """``report`` with its version, refused (``ReportVersionError``, the field named) where it does not fit the
    model: what every writer calls before a report reaches disk."""
    stamped = {"report_version": REPORT_VERSION, **report}
    try:
        Report.model_validate(stamped)
    except ValidationError as exc:
        raise ReportVersionError(f"the report does not fit its schema: {_first_error(exc)}") from exc
    return stamped


def read(data: dict, source: str) -> Report:
    """A report as written by any version this code knows; version 1 is upgraded, a newer one refused."""
    return Report.model_validate(readable(data, source))


def readable(data: dict, source: str) -> dict:
    """``data`` checked against the model and in today's names, its keys in the order written (a re-rendered
    report.json stays byte for byte the file it was read from)."""
    version = data.get("report_version", 1)
    if not isinstance(version, int) or version > REPORT_VERSION:
        raise ReportVersionError(f"{source}: report_version {version} was written by a newer compress; this one reads "
                                 f"versions 1 to {REPORT_VERSION}: upgrade compress or re-run the bench stage")
    if version == 1:
        data = upgraded(data)
    try:
        Report.model_validate(data)
        return data
    except ValidationError as exc:
        raise ReportVersionError(f"{source}: not a report of version {version}: {_first_error(exc)}; re-run the "
                                 "bench stage") from exc


def upgraded(data: dict) -> dict:
    """A version-1 report in version 2's names: the gate's limits under the pipeline file's names."""
    gate = dict(data.get("gate") or {})
    if "limits" not in gate and "max_accuracy_drop" in gate:
        gate["limits"] = {"metric": data.get("metric", "top1"), "max_drop": gate.pop("max_accuracy_drop"),
                          "p99_budget_ms": gate.pop("p99_budget_ms", None),
                          "decision": gate.get("decision", "point")}
        gate.setdefault("decision", gate["limits"]["decision"])
    return {**data, "gate": gate, "report_version": REPORT_VERSION, "upgraded_from": 1}


def schema_text() -> str:
    return json.dumps(Report.model_json_schema(), indent=2) + "\n"


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error["loc"])
    return f"{where}: {error['msg']}" + (f" ({len(exc.errors())} problems in all)" if len(exc.errors()) > 1 else "")
