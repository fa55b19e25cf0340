"""Crash-safe file and folder writes.

A kill in the middle of a write must never leave a half-written file under its final
name: readers (the cache check, a resumed run, a user) would trust it. Everything is
written next to its destination, flushed to disk, then renamed into place, which POSIX
guarantees to be atomic within one file system.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def _naming(final: Path) -> Iterator[None]:
    """An OS error without a file name (a failed fsync: the disk is full) gets the destination's, so the
    message says what could not be written."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None and exc.errno is not None:
            raise OSError(exc.errno, exc.strerror, str(final)) from exc
        raise


@contextlib.contextmanager
def atomic_path(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``final``; rename it into place only on success."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        with _naming(final):
            yield tmp
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, final)
        _fsync_dir(final.parent)
    finally:
        if tmp.exists():
            tmp.unlink()


def atomic_write_bytes(final: str | os.PathLike, data: bytes) -> None:
    with atomic_path(final) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(final: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(final, text.encode("utf-8"))


@contextlib.contextmanager
def atomic_dir(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a fresh temporary folder; swap it in for ``final`` only when the block succeeds.

    A folder cannot be renamed over a non-empty one, so an existing ``final`` is first
    moved aside and removed only after the new one is in place: at every instant the
    final name holds either the complete old or the complete new content.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        with _naming(final):
            yield tmp
            for child in tmp.rglob("*"):
                if child.is_file():
                    with open(child, "rb+") as fh:
                        os.fsync(fh.fileno())
        old = None
        if final.exists():
            old = final.with_name(f".{final.name}.old-{os.getpid()}")
            os.replace(final, old)
        os.replace(tmp, final)
        _fsync_dir(final.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
