"""A write that fails half-way never leaves a partial file under the final name."""
from __future__ import annotations

import os

import pytest

from train.atomic_io import atomic_dir, atomic_path, atomic_write_text


def test_atomic_write_replaces_content(tmp_path):
    target = tmp_path / "a" / "manifest.json"
    atomic_write_text(target, "one")
    atomic_write_text(target, "two")
    assert target.read_text() == "two"
    assert os.listdir(target.parent) == ["manifest.json"]


def test_failure_mid_write_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    target = tmp_path / "model.onnx"
    target.write_text("complete old model")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half of a new mo")
            raise RuntimeError("killed")
    assert target.read_text() == "complete old model"
    assert os.listdir(tmp_path) == ["model.onnx"]


def test_atomic_dir_swaps_a_whole_folder_or_nothing(tmp_path):
    final = tmp_path / "model"
    with atomic_dir(final) as folder:
        (folder / "model.json").write_text("{}")
        (folder / "model.safetensors").write_bytes(b"v1")
    with pytest.raises(RuntimeError):
        with atomic_dir(final) as folder:
            (folder / "model.json").write_text("{\"new\": 1}")
            raise RuntimeError("crash before the weights were written")
    assert (final / "model.safetensors").read_bytes() == b"v1" and (final / "model.json").read_text() == "{}"
    with atomic_dir(final) as folder:
        (folder / "model.safetensors").write_bytes(b"v2")
    assert sorted(os.listdir(final)) == ["model.safetensors"]
    assert sorted(os.listdir(tmp_path)) == ["model"]
