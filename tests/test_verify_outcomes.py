"""`compress verify`'s verdict and exit code: 0 only when every check asked for was made and held.

The runtime and the image folder are stood in for, so that each outcome is decided by known counts:
the fake runner answers class 0 for every image, so the accuracy on a folder is its share of class-0
images."""
from __future__ import annotations

import json

import numpy as np
import pytest

import compress.release.verify as verify
from compress.cli import main
from compress.release.checksums import write_sums
from compress.release.model_card import CARD_FORMAT
from export.onnx_metadata import input_description
from serve_bench.accuracy.image_folder import LabelledImages
from serve_bench.runners import RunnerError

SPEC = input_description({"channels": 1, "height": 2, "width": 2, "scale": 1 / 255, "mean": [0.5], "std": [0.5]})


def _bundle(folder, kind: str, file: str, top1: float = 98.0, test_images: int | None = 1000):
    (folder / file).parent.mkdir(parents=True)
    (folder / file).write_bytes(b"stands for the released file")
    card = {"format": CARD_FORMAT, "released": {"artifact": "x", "kind": kind, "file": file}, "input": SPEC,
            "classes": ["right", "wrong"],
            "accuracy": {"metric": "top1", "top1": top1, "test_images": test_images, "test_digest": "0" * 64,
                         "eval_batch": 64}}
    (folder / "model_card.json").write_text(json.dumps(card))
    write_sums(folder)
    return folder


class _ClassZero:
    def load(self):
        return self

    def infer(self, x):
        return np.tile(np.array([[1.0, 0.0]], dtype=np.float32), (len(x), 1))

    def close(self):
        pass


class _NoTensorRT:
    def load(self):
        raise RunnerError("TensorRT is not installed (pip install 'compress[tensorrt]')")


@pytest.fixture
def folder_of(monkeypatch):
    """A labelled folder with ``right`` of ``n`` images in class 0."""
    def make(right: int, n: int):
        labels = np.array([0] * right + [1] * (n - right), dtype=np.int64)
        monkeypatch.setattr(verify, "read_labelled_folder",
                            lambda root, spec, classes: LabelledImages(np.zeros((n, 1, 2, 2), np.float32), labels))
    return make


def test_a_tensorrt_release_that_cannot_load_here_is_not_verified_and_says_what_was_not_checked(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(verify, "make_runner", lambda runtime, path, **kw: _NoTensorRT())
    bundle = _bundle(tmp_path / "bundle", "trt-engine", "tensorrt/export.engine/model.engine")
    (tmp_path / "images").mkdir()
    assert main(["verify", str(bundle), str(tmp_path / "images")]) == 1
    out = capsys.readouterr().out
    assert "ok sha256 of all" in out  # what could be checked still is
    assert "NOT CHECKED tensorrt/export.engine/model.engine was not loaded: TensorRT is not installed" in out
    assert f"NOT CHECKED the card's accuracy on {tmp_path / 'images'}: not measured, the file could not run" in out
    assert "NOT verified (2 check(s) asked for could not be made here)" in out

    assert main(["verify", str(bundle)]) == 1  # loading it is part of every verify
    assert "NOT verified (1 check(s) asked for could not be made here)" in capsys.readouterr().out


def test_other_images_that_agree_with_the_card_within_both_samples_errors_verify(tmp_path, monkeypatch, folder_of,
                                                                                capsys):
    monkeypatch.setattr(verify, "make_runner", lambda runtime, path, **kw: _ClassZero())
    bundle = _bundle(tmp_path / "bundle", "torch-model", "model/model.safetensors", top1=98.0, test_images=1000)
    # 97.2% on 2,000 images: their own 95% interval [96.4, 97.8] misses the card's 98.0, yet the card's figure
    # is itself ±0.9 point: the difference −0.8 [−2.2, +0.9] (99%) contains 0
    folder_of(1944, 2000)
    assert main(["verify", str(bundle), str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "top1 97.2% on 2000 images" in out and "difference -0.80 points, 99% interval [" in out
    assert "they agree with the card" in out and out.rstrip().endswith(": verified")


def test_a_card_made_before_the_runtime_had_one_name_is_read_on_the_runtime_it_names(tmp_path, monkeypatch,
                                                                                     caplog, capsys):
    """A bundle of card format 2 names its runtime ``backend``: verify loads the file on that runtime (not the one its
    kind would give) with the options it was measured with, and says in the log that it read an old name."""
    asked = []
    monkeypatch.setattr(verify, "make_runner", lambda runtime, path, **kw: asked.append((runtime, kw)) or _ClassZero())
    bundle = _bundle(tmp_path / "bundle", "onnx", "model/model.onnx")
    card = json.loads((bundle / "model_card.json").read_text())
    card["format"] = "compress-model-card/2"
    card["released"]["backend"] = "openvino"
    card["latency"] = {"runner": {"backend": "openvino", "hint": "LATENCY", "inference_precision": "f32",
                                  "threads_used": 2}}
    (bundle / "model_card.json").write_text(json.dumps(card))
    write_sums(bundle)
    monkeypatch.setattr(verify, "_onnx_loads", lambda path, card, result: True)
    with caplog.at_level("WARNING", logger="compress.release.verify"):
        assert main(["verify", str(bundle)]) == 0
    assert [runtime for runtime, _ in asked] == ["openvino"] and asked[0][1]["hint"] == "LATENCY"
    assert "loads in openvino" in capsys.readouterr().out
    assert caplog.text.count("names its runtime 'backend'") == 2  # the released record and its runner, each said


def test_other_images_that_show_the_card_wrong_fail(tmp_path, monkeypatch, folder_of, capsys):
    monkeypatch.setattr(verify, "make_runner", lambda runtime, path, **kw: _ClassZero())
    bundle = _bundle(tmp_path / "bundle", "torch-model", "model/model.safetensors", top1=98.0, test_images=1000)
    folder_of(9500, 10_000)  # the file reaches 95%, its card says 98%
    assert main(["verify", str(bundle), str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "the interval excludes 0, so these images disagree with the card" in out
    assert "NOT verified (1 check(s) failed)" in out


def test_a_card_without_its_test_set_size_cannot_be_compared_with_other_images(tmp_path, monkeypatch, folder_of,
                                                                                capsys):
    monkeypatch.setattr(verify, "make_runner", lambda runtime, path, **kw: _ClassZero())
    bundle = _bundle(tmp_path / "bundle", "torch-model", "model/model.safetensors", test_images=None)
    folder_of(98, 100)
    assert main(["verify", str(bundle), str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "NOT CHECKED" in out and "does not record how many test images" in out


def test_a_file_that_is_not_onnx_fails_and_its_accuracy_is_said_unchecked(tmp_path, capsys):
    bundle = _bundle(tmp_path / "bundle", "onnx", "model/model.onnx")  # bytes that are no ONNX file
    (tmp_path / "images").mkdir()
    assert main(["verify", str(bundle), str(tmp_path / "images")]) == 1
    out = capsys.readouterr().out
    assert "FAILED model.onnx fails onnx's checker" in out
    assert "NOT CHECKED the card's accuracy on" in out and "not measured, the file could not run" in out
    assert "NOT verified (1 check(s) failed; 1 check(s) asked for could not be made here)" in out
