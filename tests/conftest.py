from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

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
