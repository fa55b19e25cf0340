"""The export package's errors; ``bad_input`` as in ``train.errors`` (exit 2 when true, else 3)."""
from __future__ import annotations


class ExportLibraryError(Exception):
    bad_input = False
