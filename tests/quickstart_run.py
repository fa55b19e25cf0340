"""The quickstart's first run, shared by the slow tests that read it."""
from __future__ import annotations

import os
import shutil

from tests.conftest import ROOT, run_cli


def first_quickstart_run(run_dir) -> None:
    """The quickstart's first run into ``run_dir``; or a copy of one just made from this same checkout
    (``COMPRESS_QUICKSTART_RUN``: CI runs the quickstart as the README's first command, then this test, so it
    checks that run's figures instead of repeating its three minutes of training)."""
    done = os.environ.get("COMPRESS_QUICKSTART_RUN")
    if done:
        source = ROOT / done
        assert (source / "manifest.json").is_file(), f"COMPRESS_QUICKSTART_RUN={done}: no completed run there"
        shutil.copytree(source, run_dir)
        return
    first = run_cli("run", str(ROOT / "pipelines" / "quickstart.yaml"), "--run-dir", str(run_dir), timeout=900)
    assert first.returncode == 0, first.stderr
