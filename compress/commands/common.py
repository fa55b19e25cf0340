"""What every command shares: the console, an interruptible run, and the exit code a failed gate gives."""
from __future__ import annotations

import sys
from pathlib import Path


def console(stderr: bool = True):
    from compress.pipeline.console_log import cli_console

    return cli_console(stderr)


def run_interruptible(runner, resume: str):
    """Run; on Ctrl-C or SIGTERM say in one line what was kept and how to resume, and exit 130 / 143."""
    from compress.pipeline.interruption import interruptible, kept_line

    return interruptible(runner.run, lambda: kept_line(runner), f"resume with: {resume}")


def gate_exit_code(manifest, selected: list[str], run_dir: Path) -> int:
    """1 when a bench stage of this invocation said no, so CI sees a failed gate however the stage was run."""
    for name in selected:
        if (record := manifest.stages.get(name)) and record.kind == "bench" and record.metrics.get("gate_passed") is False:
            reasons = "; ".join(record.metrics.get("gate_reasons", []))
            print(f"release gate FAILED ({name}): {reasons}; report in {run_dir / name / 'report'}", file=sys.stderr)
            return 1
    return 0
