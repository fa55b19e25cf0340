"""Where a model learned, as far as a run can know, and what that means for its test accuracy.

A model trained in this run records the split it trained on, and a later stage refuses to judge it
on another (``compress.stages.data_match``). A model the user brings (``model.weights``,
``model.onnx``) was trained elsewhere, on data this run never saw: its test split may hold images it
learned from, which makes every accuracy measured on it or its descendants too high by an unknown
amount. The run cannot find that out, so it says so, beside every accuracy, until the user
declares the test images independent (``data.independent_test``), which the statement then says it
rests on. A test folder of the user's own (``data.test_path``) is named, but is no such proof: a
folder apart from this run's train split says nothing of the data the weights first learned from.
"""
from __future__ import annotations

from pathlib import Path

from compress.config import DataConfig, ModelConfig

UNKNOWN = "unknown"

_TEXT = {
    UNKNOWN: "weights came from outside this run ({files}), so the data they learned from is unknown: the test "
             "images may include images they trained on, and every accuracy measured on them or on a model made "
             "from them may be too high. {test}If you know the test images are new to them, set "
             "data.independent_test: true",
    "declared": "weights came from outside this run ({files}); the user declared the test images independent of "
                "the data they were trained on (data.independent_test: true), which this run cannot check. {test}",
}
_OWN_FOLDER = "The test split is the user's own folder (data.test_path: {path}), apart from the train split. "


def _given(value) -> list[str]:
    """Every ``weights:`` / ``onnx:`` file in a (raw) section: the model section, a distillation's student
    or external teacher."""
    found: list[str] = []
    if isinstance(value, dict):
        found += [f"{key}: {value[key]}" for key in ("weights", "onnx") if isinstance(value.get(key), str)]
        for item in value.values():
            found += _given(item)
    elif isinstance(value, list):
        for item in value:
            found += _given(item)
    return found


def brought_files(model: ModelConfig, stages: list) -> list[str]:
    """The files of models trained outside this run that the pipeline starts from, anywhere in it."""
    return _given(model.model_dump()) + _given(stages)


def _statement(files: list[str], data: DataConfig) -> dict:
    status = "declared" if data.independent_test else UNKNOWN
    test = _OWN_FOLDER.format(path=data.test_path) if data.test_path else ""
    return {"status": status, "note": _TEXT[status].format(files="; ".join(files), test=test).strip()}


def origin_record(model: ModelConfig, digests: dict, data: DataConfig) -> dict:
    """What a brought model's record says about where it came from."""
    statement = _statement(_given(model.model_dump()), data)
    return {"source": "onnx" if model.onnx else "weights", "file": str(Path(model.onnx or model.weights or "")),
            "sha256": digests.get("onnx") or digests.get("weights"), "architecture": model.name,
            "training_data": UNKNOWN, "test_independence": statement["status"], "note": statement["note"]}


def test_independence(model: ModelConfig, data: DataConfig, stages: list | None = None) -> dict | None:
    """The report's statement about the test split; None where every model was trained here from scratch
    (its own split is recorded and checked)."""
    files = brought_files(model, stages or [])
    return _statement(files, data) if files else None


def independence_flag(statement: dict | None) -> str | None:
    """The report flag (marked †, as every accuracy it concerns) where nothing vouches for the test split."""
    return f"† {statement['note']}" if statement and statement["status"] == UNKNOWN else None


def runs_independence(configs: list) -> dict | None:
    """One statement for a report over several runs' artifacts (a comparison): the least vouched-for one."""
    statements = [test_independence(c.model, c.data, c.stages) for c in configs]
    return next((st for st in statements if st and st["status"] == UNKNOWN), next(filter(None, statements), None))
