"""What the bench that decided a release measured: the only files a bundle may ship.

A report's figures belong to the exact bytes its bench stage read. The manifest keeps, per
stage, the digests of the inputs the stage ran on, so a file re-made after the bench (say
``compress run P --only quantize stages.quantize.calibration.samples=128``: a new INT8 file, the
old report kept) is no longer among them, although it still matches its own manifest entry.
Shipping it would put the old file's accuracy and latency on the new file's card.

The same goes for the TensorRT engines a bundle carries beside its file: an engine ships only
where the deciding bench measured it (these very bytes) and the release gate, with the report's
own limits and rule, passes it. An INT8 engine the gate refused never rides along with an fp32
file of the same model.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from compress.errors import ArtifactError
from compress.pipeline.manifest import ArtifactRecord, Manifest, StageRecord
from serve_bench.gate import evaluate
from serve_bench.report_model import Report


def report_artifacts(manifest: Manifest, report_path: Path, run_dir: Path) -> list[str]:
    """The manifest names of the report folder the gate's report lives in."""
    folder = report_path.parent.resolve()
    return [n for n, r in manifest.artifacts.items() if r.kind == "report"
            and manifest.resolve_path(run_dir, r).resolve() == folder]


def deciding_bench(manifest: Manifest, run_dir: Path, report_path: Path) -> StageRecord:
    """The completed bench stage record that wrote the report; refused where the manifest has none."""
    for name in report_artifacts(manifest, report_path, run_dir):
        record = manifest.stages.get(manifest.artifacts[name].stage)
        if record is not None and record.status == "completed":
            return record
    raise ArtifactError(f"{report_path}: no completed bench stage of {run_dir}/manifest.json wrote this report, so "
                        "what it measured cannot be checked; re-run the bench stage: compress run <pipeline> "
                        f"--run-dir {run_dir} --from <bench stage>")


def measured_digests(bench: StageRecord) -> dict[str, str]:
    """sha256 of every file the bench read, by artifact name (by input role in records that kept no names)."""
    names = (bench.key_material or {}).get("input_names") or {}
    return {names.get(role, role): digest for role, digest in bench.input_digests.items()}


def require_measured(record: ArtifactRecord, bench: StageRecord, run_dir: Path) -> None:
    """Refuse (exit 2, as for a file that no longer matches the manifest) unless ``bench`` read these bytes.

    Not a gate decision (exit 1): the gate never judged this file, and ``--anyway`` cannot help, since
    the card would carry another file's figures. The remedy is to measure it."""
    measured = measured_digests(bench)
    if record.sha256 in measured.values():
        return
    if record.stage == bench.name and record.name in bench.outputs:  # a file the bench made and measured itself
        return                                                        # (the baseline exported as it is)
    then = measured.get(record.name)
    what = (f"it measured another {record.name} (sha256 {then[:12]}…), made before the file was re-made "
            f"(now {record.sha256[:12]}…)" if then else f"it did not measure {record.name} at all")
    raise ArtifactError(f"{record.name}: the report was written by bench stage {bench.name!r}, but {what}; its "
                        "figures are not this file's. Nothing was written. Measure the file again: compress run "
                        f"<pipeline> --run-dir {run_dir} --from {bench.name}")


@dataclass(frozen=True)
class EngineChoice:
    """The TensorRT engines of the released model that ship, and the others with why not."""

    shipped: list[ArtifactRecord]
    withheld: list[tuple[ArtifactRecord, str]]


def engines_to_ship(engines: list[ArtifactRecord], report: Report, measured: dict[str, str]) -> EngineChoice:
    """Of ``engines`` (the same model's), those the deciding bench measured byte for byte and the gate passes
    under the report's own limits and decision rule."""
    limits, entries = report.gate.limits.limits(), {a.name: a for a in report.artifacts}
    meaningful = report.data.meaningful_accuracy
    shipped, withheld = [], []
    for engine in engines:
        entry = entries.get(engine.name)
        if entry is None or engine.sha256 not in measured.values():
            withheld.append((engine, "the bench the gate decided on did not measure this engine"))
            continue
        verdict = evaluate([entry], limits, accuracy_meaningful=meaningful)
        if verdict["passed"]:
            shipped.append(engine)
        else:
            why = "; ".join(r for r in verdict["reasons"] if r.startswith(f"{engine.name}: "))
            withheld.append((engine, f"the release gate refused it ({why.removeprefix(f'{engine.name}: ')})"))
    return EngineChoice(shipped, withheld)
