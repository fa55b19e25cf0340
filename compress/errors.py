"""One error hierarchy; the exit code is a property of the error, not of where it is caught.

Every message names the stage, field or file concerned and what to do about it, because
the CLI prints it as the whole story (no traceback unless --debug).
"""
from __future__ import annotations

import errno


class CompressError(Exception):
    exit_code = 3


class ConfigError(CompressError):
    """The pipeline file, an override or a command-line argument is invalid."""

    exit_code = 2


class DataInputError(CompressError):
    """A data set or a user-provided file could not be used."""

    exit_code = 2


class ArtifactError(CompressError):
    """An artifact is missing, changed since it was recorded, or unreadable."""

    exit_code = 2


class RunLockedError(CompressError):
    """Another run holds the run directory."""

    exit_code = 2


class StageError(CompressError):
    """A stage failed while running (divergence, backend error)."""

    exit_code = 3


class ModelCollapsed(StageError):
    """A stage's model fell so far below its input (red_line.collapse_margin) that handing it on would waste every
    later stage on a broken model."""


class StageInputError(CompressError):
    """A stage found, while running, that its model, data or settings cannot be used as given."""

    exit_code = 2


class RunInterrupted(CompressError):
    """Ctrl-C (exit 130) or SIGTERM (exit 143) stopped a run; the message says what was kept."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def from_library(exc: Exception, stage: str, kind: str) -> CompressError:
    """The one place a library error becomes an exit code: each library package marks its errors
    ``bad_input`` (the caller gave something unusable: exit 2) or not (the run failed: exit 3)."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StageError(f"stage {stage!r} ({kind}): the disk is full (writing {exc.filename or 'a file'}); "
                          "nothing half-written was kept or registered, its last checkpoint and the files from "
                          "before are intact; free space and run the same command again")
    if getattr(exc, "bad_input", False):
        return StageInputError(f"stage {stage!r} ({kind}): {exc}")
    return StageError(f"stage {stage!r} ({kind}) failed: {type(exc).__name__}: {exc} "
                      "(run with --debug for the traceback)")


class DataMismatchError(CompressError):
    """An input model or file was made on other data than the stage would judge it on."""

    exit_code = 2
