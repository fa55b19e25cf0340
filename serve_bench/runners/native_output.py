"""Lines a native library writes straight to the process's stderr, sent to the log instead.

torch's profiler (Kineto) prints ``USDT: … profiler_start`` / ``profiler_stop`` on every profile, and
no log level silences them: they are written by C++ to file descriptor 2, below Python's ``sys.stderr``.
In a bench they land between the stage's lines in the user's console. Here fd 2 is pointed at a
temporary file for the duration of the call, then restored, and what was written is logged at DEBUG
(the stage log keeps it; the console does not show it).
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from collections.abc import Iterator

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def native_stderr_to_log(source: str, log: logging.Logger = logger) -> Iterator[None]:
    """Capture what native code writes to fd 2 inside the block; log each line at DEBUG, prefixed ``source``."""
    fd = 2  # native code writes to descriptor 2 whatever Python's sys.stderr has been replaced with
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), fd)
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)
            sink.seek(0)
            for line in sink.read().decode("utf-8", "replace").splitlines():
                if line.strip():
                    log.debug("%s: %s", source, line)
