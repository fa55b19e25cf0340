"""ONNX export: parity on many architectures, fp16, simplification, and refusing unsafe files."""
from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from compress.cli import main
from export.external_data import UnsafeModelError, check_external_data, load_onnx
from export.onnx_export import export_onnx
from export.parity import ParityError, check_parity, ort_session
from train.models import build_model


@pytest.mark.parametrize("name, channels, size", [
    ("resnet18", 3, 32), ("mobilenet_v2", 3, 32), ("efficientnet_b0", 3, 32),
    ("resnet20", 1, 16), ("resnet32", 3, 16), ("resnet56", 3, 16), ("tests.user_models:SmallNet", 1, 12),
])
def test_export_and_parity_across_architectures(tmp_path, name, channels, size):
    torch.manual_seed(0)
    model = build_model(name, 10, channels).eval()
    images = torch.randn(8, channels, size, size)
    info = export_onnx(model, images[:2], tmp_path / "model.onnx")
    assert info.opset == 18 and not info.external_data and info.files == ["model.onnx"]
    results = check_parity(info.path, model, images, [1, 4], tolerance=1e-4, min_agreement=99.9)
    assert [r.batch_size for r in results] == [1, 4] and all(r.rel_diff <= 1e-4 for r in results)
    session = ort_session(info.path)
    assert session.get_inputs()[0].name == "input" and session.get_inputs()[0].shape[0] == "batch"
    assert session.get_outputs()[0].name == "logits"


def test_fp16_export_keeps_float32_io_or_declares_half(tmp_path):
    torch.manual_seed(0)
    model = build_model("resnet20", 10, 1, {"width": 8}).eval()
    images = torch.randn(8, 1, 16, 16)
    info = export_onnx(model, images[:2], tmp_path / "half.onnx", precision="fp16")
    graph = onnx.load(str(info.path)).graph
    assert graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert any(init.data_type == TensorProto.FLOAT16 for init in graph.initializer)
    results = check_parity(info.path, model, images, [1, 4], tolerance=1e-2, min_agreement=0.0)
    assert 0 < max(r.rel_diff for r in results) <= 1e-2  # fp16 is close, but not bit-exact
    declared = export_onnx(model, images[:2], tmp_path / "half_io.onnx", precision="fp16", io_dtype="fp16")
    assert onnx.load(str(declared.path)).graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    check_parity(declared.path, model, images, [4], tolerance=1e-2, min_agreement=0.0, io_dtype="fp16")


def test_simplified_graph_keeps_parity(tmp_path):
    model = build_model("resnet20", 10, 1, {"width": 8}).eval()
    images = torch.randn(8, 1, 16, 16)
    info = export_onnx(model, images[:2], tmp_path / "slim.onnx", simplify=True)
    assert info.simplified
    check_parity(info.path, model, images, [1, 4], tolerance=1e-4, min_agreement=99.9)


def test_a_perturbed_onnx_fails_parity_with_the_numbers(tmp_path):
    torch.manual_seed(0)
    model = build_model("tests.user_models:SmallNet", 10, 1).eval()
    images = torch.randn(8, 1, 12, 12)
    info = export_onnx(model, images[:2], tmp_path / "model.onnx")
    proto = onnx.load(str(info.path))
    bias = next(i for i in proto.graph.initializer if numpy_helper.to_array(i).shape == (10,))
    bias.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(bias) + 0.5, bias.name))
    onnx.save(proto, str(info.path))
    with pytest.raises(ParityError, match=r"batch 1: max \|Δ\| 0\.5 = .* of the logit scale .*tolerance 0\.0001.*"
                                          r"batch 4: .*over 8 images"):
        check_parity(info.path, model, images, [1, 4], tolerance=1e-4, min_agreement=99.9)


def _external_model(folder, location: str) -> str:
    tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[1], data_location=TensorProto.EXTERNAL)
    for key, value in (("location", location), ("offset", "0"), ("length", "4")):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], [tensor])
    path = os.path.join(folder, "model.onnx")
    with open(path, "wb") as fh:
        fh.write(helper.make_model(graph).SerializeToString())
    return path


@pytest.mark.parametrize("location, expected", [
    ("/etc/passwd", "is an absolute path"),
    ("../secret.bin", "contains '..'"),
    ("sub/../../secret.bin", "contains '..'"),
])
def test_external_data_leaving_the_folder_is_refused(tmp_path, location, expected):
    (tmp_path / "secret.bin").write_bytes(b"\0" * 4)
    folder = tmp_path / "model"
    folder.mkdir()
    with pytest.raises(UnsafeModelError, match=expected):
        load_onnx(_external_model(str(folder), location))


def test_external_data_symlinked_out_of_the_folder_is_refused(tmp_path):
    (tmp_path / "secret.bin").write_bytes(b"\0" * 4)
    folder = tmp_path / "model"
    folder.mkdir()
    os.symlink(tmp_path / "secret.bin", folder / "weights.bin")
    with pytest.raises(UnsafeModelError, match=r"resolves to .*secret\.bin, outside .*a symlink"):
        check_external_data(_external_model(str(folder), "weights.bin"))


def test_external_data_beside_the_model_loads(tmp_path):
    (tmp_path / "weights.bin").write_bytes(np.array([2.0], dtype=np.float32).tobytes())
    model = load_onnx(_external_model(str(tmp_path), "weights.bin"))
    assert numpy_helper.to_array(model.graph.initializer[0]).tolist() == [2.0]


def test_the_stage_refuses_an_unsafe_onnx_input(tmp_path, capsys):
    folder = tmp_path / "evil"
    folder.mkdir()
    path = _external_model(str(folder), "/etc/passwd")
    code = main(["stage", "export", "--data", "digits", "--run-dir", str(tmp_path / "run"),
                 "--input", f"onnx={path}", "formats=[tensorrt]"])
    assert code == 2 and "external data location '/etc/passwd' is an absolute path" in capsys.readouterr().err


def test_export_stage_records_metadata_and_parity(tmp_path, tiny_config, write_pipeline):
    tiny_config["stages"].append({"name": "export", "kind": "export", "formats": ["onnx", "tensorrt"],
                                  "parity": {"batch_sizes": [1, 16], "samples": 64}})
    run_dir = tmp_path / "run"
    assert main(["run", str(write_pipeline(tiny_config)), "--run-dir", str(run_dir)]) == 0
    manifest = json.loads((run_dir / "manifest.json").read_text())
    onnx_artifact = manifest["artifacts"]["export.onnx"]
    meta = onnx_artifact["meta"]
    assert onnx_artifact["made_from"] == ["train.model"] and onnx_artifact["kind"] == "onnx"
    assert (meta["input_name"], meta["output_name"], meta["opset"], meta["dynamic_batch"]) == ("input", "logits", 18, True)
    assert meta["preprocessing"]["channels"] == 1 and meta["preprocessing"]["height"] == 8
    assert [r["batch_size"] for r in meta["parity"]["results"]] == [1, 16]
    assert all(r["top1_agreement"] == 100.0 for r in meta["parity"]["results"])
    metrics = manifest["stages"]["export"]["metrics"]
    if "skipped" in metrics["tensorrt"]:
        assert "TensorRT is not installed" in metrics["tensorrt"]["skipped"] or "CUDA" in metrics["tensorrt"]["skipped"]
        assert "export.tensorrt" not in manifest["artifacts"]
    session = ort_session(run_dir / "export" / "onnx" / "model.onnx")
    assert session.run(None, {"input": np.zeros((3, 1, 8, 8), np.float32)})[0].shape == (3, 10)


def test_parity_failure_in_the_stage_exits_3_and_registers_nothing(tmp_path, tiny_config, write_pipeline):
    from tests.conftest import run_cli

    tiny_config["model"] = {"name": "tests.user_models:DiffersWhenExported"}
    tiny_config["stages"].append({"name": "export", "kind": "export", "parity": {"samples": 64}})
    run_dir = tmp_path / "run"
    result = run_cli("run", str(write_pipeline(tiny_config)), "--run-dir", str(run_dir))
    assert result.returncode == 3
    assert "does not match the torch model" in result.stderr and "max |Δ| 1" in result.stderr
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["stages"]["export"]["status"] == "failed" and "export.onnx" not in manifest["artifacts"]
    assert not (run_dir / "export" / "onnx").exists()


def test_a_parity_batch_larger_than_the_validation_split_is_a_setting_to_lower(tmp_path, tiny_config, write_pipeline,
                                                                                capsys):
    """A small folder's validation split holds fewer images than the default parity batch of 32: the run stops with
    the field, the count and the fix (exit 2) before anything is exported, not as a failed parity check."""
    tiny_config["stages"].append({"name": "export", "kind": "export", "parity": {"batch_sizes": [1, 100_000]}})
    run_dir = tmp_path / "run"
    capsys.readouterr()
    assert main(["run", str(write_pipeline(tiny_config)), "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "stages.export.parity.batch_sizes: batch 100000 needs as many validation images" in err
    assert "lower it to" in err and "data.val_fraction" in err and "ParityError" not in err
    assert not (run_dir / "export" / "onnx").exists()
    assert json.loads((run_dir / "manifest.json").read_text())["stages"]["train"]["status"] == "completed"
