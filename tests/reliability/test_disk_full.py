"""Disk full (ENOSPC) while writing a checkpoint, an artifact or the manifest: a clean exit 3, nothing
partial registered, the files from before intact.

The full disk is simulated at the point every write of the project goes through: the fsync
before the rename into place (train.atomic_io), failing with ENOSPC as a full file system does.
"""
from __future__ import annotations

import errno
import os

import pytest

from compress.cli import main
from compress.pipeline.manifest import Manifest

REAL_FSYNC = os.fsync


@pytest.fixture
def finished_run(tmp_path, tiny_config, write_pipeline):
    tiny_config["stages"][0]["checkpoint_every"] = 2
    path, run_dir = write_pipeline(tiny_config), tmp_path / "run"
    assert main(["run", str(path), "--run-dir", str(run_dir)]) == 0
    return path, run_dir


def _disk_full_for(monkeypatch, fragment: str) -> None:
    def fsync(fd):
        if fragment in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return REAL_FSYNC(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def _files(run_dir):
    return {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != ".lock"}


def _no_temporaries(run_dir):
    return [p for p in run_dir.rglob("*") if p.name.endswith(".tmp") or ".old-" in p.name] == []


@pytest.mark.parametrize("target", ["last.pt", "model.safetensors"])
def test_disk_full_inside_a_stage(finished_run, monkeypatch, capsys, target):
    path, run_dir = finished_run
    model_before = {p: p.read_bytes() for p in (run_dir / "train" / "model").iterdir()}
    digest = Manifest.load(run_dir).artifacts["train.model"].sha256
    _disk_full_for(monkeypatch, target)
    assert main(["run", str(path), "--run-dir", str(run_dir), "--force", "train"]) == 3
    err = " ".join(capsys.readouterr().err.split())
    assert "the disk is full" in err and "free space and run the same command again" in err
    assert "Traceback" not in err
    record = Manifest.load(run_dir).stages["train"]  # the completed record still stands; the attempt is noted
    assert record.status == "completed" and record.last_attempt["status"] == "failed"
    assert Manifest.load(run_dir).artifacts["train.model"].sha256 == digest
    assert {p: p.read_bytes() for p in (run_dir / "train" / "model").iterdir()} == model_before
    assert _no_temporaries(run_dir)
    monkeypatch.setattr(os, "fsync", REAL_FSYNC)  # space freed: the same command completes
    assert main(["run", str(path), "--run-dir", str(run_dir), "--force", "train"]) == 0


def test_disk_full_writing_the_manifest(finished_run, monkeypatch, capsys):
    path, run_dir = finished_run
    before = _files(run_dir)
    _disk_full_for(monkeypatch, "manifest.json")
    assert main(["run", str(path), "--run-dir", str(run_dir), "stages.train.lr=0.02"]) == 3
    err = " ".join(capsys.readouterr().err.split())
    assert "the disk is full" in err and "manifest.json" in err and "Traceback" not in err
    after = _files(run_dir)
    assert after[run_dir.joinpath("manifest.json").relative_to(run_dir)] == before[
        run_dir.joinpath("manifest.json").relative_to(run_dir)]
    assert _no_temporaries(run_dir)
