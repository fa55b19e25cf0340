"""One run per run directory at a time, and one pipeline per run directory.

Two runs writing the same manifest and artifacts would corrupt both. An advisory
``flock`` is used rather than a bare marker file because the kernel releases it when
the holder dies, so a killed run never leaves a stale lock behind.
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

from compress.errors import ConfigError, RunLockedError

LOCK_FILE = ".lock"


def check_owner(run_dir: Path, manifest, name: str, source: str, reuse: bool) -> None:
    """A run directory belongs to the pipeline that made it: another one would overwrite its records."""
    if manifest is None or manifest.pipeline == name or reuse:
        return
    raise ConfigError(f"{run_dir} holds a run of pipeline {manifest.pipeline!r}, and {source} "
                      f"is pipeline {name!r}: running it there would overwrite that run's records; pass another "
                      f"--run-dir (default runs/{name}), or --reuse-run-dir to run into it knowingly")


class RunLock:
    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self._fh = None

    def __enter__(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            fh.seek(0)
            holder = fh.read().strip() or "unknown"
            fh.close()
            raise RunLockedError(
                f"{self.path.parent} is in use by another compress run (pid {holder}); "
                "wait for it to finish or pass another --run-dir"
            ) from exc
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        self._fh = fh
        return self

    def __exit__(self, *exc) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None
