"""`compress compare`: the artifacts of several runs, measured against each other in one run.

Latencies from two runs' reports were taken at different times on a machine whose p99 moves
by 3× between runs, so they cannot be compared; their accuracies, though measured on the same
images, lose the pairing once only the totals are kept. So compare measures the chosen
artifact of every run again, interleaved in one measurement, and pairs their predictions
image by image where the runs share the test split digest. Where they do not (another data
set, another split), pairing would compare different images: it is refused with the reason,
and each accuracy is reported on its own run's test split.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from compress.errors import ArtifactError, ConfigError
from compress.pipeline.bench_report import find_report, load_report
from compress.pipeline.fingerprint import environment
from compress.pipeline.manifest import Manifest
from compress.pipeline.pipeline_data import load_section
from serve_bench.accuracy.judges import JUDGES
from compress.pipeline.pipeline_file import Pipeline, load_pipeline
from compress.stages.base import InputArtifact
from compress.stages.bench_stage import BenchConfig
from compress.stages.measurement import (bench_settings, candidates_of, measure_and_judge,
                                         summary_table, test_set_of)
from compress.stages.provenance import runs_independence
from compress.stages.runtime_choice import runtime_settings
from serve_bench import report_model
from serve_bench.bench import BenchSettings, TestSet
from serve_bench.runners import RUNNER_OF_KIND
from serve_bench.report.files import write_report
from serve_bench.report.tables import comparison_table
from train.atomic_io import atomic_dir

logger = logging.getLogger(__name__)


@dataclass
class ComparedRun:
    run_dir: Path
    label: str  # the run directory's name, made unique
    pipeline: Pipeline
    report: report_model.Report | None  # its last bench report, where it has one
    artifact: InputArtifact
    candidate: str  # the candidate picked (file on runtime), e.g. export.onnx@openvino as a gate released it
    test: TestSet
    meaningful_accuracy: bool


def default_out() -> Path:
    return Path("runs") / time.strftime("compare-%Y%m%d-%H%M%S")


def _chosen(run_dir: Path, manifest: Manifest, report: report_model.Report | None,
            name: str | None) -> tuple[InputArtifact, str]:
    """The artifact to compare and the candidate picked: a released ``file@runtime`` names the file ``file``."""
    if name is None:
        if report is None:
            raise ConfigError(f"{run_dir}: it has no bench report, so no released artifact to compare; name one "
                              "with --artifact (e.g. --artifact train.model)")
        name = report.gate.release
        if name is None:
            raise ConfigError(f"{run_dir}: its gate released nothing, so there is no default artifact to compare; "
                              f"name one with --artifact (e.g. --artifact {report.baseline})")
    candidate = name
    entry = next((e for e in report.artifacts if e.name == name), None) if report is not None else None
    if entry is not None and entry.artifact:  # the report says which file a candidate ("file on runtime") is
        name = entry.artifact
    elif name not in manifest.artifacts and "@" in name:  # a name typed as file@runtime, no report to ask
        name = name.rsplit("@", 1)[0]
    record = manifest.artifacts.get(name)
    if record is None:
        raise ConfigError(f"{run_dir}: no artifact {name!r} in its manifest "
                          f"(it has {', '.join(sorted(manifest.artifacts))}); fix --artifact")
    problem = manifest.verify(run_dir, name)
    if problem:
        raise ArtifactError(f"{run_dir}: artifact {name}: {problem}; re-run that run's stage {record.stage!r}")
    return (InputArtifact(name, record.kind, manifest.resolve_path(run_dir, record), record.meta, record.size_bytes),
            candidate)


def _pick_entry(run: "ComparedRun") -> report_model.Entry | None:
    """The run's own report entry of its pick, where its report measured it."""
    if run.report is None:
        return None
    return next((e for e in run.report.artifacts if e.name == run.candidate), None)


def _runtime_of(run: "ComparedRun") -> str:
    """The runtime a run's pick ran on: its own report's entry where it has one, else the ``@runtime`` of its name,
    else the runtime that loads its kind of artifact first."""
    entry = _pick_entry(run)
    if entry is not None:
        return entry.runtime
    if "@" in run.candidate:
        return run.candidate.rsplit("@", 1)[1]
    return RUNNER_OF_KIND.get(run.artifact.kind, "")


def _test_set(run_dir: Path, pipeline: Pipeline, cache: dict[str, tuple]) -> tuple[TestSet, bool]:
    """The run's test split, and whether its labels mean anything (not synthetic)."""
    key = pipeline.config.data.model_dump_json()
    if key not in cache:
        data = load_section(pipeline.config.data, str(run_dir / "pipeline.resolved.yaml"))
        cache[key] = (test_set_of(data), data.meaningful_accuracy)
    return cache[key]


def load_runs(run_dirs: list[Path], artifact: str | None, picks: list[str | None] | None = None,
              labels: list[str] | None = None) -> list[ComparedRun]:
    """``picks``: an artifact per run (None: that run's released one), where runs differ in what to take."""
    picks = picks or [artifact] * len(run_dirs)
    runs, used, tests = [], set(), {}
    for i, run_dir in enumerate(run_dirs):
        manifest = Manifest.load(run_dir)
        resolved = run_dir / "pipeline.resolved.yaml"
        if manifest is None or not resolved.is_file():
            raise ConfigError(f"{run_dir}: not a run directory (needs manifest.json and pipeline.resolved.yaml); "
                              "give the folder `compress run` wrote")
        report = load_report(run_dir)[0] if find_report(run_dir).is_file() else None
        pipeline = load_pipeline(resolved)
        if pipeline.config.task in JUDGES:  # judged by the paired image bootstrap, which compare does not pool yet
            raise ConfigError(f"{run_dir}: a {pipeline.config.task} run cannot be compared yet (compare pairs top-k "
                              "accuracy image by image); its own bench report holds the paired drops of its files")
        wanted = labels[i] if labels else run_dir.resolve().name
        label, n = wanted, 2
        while label in used:
            label, n = f"{wanted}-{n}", n + 1
        used.add(label)
        runs.append(ComparedRun(run_dir, label, pipeline, report, *_chosen(run_dir, manifest, report, picks[i]),
                                *_test_set(run_dir, pipeline, tests)))
    return runs


def _settings(first: ComparedRun, repeats: int) -> tuple[BenchSettings, BenchConfig]:
    """The reference run's measurement protocol (its bench settings), so the figures are comparable to its report."""
    own = first.report.settings if first.report is not None else {}
    saved = {k: v for k, v in own.items() if k in BenchConfig.model_fields}
    saved.update(name="compare", kind="bench", repeats=repeats)
    try:
        cfg = BenchConfig(**saved)
    except ValueError as exc:
        raise ArtifactError(f"{first.run_dir}: its report's bench settings no longer validate ({exc})") from exc
    return bench_settings(cfg, first.pipeline.config, repeats=repeats), cfg


def compare_runs(run_dirs: list[Path], out: Path, console: Console, artifact: str | None = None,
                 repeats: int = 1, picks: list[str | None] | None = None, labels: list[str] | None = None) -> dict:
    if out.exists():
        raise ConfigError(f"--out {out}: it exists; give a new folder (a comparison never overwrites one)")
    runs = load_runs(run_dirs, artifact, picks, labels)
    first = runs[0]
    settings, cfg = _settings(first, repeats)
    specs, own_tests, picked, configured = [], {}, [], []
    for run in runs:  # every run's file on every runtime the reference's bench measures on, as its bench does
        candidates = candidates_of(run.artifact, cfg)
        runtime = _runtime_of(run)
        mine = next((c for c in candidates if c.runtime == runtime), None)
        if mine is None:
            raise ConfigError(f"{run.run_dir}: {run.candidate} ran on {runtime}, which this comparison does not "
                              f"measure {run.artifact.name} on (here: {', '.join(c.runtime for c in candidates)}); "
                              "name another with --artifact")
        # the pick runs with the options its own bench stage was configured with (OpenVINO's hint and precision,
        # as set, not as resolved on the machine that measured it); threads follow the comparison's protocol
        own = runtime_settings(_settings(run, repeats)[1]).get(mine.runtime) if run.report is not None else None
        if own:
            if own != (theirs := runtime_settings(cfg).get(mine.runtime)):
                console.print(f"{run.label}:{mine.name} runs with its own run's {mine.runtime} options {own}, not the "
                              f"reference's {theirs}", style="yellow", highlight=False)
            mine.options = {**mine.options, **own}
        configured.append({k: v for k, v in mine.options.items() if k != "threads"})
        for spec in candidates:
            spec.name = f"{run.label}:{spec.name}"
            spec.extra = {**spec.extra, "run": str(run.run_dir), "run_artifact": run.artifact.name}
            specs.append(spec)
            own_tests[spec.name] = run.test
        picked.append(mine.name)  # by runtime, not by name: the reference's runtimes may be in another order
    reference = picked[0]
    console.print(f"comparing {', '.join(s.name for s in specs)}: one interleaved measurement, "
                  f"reference {reference}", highlight=False)
    meaningful = first.meaningful_accuracy
    independence = runs_independence([run.pipeline.config for run in runs])
    judged = measure_and_judge(specs, reference, first.test, settings, data_name=first.pipeline.config.data.name,
                               meaningful=meaningful, environment=environment(), independence=independence,
                               run_dir_of=lambda entry: Path(entry.run), own_tests=own_tests)
    result = judged.result
    report = {"pipeline": "compare", **judged.report,
              "settings": {**cfg.model_dump(mode="json"), "batch_size": settings.batch_size},
              "comparison": {"runs": [{"run": str(r.run_dir), "label": r.label, "artifact": r.artifact.name,
                                       "candidate": r.candidate, "options": options, "test_digest": r.test.digest,
                                       "paired": name not in result.unpaired}
                                      for r, name, options in zip(runs, picked, configured)],
                             "reference": reference}}
    with atomic_dir(out) as folder:
        write_report(folder, report, result.latencies, result.predictions)
    written = report_model.model_of(report)  # the tables read the model
    console.print(summary_table(written))
    console.print(_console_table(written))
    for name, why in result.unpaired.items():
        console.print(f"pairing refused: {name}: {why}", style="yellow", highlight=False)
    console.print(f"comparison report in {out}", highlight=False)
    return report


CONSOLE_COLUMNS = ("run", "M MACs", "drop vs reference [95% CI]", "only reference / only this right",
                   "p50 ratio [95% CI]", "p99 ratio [95% CI]")


def _console_table(report: report_model.Report) -> Table:
    """The comparison's deciding columns (report.md has them all)."""
    head, rows = comparison_table(report)
    keep = [head.index(c) for c in CONSOLE_COLUMNS]
    table = Table(title="comparison against " + report.baseline)
    for i in keep:
        table.add_column(head[i], justify="left" if head[i] == "run" else "right")
    for row in rows:
        table.add_row(*(row[i] for i in keep))
    return table
