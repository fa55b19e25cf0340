"""Lines a native library writes straight to the process's stderr, kept out of the console.

torch's profiler (Kineto) prints ``USDT: … profiler_start`` / ``profiler_stop`` (and, on a machine
without a GPU, a ``gpuGetDeviceCount failed`` line) on every profile, and no log level silences the
USDT ones: they are written by C++ to file descriptor 2, below Python's ``sys.stderr``. In a bench they
land between the stage's lines in the user's console. Here fd 2 is pointed at a temporary file for the
duration of the call, then restored. The lines known to be that noise are logged at DEBUG; every other
line (a real error or warning) is written back to stderr as it was, so nothing a user needs is lost.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
from collections.abc import Iterator

logger = logging.getLogger(__name__)

NOISE = re.compile(r"^(USDT|STAGE):.*\] |^ERROR:.*DeviceProperties\.cpp:\d+\] gpuGetDeviceCount failed")


@contextlib.contextmanager
def native_stderr_to_log(source: str, log: logging.Logger = logger, noise: re.Pattern = NOISE) -> Iterator[None]:
    """Capture what native code writes to fd 2 inside the block: lines matching ``noise`` go to ``log`` at DEBUG
    (prefixed ``source``), the rest back to stderr after the block, in their order."""
    fd = 2  # native code writes to descriptor 2 whatever Python's sys.stderr has been replaced with
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    with tempfile.TemporaryFile(mode="w+b") as sink:
        saved = os.dup(fd)
        try:
            os.dup2(sink.fileno(), fd)
            try:
                yield
            finally:
                with contextlib.suppress(Exception):
                    sys.stderr.flush()
                os.dup2(saved, fd)
        finally:
            os.close(saved)
            _sort(sink, fd, source, log, noise)


def _sort(sink, fd: int, source: str, log: logging.Logger, noise: re.Pattern) -> None:
    """The captured lines: the known noise to the log, the rest back to ``fd`` in their order."""
    sink.seek(0)
    kept = []
    for line in sink.read().decode("utf-8", "replace").splitlines(keepends=True):
        if noise.search(line):
            log.debug("%s: %s", source, line.rstrip())
        elif line.strip():
            kept.append(line)
    if kept:
        os.write(fd, "".join(kept).encode("utf-8", "replace"))
