"""Where a model learned, as far as a run can know, and what that means for its test accuracy.

A model trained in this run records the split it trained on, and a later stage refuses to judge it
on another (``compress.stages.data_match``). A model the user brings (``model.weights``,
``model.onnx``) was trained elsewhere, on data this run never saw: its test split may hold images it
learned from, which makes every accuracy measured on it or its descendants too high by an unknown
amount. The run cannot find that out, so it says so, beside every accuracy, until the user either
gives a test folder of their own (``data.test_path``) or declares the test images independent
(``data.independent_test``). Neither is checked: the statement names which of the two it rests on.
"""
from __future__ import annotations

from pathlib import Path

from compress.config import DataConfig, ModelConfig

UNKNOWN = "unknown"

_TEXT = {
    UNKNOWN: "the model's weights came from outside this run ({file}), so the data it learned from is unknown: "
             "the test images may include images it trained on, and its accuracies (and every accuracy measured "
             "on a model made from it) may be too high. Give a test folder of your own (data.test_path) or, if "
             "you know the test images are new to it, set data.independent_test: true",
    "test_path": "the test split is the user's own folder (data.test_path: {test_path}), kept apart from the "
                 "train split; that the model never saw those images where it was trained first is the user's word",
    "declared": "the user declared the test images independent of the data the model was trained on "
                "(data.independent_test: true); this run cannot check that",
}


def vouched_by(data: DataConfig) -> str | None:
    """What the test split's independence rests on where the model came from outside, or None."""
    if data.test_path:
        return "test_path"
    if data.independent_test:
        return "declared"
    return None


def _file(model: ModelConfig) -> str:
    return f"model.onnx: {model.onnx}" if model.onnx else f"model.weights: {model.weights}"


def origin_record(model: ModelConfig, digests: dict, data: DataConfig) -> dict:
    """What a brought model's record says about where it came from."""
    status = vouched_by(data) or UNKNOWN
    return {"source": "onnx" if model.onnx else "weights", "file": str(Path(model.onnx or model.weights or "")),
            "sha256": digests.get("onnx") or digests.get("weights"), "architecture": model.name,
            "training_data": UNKNOWN, "test_independence": status,
            "note": _TEXT[status].format(file=_file(model), test_path=data.test_path)}


def test_independence(model: ModelConfig, data: DataConfig) -> dict | None:
    """The report's statement about the test split; None where the run trained the model from scratch
    (its own split is recorded and checked)."""
    if not model.given:
        return None
    status = vouched_by(data) or UNKNOWN
    return {"status": status, "note": _TEXT[status].format(file=_file(model), test_path=data.test_path)}
