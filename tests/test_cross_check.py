"""The independent LoadGen cross-check script: which file it serves (the report keeps paths relative to the run
directory) and which servers it refuses, without running LoadGen."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.conftest import ROOT


def _script():
    spec = importlib.util.spec_from_file_location("loadgen_cross_check", ROOT / "pipelines" / "loadgen_cross_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _report(path: str, serving: dict) -> dict:
    entry = {"name": "quantize.onnx_cpu", "runtime": "onnxruntime", "path": path,
             "traffic": {"at_target": {"offered_qps": 300.0, "serving": serving}}}
    return {"gate": {"release": "quantize.onnx_cpu"}, "artifacts": [entry]}


def test_the_file_is_read_relative_to_the_run_directory_from_any_folder(tmp_path):
    check = _script()
    name, _, path = check.checked_file(tmp_path / "run", _report("quantize/model.onnx", {"max_batch": 1}), None)
    assert name == "quantize.onnx_cpu" and path == tmp_path / "run" / "quantize" / "model.onnx"
    absolute = str(tmp_path / "elsewhere.onnx")
    assert check.checked_file(tmp_path / "run", _report(absolute, {}), None)[2] == Path(absolute)


def test_a_batched_server_or_a_missing_entry_is_refused_with_what_to_do(tmp_path):
    check = _script()
    with pytest.raises(SystemExit, match="one copy, batch 1"):
        check.checked_file(tmp_path, _report("m.onnx", {"max_batch": 8, "instances": 1}), None)
    with pytest.raises(SystemExit, match="entries: quantize.onnx_cpu"):
        check.checked_file(tmp_path, _report("m.onnx", {}), "export.onnx")
    assert check._verdict(None, 1.0) == "no interval to compare with"
    assert check._verdict([0.9, 1.1], 1.0) == "inside the interval" and "OUTSIDE" in check._verdict([0.9, 1.1], 2.0)
