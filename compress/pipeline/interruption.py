"""Ctrl-C and SIGTERM end a run in one line: what was kept, and the command that resumes it."""
from __future__ import annotations

import signal

from compress.errors import RunInterrupted
from train.checkpoint import CHECKPOINT_FILE


def kept_line(runner) -> str:
    """Completed stages, the stage that stopped and its last checkpoint (if it wrote one)."""
    manifest = runner.manifest
    done = [n for n, r in (manifest.stages.items() if manifest else []) if r.status == "completed"]
    parts = [f"completed stages kept ({', '.join(done)})" if done else "no stage had completed"]
    stage = runner.current_stage
    if stage:
        checkpoints = sorted((runner.run_dir / stage).glob(f"*/{CHECKPOINT_FILE}"))
        where = ", ".join(str(c) for c in checkpoints)
        parts.append(f"stage {stage!r} stopped, its last checkpoint kept ({where}) and resumed from there"
                     if checkpoints else f"stage {stage!r} stopped before its first checkpoint and starts over")
    parts.append("lock released")
    return "; ".join(parts)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is, so every stage unwinds as on Ctrl-C: files are closed,
    the failed attempt recorded, the lock released."""

    exit_code = 143


_signals_received: list[int] = []


def _on_sigterm(signum, frame) -> None:
    _signals_received.append(signum)  # the exception may reach us as a plain KeyboardInterrupt (under Ray)
    raise Terminated()


def interruptible(run, kept, how_on: str):
    """``run()`` with SIGTERM unwinding like Ctrl-C; either ends in one line: ``kept()`` and ``how_on``."""
    _signals_received.clear()
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return run()
    except KeyboardInterrupt as exc:
        code = 143 if _signals_received else getattr(exc, "exit_code", 130)  # seen under Ray's wait
        what = "terminated (SIGTERM)" if code == 143 else "interrupted (Ctrl-C)"
        raise RunInterrupted(f"{what}: {kept()}; {how_on}", code) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
