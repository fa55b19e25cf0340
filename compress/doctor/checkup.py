"""Runs the doctor's sections in order, prints each as it is ready, writes the JSON, decides the exit code.

Exit 0: every installed runtime passed its smoke run (an absent optional runtime is fine: the row says
how to install it); 3: an installed runtime failed, as a stage failing while running would. ``--gpu``:
0 with no GPU (nothing to check) or when every GPU step passed, else 3.
"""
from __future__ import annotations

import json
import logging
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console
from rich.text import Text

from compress.doctor import view
from compress.doctor.defaults import bench_threads, default_choices
from compress.doctor.machine import machine_facts
from compress.doctor.runtimes import BROKEN, OK, RuntimeRow, runtime_names, runtime_rows
from compress.doctor.smoke import FAIL, SmokeResult, run_smoke

logger = logging.getLogger(__name__)

FORMAT = "compress-doctor/1"
FAILED_EXIT = 3  # the CLI's "failed while running"


@dataclass(frozen=True)
class DoctorSettings:
    json_path: Path | None = None  # also write the facts here (atomically)
    gpu: bool = False  # the GPU check instead of the machine check
    smoke_iters: int = 50  # timed runs per runtime
    threads: int | None = None  # smoke-run threads; default: the bench's (physical cores)


def smoke_plan(rows: dict[str, RuntimeRow]) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """(runtimes to run, runtime → why skipped, runtime → why it fails without running: installed but broken)."""
    run, skipped, broken = [], {}, {}
    for name in runtime_names():
        row = rows[name]
        if row.status == OK:
            run.append(name)
        elif row.status == BROKEN:
            broken[name] = f"installed but does not import: {row.detail}"
        else:
            skipped[name] = row.detail or row.status
    return run, skipped, broken


def exit_code(smoke: dict) -> int:
    return FAILED_EXIT if any(r["status"] == FAIL for r in smoke["results"]) else 0


def write_json(path: Path, report: dict) -> None:
    from train.atomic_io import atomic_write_text

    atomic_write_text(path, json.dumps(report, indent=2, default=str) + "\n")


def _header() -> dict:
    from compress import __version__

    return {"format": FORMAT, "compress": __version__, "created": datetime.now(timezone.utc).isoformat()}


def check_machine(settings: DoctorSettings, console: Console) -> int:
    start = time.perf_counter()
    machine = machine_facts()
    console.print(view.machine_table(machine))
    rows = {row.name: row for row in runtime_rows()}
    console.print(view.runtimes_table([row.as_dict() for row in rows.values()]))
    gpu_visible = bool(machine["gpu"])
    choices = [c.as_dict() for c in default_choices(machine, rows, gpu_visible)]
    console.print(view.defaults_table(choices))
    run, skipped, broken = smoke_plan(rows)
    threads = settings.threads or bench_threads(machine)
    console.print(Text(f"smoke run: a tiny model exported to ONNX, up to {settings.smoke_iters} runs on each of "
                       f"{', '.join(run)}…"), soft_wrap=True)
    with tempfile.TemporaryDirectory(prefix="compress-doctor-") as folder:
        smoke = run_smoke(run, skipped, Path(folder), threads, settings.smoke_iters)
    smoke["results"] += [SmokeResult(name, FAIL, detail=why).as_dict() for name, why in broken.items()]
    view.print_smoke(smoke, console)
    report = {**_header(), "machine": machine, "runtimes": [row.as_dict() for row in rows.values()],
              "defaults": choices, "smoke": smoke, "exit_code": exit_code(smoke),
              "wall_s": round(time.perf_counter() - start, 2)}
    view.print_verdict(report, console)
    if settings.json_path:
        write_json(settings.json_path, report)
        console.print(Text(f"wrote {settings.json_path}"), soft_wrap=True)
    return report["exit_code"]


def check_gpu(settings: DoctorSettings, console: Console) -> int:
    from compress.doctor.gpu_check import run_gpu_check

    gpu = run_gpu_check(lambda line: console.print(Text(line, style="bold"), soft_wrap=True))
    view.print_gpu(gpu, console)
    code = 0 if gpu["passed"] else FAILED_EXIT
    if settings.json_path:
        write_json(settings.json_path, {**_header(), "gpu_check": gpu, "exit_code": code})
        console.print(Text(f"wrote {settings.json_path}"), soft_wrap=True)
    return code


def run_doctor(settings: DoctorSettings, console: Console) -> int:
    return check_gpu(settings, console) if settings.gpu else check_machine(settings, console)
