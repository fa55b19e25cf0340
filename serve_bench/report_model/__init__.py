"""The report as a typed model: what ``report.json`` holds, checked when it is written and read as this model.

The gate, the release, the card, compare, the search and the renderers all read the same file. As a
dict whose shape only the writer knew, a renamed key broke a reader without a word; as a model, a
report that does not fit is refused where it is written, with the field named, every reader reads
attributes a type checker and a test can follow, and the JSON schema beside every ``report.json``
(``report.schema.json``) tells another tool what to expect.

Every report carries ``report_version``. Version 1 is a report written before the version was (its
gate's limits under the old names ``max_accuracy_drop`` and ``p99_budget_ms``): it is read, its
limits moved to the names the pipeline file gives them. Before version 4 an entry named its runtime
``backend``: it is read as ``runtime``, with a warning in the log. A report of a newer version than
this code knows is refused with both versions named.

The models type every field a reader of this project relies on and keep the rest as written (each
section allows facts it does not name: a runtime's own settings, a profile's rows), so a runtime
can add a fact without a schema bump, and a report reads back as the dict it was written from
(``Report.document``). This package is its own floor in ``serve_bench``: the gate judges entries of
this model, and the renderers, the release and the search read it; it imports only ``limits``. The
sections of one entry's measurements are in ``sections``; the entry, the report and its reading here.
"""
from __future__ import annotations

import json
import logging
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from serve_bench.report_model.sections import (Capacity, Decision, EntryTraffic, Interval, LatencyFigures,
                                               LimitsModel, LoadGenVerdict, Paired, Ratio, RatioPair, RuntimeParity,
                                               ServerRun, Serving, SteadyState, Sweep, SweepConfig, _Open)

logger = logging.getLogger(__name__)

__all__ = ["Capacity", "Comparison", "ComparedRun", "DataFacts", "Entry", "EntryTraffic", "Environment", "Gate",
           "LatencyFigures", "LimitsModel", "LoadGenVerdict", "Paired", "Quantization", "Ratio", "RatioPair",
           "Repeats", "Report", "ReportVersionError", "Rung", "RuntimeParity", "ServerRun", "Serving", "Spread",
           "SteadyState", "Sweep", "SweepConfig", "Traffic", "REPORT_VERSION", "SCHEMA_FILE", "checked", "entries",
           "model_of", "read", "readable", "schema_text", "upgraded"]

REPORT_VERSION = 5  # 3: an entry may be a reference (role), which no gate judges: an older reader must refuse it;
# 4: an entry, its runner record and its profile name their runtime ``runtime`` (``backend`` before);
# 5: a file's traffic may be measured at its server (``measured_at: served``): an older reader would gate it on the
# in-process run without a word, so it must refuse it
SCHEMA_FILE = "report.schema.json"


class ReportVersionError(ValueError):
    """A report this code cannot read as it is: its version is newer, or it does not fit the model."""


class Rung(_Open):
    rung: str
    within_red_line: bool
    float_layers: int
    flavours: dict[str, dict[str, Any]]
    latency: dict[str, float] | None = None


class Quantization(_Open):
    """The INT8 ladder the quantize stage climbed for this file (an NNCF stage's file names no rung)."""

    rung: str | None = None
    flavour: str | None = None
    float_layers: list[str] = Field(default_factory=list)
    climbed: list[str] = Field(default_factory=list)
    rungs: list[Rung] = Field(default_factory=list)


class Spread(_Open):
    min: float
    max: float
    max_over_min: float | None = None
    std: float | None = Field(None, description="the percentile's standard deviation across the repeats")


class Repeats(_Open):
    k: int
    spread: dict[str, Spread]
    per_repeat: list[dict[str, float]] | None = Field(None, description="each repeat's percentiles (ms)")


class Entry(_Open):
    """One candidate (a file on a runtime) as measured and judged."""

    name: str
    artifact: str | None = None
    stage: str | None = None
    runtime: str = Field(description="the runtime it ran on (a registry name: torch, onnxruntime, openvino, "
                                     "tensorrt, inductor); reports before version 4 called it backend")
    precision: str
    format: str
    path: str
    size_bytes: int
    params: int | None = None
    macs: int | None = None
    source_model: str | None = None
    run: str | None = Field(None, description="compress compare: the run this file came from")
    run_artifact: str | None = Field(None, description="compress compare and a search's split bench: the file's "
                                                       "artifact name in its run")
    accuracy: dict[str, Any] = Field(description="metric → value (percent, mAP or mIoU points), with n")
    accuracy_ci: dict[str, Interval] = Field(default_factory=dict)
    accuracy_drop: float | None = Field(description="points below the baseline; None where not paired")
    accuracy_paired: Paired | None = None
    eval_batch: int | None = None
    refused: str | None = Field(None, description="why the quantize stage refused this file on this runtime")
    latency_ms: LatencyFigures
    throughput: float | None = None
    speedup_p99: float | None = None
    speedup_p99_ci: Interval | None = None
    latency_ratio: RatioPair | None = None
    int8_vs_fp32: RatioPair | None = None
    repeats: Repeats | None = None
    runtime_parity: RuntimeParity | None = None
    quantization: Quantization | None = None
    accuracy_at_serving_batch: dict[str, Any] | None = None
    machine_load: dict[str, Any] | None = None
    operator_profile: dict[str, Any] | None = None
    runner: dict[str, Any] = Field(default_factory=dict, description=(
        "what the runtime ran with, read back from it: runtime, device, threads, and its own settings (OpenVINO's "
        "inference_precision, the execution provider); the gate reads device (a profile explains latency only "
        "where the file was timed on the profiler's device) and inference_precision (a float file on bf16 kernels)"))
    postprocess_ms: dict[str, Any] | None = Field(None, description="a detector: its NMS per image (p50, p99 ms, n, "
                                                                    "what), timed apart from the file's latency")
    per_class_iou: dict[str, float | None] | None = Field(None, description="a segmenter: IoU per class (points; "
                                                                           "None where the class is in neither "
                                                                           "the masks nor the answers)")
    answered_only: dict[str, int] | None = Field(None, description="a segmenter: pixels it answered with a class no "
                                                                  "test mask holds (not in its mIoU, which averages "
                                                                  "over the classes in the masks)")
    per_class_loss: list[dict[str, Any]] | None = Field(None, description="a segmenter: the classes whose IoU falls "
                                                                         "the most below the baseline's (points)")
    traffic: EntryTraffic | None = None
    contender: dict[str, Any] | None = Field(None, description="a search's split bench: the trial it stands for")
    role: str | None = Field(None, description="reference: the baseline's own file, made as it is (export alone, "
                                               "compile alone): every compressed file is divided by it, and the gate "
                                               "judges and may release it like any other")
    vs_export_alone: RatioPair | None = Field(None, description="latency over the unpruned model's fp32 file on the "
                                                                "same runtime (exported alone; on torch.compile, "
                                                                "compiled alone): what compression earned there")
    vs_compile_alone: RatioPair | None = Field(None, description="latency over the unpruned torch model under "
                                                                 "torch.compile (compile alone): what compression and "
                                                                 "the runtime earned over what a PyTorch user "
                                                                 "deploys without either")
    channel_widths: dict[str, Any] | None = Field(None, description="the file's convolution widths against the "
                                                                    "channel multiple its runtime wants on this CPU, "
                                                                    "beside the unpruned file's (file, unpruned)")

    def server_run(self) -> ServerRun | None:
        """The run at the pipeline's traffic when the pipeline gates on the server scenario: the served run where
        the pipeline measures it through the model server (``latency.measured_at: served``), else the at-target run
        in process. None where there is none (a file no server here ran, under served)."""
        traffic = self.traffic
        if traffic is None or traffic.scenario != "server":
            return None
        if traffic.measured_at == "served":
            return traffic.served.run if traffic.served is not None else None
        return traffic.at_target


class Gate(_Open):
    limits: LimitsModel
    passed: bool
    release: str | None
    reasons: list[str]
    notes: list[str] = Field(default_factory=list)
    decision: Decision
    decided_on: str | None = None
    confidence: float | None = None
    family_error_bound: float | None = None
    latency_basis: str | None = None
    ranked_by: str | None = None


class TestIndependence(_Open):
    status: str | None = None
    note: str | None = Field(None, description="what the status means for the accuracy measured, in words")


class DataFacts(_Open):
    name: str
    test_images: int
    meaningful_accuracy: bool = True
    test_digest: str
    smallest_certifiable_drop: float | None = None
    test_independence: TestIndependence | None = None


class Environment(_Open):
    """The machine behind the figures (train.hardware's facts); read by the console, the card and the release.

    Declared in the order ``compress.pipeline.fingerprint.environment`` writes them, so the section dumps back
    (``written``) with its keys as written: the model card copies it verbatim."""

    python: str | None = None
    platform: str | None = None
    machine: str | None = None
    cpu: str | None = None
    cpu_count: int | None = None
    isa: dict[str, Any] | None = None
    isa_summary: str | None = None
    runtimes: dict[str, dict[str, Any] | None] | None = Field(
        None, description="each runtime's own view (its runner's fingerprint: version, and onnxruntime's providers)")
    onnxruntime: dict[str, Any] | None = Field(None, description="deprecated: what reports before ``runtimes`` "
                                                                 "recorded of onnxruntime alone; read, never written")
    torch_threads: int | None = None
    packages: dict[str, str] = Field(default_factory=dict)
    cuda: str | None = None
    gpu: dict[str, Any] | None = None


class Traffic(_Open):
    """The pipeline's traffic as the bench measured it: the scenario, its rate and budget, the serving settings."""

    scenario: str | None = None
    target_qps: float | None = None
    p99_budget_ms: float | None = None
    measured_at: str | None = Field(None, description="where the gated p99 was measured: in_process, or served "
                                                      "(through the model server)")
    settings: dict[str, Any] | None = None
    sut_overhead: dict[str, ServerRun | None] | None = None


class ComparedRun(_Open):
    run: str
    label: str
    artifact: str
    candidate: str | None = None
    options: dict[str, Any] | None = None
    test_digest: str | None = None
    paired: bool | None = None


class Comparison(_Open):
    runs: list[ComparedRun]
    reference: str


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
    environment: Environment
    traffic: Traffic | None = None
    settings: dict[str, Any]
    data: DataFacts
    comparison: Comparison | None = Field(None, description="compress compare: the runs and the reference")
    format: str | None = Field(None, description="a search's split bench: its format")
    key: str | None = Field(None, description="a search's split bench: what it stands for, for its cache")
    split: Literal["val", "test"] | None = None
    limits: LimitsModel | None = None
    contenders: list[dict[str, Any]] | None = None
    measured_in: dict[str, Any] | None = None
    upgraded_from: int | None = Field(None, description="the version a report was written in, where it was read "
                                                        "in today's names: facts added since are absent, not zero")
    _source: dict | None = PrivateAttr(None)

    def entry(self, name: str) -> Entry:
        found = next((a for a in self.artifacts if a.name == name), None)
        if found is None:
            raise KeyError(f"no candidate {name!r} in this report ({', '.join(a.name for a in self.artifacts)})")
        return found

    def reference_entry(self) -> Entry:
        """The baseline's entry: what every drop and ratio in this report is against."""
        return self.entry(self.baseline)

    def document(self) -> dict:
        """The report as the dict it is written as: the fields it was read or made with, under their JSON names, in
        the order of the file it was read from (a re-rendered report.json stays that file byte for byte)."""
        dumped = self.model_dump(mode="json", by_alias=True, exclude_unset=True)
        return _ordered_like(dumped, self._source) if self._source is not None else dumped


def checked(report: dict) -> dict:
    """``report`` with its version, refused (``ReportVersionError``, the field named) where it does not fit the
    model: what every writer calls before a report reaches disk."""
    stamped = {"report_version": REPORT_VERSION, **report}
    try:
        Report.model_validate(stamped)
    except ValidationError as exc:
        raise ReportVersionError(f"the report does not fit its schema: {_first_error(exc)}") from exc
    return stamped


def model_of(report: dict | Report) -> Report:
    """A report being written (a dict of today's version, checked) as the model its readers take."""
    return report if isinstance(report, Report) else Report.model_validate(checked(report))


def read(data: dict, source: str) -> Report:
    """A report as written by any version this code knows; version 1 is upgraded, a newer one refused."""
    written = readable(data, source)
    report = Report.model_validate(written)
    report._source = written
    return report


def _ordered_like(value, like):
    """``value`` with each dict's keys in the order ``like`` has them (keys ``like`` lacks last), at every depth."""
    if isinstance(value, dict) and isinstance(like, dict):
        keys = [k for k in like if k in value] + [k for k in value if k not in like]
        return {k: _ordered_like(value[k], like.get(k)) for k in keys}
    if isinstance(value, list) and isinstance(like, list) and len(value) == len(like):
        return [_ordered_like(v, w) for v, w in zip(value, like)]
    return value


def entries(artifacts: list[dict]) -> list[Entry]:
    """Report entries as the bench builds them, read as the model the gate judges (refused where they do not fit)."""
    try:
        return [Entry.model_validate(a) for a in artifacts]
    except ValidationError as exc:
        raise ReportVersionError(f"a report entry does not fit its schema: {_first_error(exc)}") from exc


def readable(data: dict, source: str) -> dict:
    """``data`` checked against the model and in today's names, its keys in the order written (a re-rendered
    report.json stays byte for byte the file it was read from)."""
    version = data.get("report_version", 1)
    if not isinstance(version, int) or version > REPORT_VERSION:
        raise ReportVersionError(f"{source}: report_version {version} was written by a newer compress; this one reads "
                                 f"versions 1 to {REPORT_VERSION}: upgrade compress or re-run the bench stage")
    if version < REPORT_VERSION:
        data = upgraded(data, version)
        logger.warning("%s: a report of version %d, read in today's names%s; re-run the bench stage to write "
                       "version %d", source, version, " (an entry's backend is now its runtime)" if version < 4 else "",
                       REPORT_VERSION)
    try:
        Report.model_validate(data)
        return data
    except ValidationError as exc:
        raise ReportVersionError(f"{source}: not a report of version {version}: {_first_error(exc)}; re-run the "
                                 "bench stage") from exc


def upgraded(data: dict, version: int = 1) -> dict:
    """An older report in today's names: version 1's gate limits under the pipeline file's names, and (before
    version 4) each entry's ``backend`` as its ``runtime``, in its runner record and its profile too."""
    data = {**data, "artifacts": [_runtime_named(a) for a in data.get("artifacts", [])]}
    gate = dict(data.get("gate") or {})
    if "limits" not in gate and "max_accuracy_drop" in gate:
        gate["limits"] = {"metric": data.get("metric", "top1"), "max_drop": gate.pop("max_accuracy_drop"),
                          "p99_budget_ms": gate.pop("p99_budget_ms", None),
                          "decision": gate.get("decision", "point")}
        gate.setdefault("decision", gate["limits"]["decision"])
    return {**data, "gate": gate, "report_version": REPORT_VERSION, "upgraded_from": version}


def _runtime_named(entry: dict) -> dict:
    """An entry written before version 4: ``backend`` (and the runtime a variant repeated) as one ``runtime``."""
    out = {("runtime" if k == "backend" else k): v for k, v in entry.items()
           if not (k == "runtime" and "backend" in entry)}
    for section in ("runner", "operator_profile"):
        if isinstance(out.get(section), dict) and "backend" in out[section]:
            out[section] = {("runtime" if k == "backend" else k): v for k, v in out[section].items()}
    return out


def schema_text() -> str:
    return json.dumps(Report.model_json_schema(), indent=2) + "\n"


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error["loc"])
    return f"{where}: {error['msg']}" + (f" ({len(exc.errors())} problems in all)" if len(exc.errors()) > 1 else "")
