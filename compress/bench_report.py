"""Saved reports for `compress gate` and `compress report`: find, re-render, print."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from rich.console import Console
from rich.table import Table

from compress.errors import ArtifactError
from serve_bench.report import REPORT_JSON, load_samples, write_report
from train.atomic_io import atomic_dir


def load_report(target: Path) -> tuple[dict, Path]:
    path = target / "report" / REPORT_JSON if target.is_dir() else target
    if not path.is_file():
        raise ArtifactError(f"{path} does not exist: give a run directory with a bench stage, or a report.json")
    try:
        report = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{path} is not valid JSON ({exc}); re-run the bench stage") from exc
    if not {"artifacts", "gate", "baseline"} <= set(report):
        raise ArtifactError(f"{path} is not a compress report (needs artifacts, gate and baseline)")
    return report, path


def rerender(run_dir: Path) -> Path:
    report, path = load_report(run_dir)
    folder = path.parent
    latencies = load_samples(folder)
    with atomic_dir(folder) as fresh:
        if (folder / "latencies.npz").is_file():
            shutil.copy2(folder / "latencies.npz", fresh / "latencies.npz")
        write_report(fresh, report, latencies or None)
    return folder


def print_gate(result: dict, source: Path, console: Console) -> None:
    table = Table(title=f"release gate for {source}")
    table.add_column("verdict")
    table.add_column("release")
    table.add_column("p99 budget ms", justify="right")
    table.add_column("max drop", justify="right")
    table.add_row("[green]PASSED[/]" if result["passed"] else "[red]FAILED[/]", str(result["release"]),
                  str(result["p99_budget_ms"]), str(result["max_accuracy_drop"]))
    console.print(table)
    for reason in result["reasons"]:
        console.print(f"- {reason}", highlight=False)
