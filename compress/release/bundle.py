"""`compress release`: the artifact the gate released, as a folder a deployer can use alone.

The bundle holds the file exactly as measured (same sha256 as in the run's manifest and as the
bench that decided read: ``measured``), the TensorRT engines of the same model that bench measured
and the gate passes, the model card, the report the gate decided on, the resolved pipeline and
``SHA256SUMS``. It is written beside its final name and renamed into place when complete, so an
interrupted release never leaves a partial bundle under that name, and an existing folder is
never written into.
"""
from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from compress import __version__
from compress.errors import ArtifactError, CompressError, ConfigError
from compress.pipeline.bench_report import load_report
from compress.pipeline.manifest import ArtifactRecord, Manifest, now
from compress.release.checksums import write_sums
from compress.release.measured import (EngineChoice, deciding_bench, engines_to_ship, measured_digests,
                                       report_artifacts, require_measured)
from compress.release.model_card import build_card, render_markdown
from export.external_data import UnsafeModelError, check_external_data
from export.onnx_metadata import CLASSES_KEY, PREPROCESSING_KEY, input_description, read_deployment
from export.tensorrt_engine import ENGINE_KIND
from serve_bench.gate import preferred
from serve_bench.release_choice import release_order
from serve_bench.report.files import environment_line
from serve_bench.report_model import Entry, Report
from train.atomic_io import atomic_dir
from train.file_digest import file_sha256
from serve_bench.runners import RUNNER_OF_KIND, RUNNERS
from serve_bench.servers.deployment import (CPU_SERVED, SERVING_FOLDER, model_name, served_settings,
                                            write_server_files)
from serve_bench.servers.tensors import ServedFileError
from train.model_io import DESCRIPTION_FILE, read_description

logger = logging.getLogger(__name__)

CARD_JSON, CARD_MD, GATE_FAILED_FILE, PIPELINE_FILE = "model_card.json", "MODEL_CARD.md", "GATE_FAILED.txt", "pipeline.yaml"


class ReleaseRefused(CompressError):
    """The gate did not release what was asked for; exit 1, as for a failed gate."""

    exit_code = 1


@dataclass
class Release:
    folder: Path
    artifact: str
    card: dict

    @property
    def passed(self) -> bool:
        return not self.card["released_anyway"]


def make_release(run_dir: Path, to: Path, *, anyway: bool = False, artifact: str | None = None) -> Release:
    run_dir, to = Path(run_dir), Path(to)
    if to.exists() and (not to.is_dir() or any(to.iterdir())):
        raise ConfigError(f"--to {to}: it exists and is not an empty folder; give a new folder (a release never "
                          "overwrites one)")
    manifest = Manifest.load(run_dir)
    if manifest is None:
        raise ArtifactError(f"{run_dir} has no manifest.json: give the run directory of a finished `compress run`")
    report, report_path = load_report(run_dir)
    name = _chosen(report, artifact, anyway, report_path)
    entry = report.entry(name)
    file_name = entry.artifact or name  # a candidate "file on runtime" names the manifest's file
    record = manifest.artifacts.get(file_name)
    if record is None:
        raise ArtifactError(f"{report_path} released {name}, whose file {file_name} {run_dir}/manifest.json does not list; "
                            f"re-run the bench stage: compress run <pipeline> --run-dir {run_dir} --from <bench stage>")
    for checked in [file_name, *report_artifacts(manifest, report_path, run_dir)]:
        problem = manifest.verify(run_dir, checked)
        if problem:
            raise ArtifactError(f"{checked}: {problem}; the bundle must hold what was measured — re-run the stage "
                                "that made it and the bench stage")
    bench = deciding_bench(manifest, run_dir, report_path)
    require_measured(record, bench, run_dir)
    engines = engines_to_ship(_engines_of(manifest, record), report, measured_digests(bench))
    with atomic_dir(to) as work:  # an existing `to` is empty, checked above
        card = _assemble(work, run_dir, manifest, record, report, report_path, entry, anyway, engines)
        write_sums(work)
    return Release(to, name, card)


def _chosen(report: Report, artifact: str | None, anyway: bool, report_path: Path) -> str:
    gate, names = report.gate, [a.name for a in report.artifacts]
    if artifact is not None and artifact not in names:
        raise ConfigError(f"--artifact {artifact}: not in {report_path}; measured: {', '.join(names)}")
    released = gate.release if gate.passed else None
    if released is not None and artifact in (None, released):
        return released
    why = (f"the gate released {released}, not {artifact}" if released else
           "the release gate FAILED: " + ("; ".join(gate.reasons) or "no artifact passed"))
    if not anyway:
        raise ReleaseRefused(f"{report_path}: {why}. Nothing was written; pass --anyway to bundle it regardless "
                             "(the bundle is marked as not passed)")
    if artifact is not None:
        return artifact
    candidates = [a for a in report.artifacts if a.name != report.baseline and not a.refused]  # each has its latency
    if not candidates:
        raise ConfigError(f"{report_path}: no measured artifact besides the baseline; name one with --artifact")
    return preferred(release_order(candidates)).name  # an exported or compiled file before torch eager


def _decisive_config(manifest: Manifest, run_dir: Path, report_path: Path) -> Path:
    """The resolved pipeline the bench stage that wrote the report ran with (pipeline.resolved.yaml is only
    the latest run's, which may have changed settings since)."""
    for name in report_artifacts(manifest, report_path, run_dir):
        record = manifest.stages.get(manifest.artifacts[name].stage)
        if record is not None and record.resolved_config and (run_dir / record.resolved_config).is_file():
            return run_dir / record.resolved_config
    return run_dir / "pipeline.resolved.yaml"


def _copy_artifact(manifest: Manifest, run_dir: Path, record: ArtifactRecord, target: Path) -> list[str]:
    """Copy the files of one artifact into ``target``; the names copied, relative to it."""
    source = manifest.resolve_path(run_dir, record)
    target.mkdir(parents=True)
    if record.kind == "onnx" and source.is_dir():
        main = source / record.meta.get("file", "model.onnx")
        try:
            check_external_data(main)
        except UnsafeModelError as exc:
            raise ArtifactError(f"{record.name}: {exc}") from exc
        names = record.meta.get("files") or [main.name]
        for file in names:
            shutil.copy2(source / file, target / file)
        return names
    if source.is_dir():
        shutil.copytree(source, target, dirs_exist_ok=True)
        return sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file())
    shutil.copy2(source, target / source.name)
    return [source.name]


def _engines_of(manifest: Manifest, record: ArtifactRecord) -> list[ArtifactRecord]:
    """TensorRT engines of the same model: built from the released file, or from a sibling file of the same
    source model (an INT8 engine is built from the quantize stage's TensorRT flavour). Candidates only:
    ``engines_to_ship`` decides which of them ship."""
    source = record.meta.get("source_model")
    related = {record.name} | {n for n, r in manifest.artifacts.items()
                               if source and r.kind == "onnx" and r.meta.get("source_model") == source}
    return [r for r in manifest.artifacts.values()
            if r.kind == ENGINE_KIND and r.name != record.name and related & set(r.made_from)]


def _server_files(work: Path, source: Path, record: ArtifactRecord, entry: Entry, report: Report, files: list[str],
                  folder: str) -> dict | None:
    """The model servers' files for the released file (a Triton model repository and an OpenVINO Model Server
    config, ``serving/``), written from the serving settings the bench measured it with; None for a file no CPU
    model server here runs (a torch model, a TensorRT engine), said in the log."""
    if record.kind != "onnx" or entry.runtime not in CPU_SERVED:
        logger.info("no model-server files for %s: its %s file on %s has no CPU model server configured here",
                    record.name, record.kind, entry.runtime)
        return None
    settings = served_settings(entry, report.gate.limits.p99_budget_ms)
    extra = [work / folder / f for f in files if (work / folder / f) != work / folder / source.name]
    try:
        written = write_server_files(work / SERVING_FOLDER, source, entry.runtime, settings, model_name(record.name),
                                     extra_files=extra)
    except ServedFileError as exc:
        raise ArtifactError(f"{record.name}: the model servers' files could not be written: {exc}") from exc
    return {"folder": SERVING_FOLDER, **written}


def _lineage(manifest: Manifest, name: str) -> list[dict]:
    seen, order, queue = set(), [], [name]
    while queue:
        current = queue.pop(0)
        if current in seen or current not in manifest.artifacts:
            continue
        seen.add(current)
        r = manifest.artifacts[current]
        order.append({"artifact": r.name, "kind": r.kind, "stage": r.stage, "sha256": r.sha256,
                      "made_from": list(r.made_from)})
        queue += r.made_from
    return order


def _input_of(source: Path, record: ArtifactRecord, manifest: Manifest) -> tuple[dict, list[str]]:
    """The input description and class names: as the ONNX file states them, else from the run's records
    (a torch model keeps its preprocessing in its description; a file written before files carried it)."""
    props = read_deployment(source) if record.kind == "onnx" else {}
    if PREPROCESSING_KEY in props and CLASSES_KEY in props:
        return props[PREPROCESSING_KEY], props[CLASSES_KEY]
    preprocessing = record.meta.get("preprocessing")
    if preprocessing is None and (source / DESCRIPTION_FILE).is_file():  # a torch file of any runtime
        preprocessing = read_description(source).get("preprocessing")
    if preprocessing is None:
        raise ArtifactError(f"{record.name} records no input preprocessing; re-run the stage that made it")
    return input_description(preprocessing), list(manifest.data.get("class_names") or [])


def _assemble(work: Path, run_dir: Path, manifest: Manifest, record: ArtifactRecord, report: Report,
              report_path: Path, entry: Entry, anyway: bool, choice: EngineChoice) -> dict:
    home = RUNNERS.get(RUNNER_OF_KIND.get(record.kind, ""))
    if home is None:
        raise ArtifactError(f"{record.name} is a {record.kind!r}, which no runtime loads; a release holds a file "
                            f"of one of these kinds: {', '.join(RUNNER_OF_KIND)}")
    folder = home.bundle_folder
    files = _copy_artifact(manifest, run_dir, record, work / folder)
    source = manifest.resolve_path(run_dir, record)
    if record.kind == "onnx" and source.is_dir():  # the graph file, beside its external data files if any
        main = record.meta.get("file", "model.onnx")
        source, serving = source / main, work / folder / main
    else:  # a torch model is its folder (weights and description); an engine its one file
        serving = work / folder / home.serving_file if home.serving_file else work / folder
    input_spec, classes = _input_of(source, record, manifest)
    released = {"artifact": record.name, "kind": record.kind, "file": serving.relative_to(work).as_posix(),
                "files": [f"{folder}/{f}" for f in files], "runtime": entry.runtime, "candidate": entry.name,
                "precision": entry.precision, "sha256": record.sha256, "size_bytes": record.size_bytes,
                "run_dir": str(run_dir)}
    servers = _server_files(work, source, record, entry, report, files, folder)
    engines = []
    for engine in choice.shipped:
        runtime = RUNNERS[RUNNER_OF_KIND[engine.kind]]  # where the bundle keeps its runtime's files
        copied = _copy_artifact(manifest, run_dir, engine, work / runtime.bundle_folder / engine.name)
        engines.append({"artifact": engine.name, "file": f"{runtime.bundle_folder}/{engine.name}/{runtime.serving_file}",
                        "files": [f"{runtime.bundle_folder}/{engine.name}/{c}" for c in copied], "sha256": engine.sha256,
                        **{k: engine.meta.get(k) for k in ("precision", "gpu_name", "compute_capability",
                                                           "tensorrt_version", "profile")}})
    withheld = [{"artifact": engine.name, "precision": engine.meta.get("precision"), "reason": reason}
                for engine, reason in choice.withheld]
    shutil.copytree(report_path.parent, work / "report")
    resolved = _decisive_config(manifest, run_dir, report_path)
    shutil.copy2(resolved, work / PIPELINE_FILE)
    stages = [{"name": r.name, "kind": r.kind, "cache_key": r.cache_key, "status": r.status}
              for r in manifest.stages.values()]
    pipeline = {"file": PIPELINE_FILE, "sha256": file_sha256(resolved), "stages": stages,
                "data_split_digest": manifest.data.get("split_hash")}
    gate_passed = report.gate.passed and report.gate.release == entry.name
    card = build_card(report=report, entry=entry, released=released, input_spec=input_spec, classes=classes,
                      tensorrt=engines, tensorrt_withheld=withheld, pipeline=pipeline,
                      lineage=_lineage(manifest, record.name), anyway=anyway and not gate_passed, created=now(),
                      version=__version__, servers=servers)
    (work / CARD_JSON).write_text(json.dumps(card, indent=2))
    (work / CARD_MD).write_text(render_markdown(card, environment_line(report.environment.written())))
    if card["released_anyway"]:
        (work / GATE_FAILED_FILE).write_text(
            f"{record.name} was bundled with --anyway: the release gate of {report_path} did not release it.\n"
            + "".join(f"- {reason}\n" for reason in report.gate.reasons))
    for engine, reason in choice.withheld:
        logger.info("TensorRT engine %s not shipped: %s", engine.name, reason)
    logger.info("bundled %s from %s", record.name, run_dir)
    return card
