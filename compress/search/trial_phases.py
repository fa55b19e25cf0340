"""The two phases of a trial, each run where Ray places it: build (every stage but the bench) and
measure (the trial's validation bench, with the machine to itself).

They are plain functions of plain values so that this module needs no Ray: the search driver
wraps them as Ray tasks with the resources each phase holds. A build is an ordinary run of the
trial's pipeline into the trial's directory (so its cache, its checkpoints and its manifest are
those of `compress run`), logged to ``log.txt`` there rather than to the search's console. A
measurement is the search's own bench of the trial's deployable artifacts beside the reference
baseline on the validation split (split_bench), in the environment of the search's process
(measure_env). A failure is returned as a result, never raised: one trial's crash must not stop
the search.
"""
from __future__ import annotations

import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console

from compress.errors import CompressError
from compress.pipeline.manifest import Manifest
from compress.pipeline.pipeline_file import Pipeline, build_pipeline
from compress.pipeline.runner import RunOptions, Runner
from compress.search.contenders import BASELINE, HAND_SET, TRIAL, Contender
from serve_bench.limits import Limits
from compress.search.measure_env import MeasurementEnvironment, measured_as
from compress.search.objective import outcome_of
from compress.search.split_bench import VALIDATION_BENCH, baseline_of, deployables, measure_split
from compress.search.trial_dirs import seed_trial
from serve_bench.report.files import REPORT_JSON
from serve_bench.report_model import Report

LOG_FILE = "log.txt"


@dataclass
class TrialSpec:
    label: str  # "reference" or the trial number
    run_dir: str
    raw: dict  # the trial's pipeline mapping
    source: str  # where it came from, for messages
    reference: str | None  # the reference run directory to start from (None: this is the reference)
    shared: list[str]  # the reference's stages the trial starts with
    early_stop_after: str | None
    hopeless_margin: float
    limits: dict  # Limits.as_dict() of the hand-set pipeline
    environment: dict  # MeasurementEnvironment.as_dict() of the search's process
    number: int | None = None  # the trial's number (None: the reference)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class EarlyStop:
    """Why a trial stopped before quantization, and its validation drop (points) then."""

    reason: str
    drop: float


def _run(spec: TrialSpec, pipeline: Pipeline, stages: list[str]) -> Manifest:
    run_dir = Path(spec.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / LOG_FILE, "a") as log:
        console = Console(file=log, width=160, soft_wrap=True, force_terminal=False, color_system=None)
        runner = Runner(pipeline, run_dir, console, RunOptions(stages=stages, reuse_run_dir=True))
        return runner.run()


def _failed(spec: TrialSpec, phase: str, exc: BaseException, started: float) -> dict:
    detail = str(exc) if isinstance(exc, CompressError) else "".join(
        traceback.format_exception_only(type(exc), exc)).strip()
    return {"status": "failed", "phase": phase, "error": detail, "seconds": round(time.monotonic() - started, 1),
            "log": str(Path(spec.run_dir) / LOG_FILE)}


def _hopeless(manifest: Manifest, pipeline: Pipeline, after: str, margin: float,
              reference: Manifest | None = None) -> EarlyStop | None:
    """Why the trial cannot come back within the red line, judged on validation accuracy after ``after``
    against the reference run's baseline (the trial's own where no reference is given)."""
    if pipeline.config.red_line.metric != "top1":
        return None
    record = manifest.stages.get(after)
    train = next((s.name for s in pipeline.stages if s.kind == "train"), None)
    baseline = (reference or manifest).stages.get(train) if train else None
    val = record.metrics.get("val_top1") if record else None
    base_val = baseline.metrics.get("best_val_top1") if baseline else None
    if val is None or base_val is None:
        return None
    max_drop, drop = pipeline.config.red_line.max_drop, base_val - val
    if drop - max_drop <= margin:
        return None
    return EarlyStop(f"stopped after {after}: validation top-1 {val:.2f}% against the baseline's {base_val:.2f}%, a "
                     f"drop of {drop:.2f} points, {drop - max_drop:.2f} past the red line of {max_drop:g} (more than "
                     f"hopeless_margin {margin:g}); quantization would not bring it back", round(drop, 4))


def build(spec_dict: dict) -> dict:
    """Every stage but the bench; stops early where pruning already missed the red line by far."""
    spec, started = TrialSpec(**spec_dict), time.monotonic()
    try:
        if spec.reference is not None:
            seed_trial(Path(spec.reference), Path(spec.run_dir), spec.shared)
        pipeline = build_pipeline(spec.raw, spec.source)
        stages = [s for s in pipeline.stages if s.kind != "bench"]
        names = [s.name for s in stages]
        after = spec.early_stop_after or next((s.name for s in stages if s.kind == "prune"), None)
        if after in names and after not in spec.shared and spec.reference is not None:
            first = names[:names.index(after) + 1]
            manifest = _run(spec, pipeline, first)
            stop = _hopeless(manifest, pipeline, after, spec.hopeless_margin, Manifest.load(Path(spec.reference)))
            if stop is not None:
                return {"status": "pruned", "reason": stop.reason, "drop": stop.drop,
                        "seconds": round(time.monotonic() - started, 1)}
            names = names[len(first):]
        if names:
            _run(spec, pipeline, names)
        return {"status": "built", "seconds": round(time.monotonic() - started, 1)}
    except Exception as exc:  # noqa: BLE001 - recorded as the trial's failure
        return _failed(spec, "build", exc, started)


def contenders_of(spec: TrialSpec, pipeline: Pipeline) -> list[Contender]:
    """The reference baseline, then every deployable artifact the run made (its own baseline excepted)."""
    reference_dir = Path(spec.reference or spec.run_dir)
    reference = Manifest.load(reference_dir)
    manifest = Manifest.load(Path(spec.run_dir))
    if reference is None or manifest is None:
        raise CompressError(f"{reference_dir if reference is None else spec.run_dir}: no manifest.json to measure from")
    baseline = baseline_of(pipeline, reference)

    def made_here(name: str) -> Contender:
        return Contender(HAND_SET, name, spec.run_dir) if spec.number is None else \
            Contender(TRIAL, name, spec.run_dir, trial=spec.number)

    return [Contender(BASELINE, baseline, str(reference_dir))] + [
        made_here(name) for name in deployables(pipeline) if name != baseline and name in manifest.artifacts]


def validation_bench(spec: TrialSpec, pipeline: Pipeline) -> tuple[Report, Path]:
    """The run's validation bench (a cached one stands where nothing it measured changed)."""
    out = Path(spec.run_dir) / VALIDATION_BENCH
    report = measure_split(contenders_of(spec, pipeline), pipeline, Limits.from_dict(spec.limits), "val", out, reuse=True)
    return report, out / REPORT_JSON


def measure(spec_dict: dict) -> dict:
    """The trial's validation bench, then its candidate and figures from the report."""
    spec, started = TrialSpec(**spec_dict), time.monotonic()
    try:
        with measured_as(MeasurementEnvironment.from_dict(spec.environment)) as reached:
            pipeline = build_pipeline(spec.raw, spec.source)
            report, report_path = validation_bench(spec, pipeline)
        outcome = outcome_of(report)
        if outcome["candidate"] is None:
            return {"status": "failed", "phase": "measure", "error": outcome["why"],
                    "seconds": round(time.monotonic() - started, 1), "log": str(Path(spec.run_dir) / LOG_FILE)}
        manifest = Manifest.load(Path(spec.run_dir))
        if manifest is not None and outcome["candidate"] in manifest.artifacts:  # two trials may make one file
            outcome["sha256"] = manifest.artifacts[outcome["candidate"]].sha256
        return {"status": "measured", "outcome": outcome, "report": str(report_path),
                "environment": reached.as_dict(), "seconds": round(time.monotonic() - started, 1)}
    except Exception as exc:  # noqa: BLE001 - recorded as the trial's failure
        return _failed(spec, "measure", exc, started)
