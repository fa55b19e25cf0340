"""SIGTERM and Ctrl-C during a stage: the last checkpoint stays, the lock is released, the exit code is
143 / 130 with one line saying what was kept and how to resume; the resumed run completes."""
from __future__ import annotations

import signal

import pytest

from compress.pipeline.manifest import Manifest
from compress.pipeline.run_lock import RunLock
from tests.conftest import run_cli, start_run, wait_for_file


@pytest.mark.parametrize("sig,code,words", [(signal.SIGTERM, 143, "terminated (SIGTERM)"),
                                            (signal.SIGINT, 130, "interrupted (Ctrl-C)")])
def test_a_signal_during_training_keeps_the_checkpoint_and_says_how_to_resume(tmp_path, tiny_config,
                                                                              write_pipeline, sig, code, words):
    tiny_config["model"] = {"name": "tests.user_models:SlowNet", "args": {"delay_s": 0.04}}
    tiny_config["stages"][0].update(epochs=2, checkpoint_every=4)
    path, run_dir = write_pipeline(tiny_config), tmp_path / "run"
    proc = start_run(path, run_dir)
    checkpoint = run_dir / "train" / "checkpoints" / "last.pt"
    wait_for_file(checkpoint, proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    line = " ".join(err.split())
    assert f"{words}: no stage had completed; stage 'train' stopped, its last checkpoint kept ({checkpoint})" in line
    assert f"lock released; resume with: compress run {path} --run-dir {run_dir}" in line
    assert "Traceback" not in err and checkpoint.exists()
    record = Manifest.load(run_dir).stages["train"]
    assert record.status == "failed" and record.error.startswith("Terminated" if code == 143 else "KeyboardInterrupt")
    with RunLock(run_dir):  # free at once: not left to the next run to find stale
        pass
    resumed = run_cli("run", str(path), "--run-dir", str(run_dir))
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from checkpoint at step" in resumed.stderr
    assert "previous attempt did not complete (failed)" in resumed.stderr
    assert Manifest.load(run_dir).stages["train"].metrics["steps"] == 2 * 20
