"""Crash safety: a killed train stage resumes to the same end; one run per run directory."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from compress.cli import main
from compress.errors import RunLockedError
from compress.pipeline.manifest import Manifest
from compress.pipeline.run_lock import RunLock
from tests.conftest import ROOT, run_cli


def _slow_config(tiny_config: dict) -> dict:
    tiny_config["model"] = {"name": "tests.user_models:SlowNet", "args": {"delay_s": 0.04}}
    tiny_config["stages"][0].update(epochs=2, checkpoint_every=4)
    return tiny_config


def test_killed_train_stage_resumes_and_finishes_with_the_same_steps(tmp_path, tiny_config, write_pipeline):
    path = write_pipeline(_slow_config(tiny_config))
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "compress", "run", str(path), "--run-dir", str(run_dir)],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    checkpoint = run_dir / "train" / "checkpoints" / "last.pt"
    deadline = time.monotonic() + 120
    while not checkpoint.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert checkpoint.exists(), "the run never wrote a checkpoint"
    killed = Manifest.load(run_dir)
    assert killed.stages["train"].status == "running" and "train.model" not in killed.artifacts

    resumed = run_cli("run", str(path), "--run-dir", str(run_dir))
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from checkpoint at step" in resumed.stderr
    metrics = Manifest.load(run_dir).stages["train"].metrics
    assert metrics["steps"] == 2 * 20 and metrics["resumed_from_step"] >= 4
    assert not checkpoint.exists()  # removed once the stage completed

    # The resumed run ends where an uninterrupted one does.
    straight = tmp_path / "straight"
    assert run_cli("run", str(path), "--run-dir", str(straight)).returncode == 0
    a = load_file(str(run_dir / "train" / "model" / "model.safetensors"))
    b = load_file(str(straight / "train" / "model" / "model.safetensors"))
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5)


def test_a_checkpoint_from_other_settings_is_not_resumed(tmp_path, tiny_config, write_pipeline, capsys):
    path = write_pipeline(tiny_config)
    run_dir = tmp_path / "run"
    stale = run_dir / "train" / "checkpoints"
    stale.mkdir(parents=True)
    torch.save({"run_key": "other settings"}, stale / "last.pt")
    assert main(["run", str(path), "--run-dir", str(run_dir)]) == 0
    assert "ignoring a checkpoint written with other settings" in capsys.readouterr().err


def test_second_run_on_a_locked_run_dir_is_refused(tmp_path, tiny_config, write_pipeline, capsys):
    path = write_pipeline(tiny_config)
    run_dir = tmp_path / "run"
    with RunLock(run_dir):
        with pytest.raises(RunLockedError, match=r"in use by another compress run \(pid \d+\).*--run-dir"):
            RunLock(run_dir).__enter__()
        assert main(["run", str(path), "--run-dir", str(run_dir)]) == 2
        assert "in use by another compress run" in capsys.readouterr().err
        assert not (run_dir / "manifest.json").exists()
    # Released: the next run proceeds.
    assert main(["run", str(path), "--run-dir", str(run_dir)]) == 0


def test_a_killed_holder_releases_the_lock(tmp_path):
    run_dir = tmp_path / "run"
    code = f"from compress.pipeline.run_lock import RunLock; import time\nwith RunLock({str(run_dir)!r}):\n print('held', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.readline().strip() == "held"
    with pytest.raises(RunLockedError):
        RunLock(run_dir).__enter__()
    proc.kill()
    proc.wait()
    with RunLock(run_dir):
        pass
