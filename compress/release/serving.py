"""What ``compress serve`` serves: the released file of a run or a bundle, with the settings it was measured in.

From a bundle: only where every checksum holds (a changed file is not what the card describes), the file the
card names, on the runtime it was released on, with the serving settings the bundle's server files were
written from. From a run: the file the gate released (or ``--artifact``), checked against the manifest, with
the serving settings its bench measured (serve_bench.servers.deployment.served_settings).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from compress.errors import ArtifactError, ConfigError
from compress.pipeline.bench_report import load_report
from compress.pipeline.manifest import Manifest
from compress.release.bundle import CARD_JSON, ReleaseRefused
from compress.release.checksums import check_sums
from serve_bench.servers.deployment import CPU_SERVED, ServedSettings, model_name, served_settings


@dataclass(frozen=True)
class ServedTarget:
    file: Path
    runtime: str
    settings: ServedSettings
    model: str
    source: str  # what it came from, for the console
    runner_options: dict = field(default_factory=dict)


def served_target(target: Path, artifact: str | None = None) -> ServedTarget:
    target = Path(target)
    if (target / CARD_JSON).is_file():
        if artifact is not None:
            raise ConfigError(f"--artifact {artifact}: a bundle holds one released file; give a run directory to "
                              "serve another")
        return _from_bundle(target)
    if (target / "manifest.json").is_file():
        return _from_run(target, artifact)
    raise ConfigError(f"{target}: neither a release bundle (no {CARD_JSON}) nor a run directory (no manifest.json); "
                      "give the folder compress release wrote or a finished run")


def _from_bundle(folder: Path) -> ServedTarget:
    import json

    from compress.release.verify import runner_options

    count, problems = check_sums(folder)
    if problems:
        raise ArtifactError(f"{folder}: the bundle does not match its SHA256SUMS, so it is not what its card "
                            f"describes: {'; '.join(problems[:3])}. Release it again, or serve the run directory")
    card = json.loads((folder / CARD_JSON).read_text())
    released, servers = card["released"], card.get("servers")
    runtime = released.get("runtime")
    _servable(released["artifact"], released["kind"], runtime, f"{folder}/{CARD_JSON}")
    settings = (ServedSettings(**servers["settings"]) if servers else
                ServedSettings(measured="one copy, unbatched: the bundle records no served settings"))
    options = runner_options(card)
    options.pop("threads", None)
    return ServedTarget(folder / released["file"], runtime, settings,
                        servers["model"] if servers else model_name(released["artifact"]),
                        f"bundle {folder} ({count} files match SHA256SUMS)", options)


def _from_run(run_dir: Path, artifact: str | None) -> ServedTarget:
    manifest = Manifest.load(run_dir)
    report, report_path = load_report(run_dir)
    names = [a.name for a in report.artifacts]
    if artifact is not None and artifact not in names:
        raise ConfigError(f"--artifact {artifact}: not in {report_path}; measured: {', '.join(names)}")
    name = artifact or (report.gate.release if report.gate.passed else None)
    if name is None:
        raise ReleaseRefused(f"{report_path}: the release gate FAILED ({'; '.join(report.gate.reasons)}), so nothing "
                             "was released to serve; name a file with --artifact to serve it anyway")
    entry = report.entry(name)
    file_name = entry.artifact or name
    record = manifest.artifacts.get(file_name)
    if record is None:
        raise ArtifactError(f"{report_path} names {file_name}, which {run_dir}/manifest.json does not list")
    problem = manifest.verify(run_dir, file_name)
    if problem:
        raise ArtifactError(f"{file_name}: {problem}; serve what was measured: re-run the stage that made it and "
                            "the bench stage")
    _servable(file_name, record.kind, entry.runtime, str(report_path))
    path = manifest.resolve_path(run_dir, record)
    if path.is_dir():
        path = path / record.meta.get("file", "model.onnx")
    settings = served_settings(entry, report.gate.limits.p99_budget_ms)
    from serve_bench.runners import RUNNERS

    options = RUNNERS[entry.runtime].options_from_info(entry.runner) if entry.runner else {}
    options.pop("threads", None)
    return ServedTarget(path, entry.runtime, settings, model_name(file_name), f"run {run_dir}, {name}", options)


def _servable(name: str, kind: str, runtime: str | None, where: str) -> None:
    if kind != "onnx" or runtime not in CPU_SERVED:
        raise ConfigError(f"{where}: {name} is a {kind} file on {runtime}; compress serve serves ONNX files on "
                          f"{', '.join(CPU_SERVED)} (a torch model or a TensorRT engine: serve the bundle's Triton "
                          "repository, or release an exported file)")
