"""Saved reports for `compress gate` and `compress report`: find, re-render, print."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from rich.console import Console
from rich.table import Table

from compress.errors import ArtifactError
from compress.pipeline.manifest import Manifest
from serve_bench import report_model
from serve_bench.accuracy.predictions import PREDICTIONS_FILE
from serve_bench.report.files import REPORT_JSON, SAMPLES_FILE, write_report
from train.atomic_io import atomic_dir
from train.hardware import isa_differences, isa_facts, isa_words


def find_report(target: Path) -> Path:
    """report.json of a run directory (its last completed bench stage's), of a report folder, or the file itself.

    Each bench stage writes inside its own folder (``<run>/<stage>/report/``), so two bench
    stages of one pipeline never overwrite each other; the manifest says which is the latest.
    """
    if not target.is_dir():
        return target
    if (target / REPORT_JSON).is_file():
        return target / REPORT_JSON
    manifest = Manifest.load(target)
    if manifest is not None:
        reports = [manifest.resolve_path(target, manifest.artifacts[name]) / REPORT_JSON
                   for record in manifest.stages.values() if record.kind == "bench" and record.status == "completed"
                   for name in record.outputs
                   if name in manifest.artifacts and manifest.artifacts[name].kind == "report"]  # not its export
        if reports:
            return reports[-1]
    return target / "report" / REPORT_JSON  # a run directory written before reports moved into their stage


def load_report(target: Path) -> tuple[report_model.Report, Path]:
    """The report of ``target`` read as the typed model (an older version in today's names), and where it was."""
    path = find_report(target)
    if not path.is_file():
        raise ArtifactError(f"{path} does not exist: give a run directory with a completed bench stage, its report "
                            "folder, or a report.json")
    try:
        report = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{path} is not valid JSON ({exc}); re-run the bench stage") from exc
    if not isinstance(report, dict) or not {"artifacts", "gate", "baseline"} <= set(report):
        raise ArtifactError(f"{path} is not a compress report (needs artifacts, gate and baseline)")
    try:  # an older version is read in today's names; a newer one, or one that does not fit, is refused
        return report_model.read(report, str(path)), path
    except report_model.ReportVersionError as exc:
        raise ArtifactError(str(exc)) from exc


def foreign_isa_note(report: report_model.Report, source: Path) -> str | None:
    """A warning when a saved report's latency figures come from another instruction set than this
    machine's: INT8 and bf16 speed depend on VNNI and AVX-512 BF16, so they do not carry over."""
    recorded = report.environment.isa
    here = isa_facts()
    if not recorded:
        return (f"note: {source} does not record the instruction set it was measured on (written by an older "
                f"version); this machine is {isa_words(here)}: re-run the bench stage here before trusting its "
                "latency figures on this machine")
    differences = isa_differences(recorded, here)
    if not differences:
        return None
    return (f"note: {source} was measured on another instruction set ({isa_words(recorded)}) than this machine's "
            f"({isa_words(here)}): {'; '.join(differences)}. Its latency figures, and whether INT8 is faster, "
            "describe that machine; re-run the bench stage here to gate on this one")


def rerender(report: report_model.Report, path: Path) -> Path:
    """Re-write the report files beside ``path`` (a loaded report.json) from ``report``."""
    folder = path.parent
    with atomic_dir(folder) as fresh:
        for kept in (SAMPLES_FILE, PREDICTIONS_FILE):  # the measurements themselves are never rewritten
            if (folder / kept).is_file():
                shutil.copy2(folder / kept, fresh / kept)
        write_report(fresh, report)
    return folder


def print_gate(gate: report_model.Gate, source: Path, console: Console) -> None:
    table = Table(title=f"release gate for {source}")
    table.add_column("verdict")
    table.add_column("release")
    table.add_column("p99 budget ms", justify="right")
    table.add_column("max drop", justify="right")
    table.add_column("decision")
    table.add_row("[green]PASSED[/]" if gate.passed else "[red]FAILED[/]", str(gate.release),
                  str(gate.limits.p99_budget_ms), str(gate.limits.max_drop), gate.limits.decision)
    console.print(table)
    for note in gate.notes:
        console.print(f"note: {note}", style="yellow", highlight=False)
    for reason in gate.reasons:
        console.print(f"- {reason}", highlight=False)
