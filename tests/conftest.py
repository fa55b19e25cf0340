from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml


def pytest_configure(config):
    """Under pytest-xdist every worker is one of several processes on the machine's cores: each computes on one
    thread (torch, and through OMP_NUM_THREADS the subprocesses it starts), so two workers on two cores share them
    instead of four spinning OpenMP threads fighting over two. Set before any test imports torch's kernels."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # xdist hands its workers COLUMNS=80: the console would then wrap table cells that a serial run (no
        # terminal, no COLUMNS: a log's width) prints on one line, and tests reading those lines would differ
        for name in ("COLUMNS", "LINES"):
            os.environ.pop(name, None)
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_collection_modifyitems(config, items):
    """A ``serial`` test times real work and asserts on it: beside another test process (an xdist worker) its
    quiet measurement is not quiet, so there it is skipped with the command that runs it alone."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    alone = pytest.mark.skip(reason="times real work beside no other test process: run `pytest -m serial -n 0`")
    for item in items:
        if item.get_closest_marker("serial") is not None:
            item.add_marker(alone)


@pytest.fixture(autouse=True)
def onnx_files_on_onnxruntime_alone(request, monkeypatch):
    """Stages run in the test process measure ONNX files on onnxruntime alone unless the test is marked
    ``openvino``: every bench would otherwise time each file twice where OpenVINO is installed, and the suite's
    time is CI's. The default itself (every usable runtime) is what the marked tests and the quickstart run."""
    if request.node.get_closest_marker("openvino") is None:
        from compress.stages import runtime_choice

        monkeypatch.setattr(runtime_choice, "usable_onnx_runtimes", lambda device="cpu": ["onnxruntime"])


ROOT = Path(__file__).resolve().parents[1]
# every page a reader meets: the docs site, the README and the changelog (the docs tests read these)
DOC_PAGES = sorted((ROOT / "docs" / "pages").rglob("*.md")) + [ROOT / "README.md", ROOT / "CHANGELOG.md"]

# A pipeline small enough to train in a couple of seconds on the CPU: the 1,797 real 8×8
# digits and a ResNet-20 slimmed to width 4.
TINY = {
    "name": "tiny",
    "seed": 0,
    "data": {"name": "digits"},
    "model": {"name": "resnet20", "args": {"width": 4}},
    "stages": [
        {"name": "train", "kind": "train", "epochs": 1, "batch_size": 64, "lr": 0.01, "amp": "off",
         "checkpoint_every": 0},
    ],
}


# The trained digits model the quantize tests start from (ResNet-20 at width 8, 20 epochs: ~93% test top-1).
TRAINED_DIGITS = {"name": "train", "kind": "train", "epochs": 20, "batch_size": 64, "lr": 3e-3, "schedule": "wsd",
                  "amp": "off", "checkpoint_every": 0}


def trained_digits_config() -> dict:
    """TINY at width 8 with TRAINED_DIGITS as its train stage: a pipeline made of it and later stages reuses the
    shared trained run's train stage (the same settings, seed, data and model: the cache key holds)."""
    config = copy.deepcopy(TINY)
    config["model"] = {"name": "resnet20", "args": {"width": 8}}
    config["stages"] = [dict(TRAINED_DIGITS)]
    return config


@pytest.fixture(scope="session")
def trained_digits_run(tmp_path_factory) -> Path:
    """One run folder whose train stage is TRAINED_DIGITS, trained once for the whole session: once in all, where
    test processes (pytest-xdist workers) share one base folder, the first to arrive training it under a lock."""
    import fcntl

    from compress.cli import main

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    run_dir = shared / "trained-digits"
    with open(shared / "trained-digits.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (run_dir / "manifest.json").is_file():
            pipeline = shared / "trained-digits.yaml"
            pipeline.write_text(yaml.safe_dump(trained_digits_config(), sort_keys=False))
            assert main(["run", str(pipeline), "--run-dir", str(run_dir)]) == 0
    return run_dir


def start_from(trained: Path, run_dir: Path) -> Path:
    """A copy of the shared trained run as ``run_dir``: a pipeline beginning with its train stage skips it."""
    import shutil

    shutil.copytree(trained, run_dir, ignore=shutil.ignore_patterns("pipeline.resolved.yaml", "configs"))
    return run_dir


@pytest.fixture
def tiny_config() -> dict:
    return copy.deepcopy(TINY)


@pytest.fixture
def write_pipeline(tmp_path):
    def write(config: dict, name: str = "pipeline.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    return write


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run([sys.executable, "-m", "compress", *args], cwd=cwd or ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def start_run(pipeline: Path, run_dir: Path) -> subprocess.Popen:
    """``compress run`` in the background (stderr captured), for tests that stop it part-way."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    # A shell starting pytest in the background leaves SIGINT ignored, and the child would inherit
    # that (Python then installs no Ctrl-C handler): give it the default a terminal user has.
    return subprocess.Popen([sys.executable, "-m", "compress", "run", str(pipeline), "--run-dir", str(run_dir)],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


POLL_S = 0.02


def wait_for_file(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until ``path`` exists (a first checkpoint, say), the run ends, or ``timeout`` passes."""
    # a bounded number of waits on the process itself: nothing here measures time, it only waits
    for _ in range(int(timeout / POLL_S)):
        if path.exists():
            return
        try:
            proc.wait(timeout=POLL_S)
            return  # the run ended
        except subprocess.TimeoutExpired:
            continue
