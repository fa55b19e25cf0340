"""TensorRT: everything around the engine build that can be checked without TensorRT itself."""
from __future__ import annotations

import json
from typing import ClassVar, Literal

import onnx
import pytest
from onnx import TensorProto, helper

from compress.cli import main
from compress.config import StageConfig
from compress.errors import ArtifactError
from compress.pipeline.pipeline_file import build_pipeline
from compress.pipeline.runner import Runner
from compress.stages import registry
from compress.stages.base import Stage, StageResult
from export.tensorrt_engine import (BuildSettings, EngineBuildError, EngineMismatch, build_engine, check_compatible,
                                    has_qdq, layer_precisions, unavailable_reason)

TRT_ABSENT = unavailable_reason()

# What the engine inspector returns with DETAILED verbosity, trimmed to the fields read.
INSPECTOR_JSON = json.dumps({"Layers": [
    {"Name": "conv1 + relu", "LayerType": "CaskConvolution", "Inputs": [{"Format/Datatype": "Int8 NC/32HW32"}]},
    {"Name": "conv2", "LayerType": "CaskConvolution", "Inputs": [{"Format/Datatype": "Channel major FP16 format"}]},
    {"Name": "pool", "LayerType": "CaskPooling", "Inputs": [{"Format/Datatype": "Half"}]},
    {"Name": "fc", "LayerType": "CaskGemmMatrixMultiply", "Inputs": [{"Format/Datatype": "Row major linear FP32"}]},
    {"Name": "reformat", "LayerType": "Reformat", "Inputs": [{"Format/Datatype": "Float"}]},
], "Bindings": ["input", "logits"]})

RECORDED = {"tensorrt_version": "10.3.0", "gpu_name": "NVIDIA L4", "compute_capability": "8.9"}


def test_layer_precisions_flag_float_compute_layers():
    summary = layer_precisions(INSPECTOR_JSON)
    assert summary["layers"] == {"INT8": 1, "FP16": 2, "FP32": 2}
    assert summary["float_compute_layers"] == ["conv2", "fc"]


@pytest.mark.parametrize("current, expected", [
    ({**RECORDED, "tensorrt_version": "10.9.0"}, r"built for TensorRT 10\.3\.0 \(this machine has 10\.9\.0\); rebuild"),
    ({**RECORDED, "gpu_name": "NVIDIA H100", "compute_capability": "9.0"},
     r"GPU NVIDIA L4 sm_8\.9 \(this machine has NVIDIA H100 sm_9\.0\)"),
])
def test_an_engine_from_another_machine_is_refused(current, expected):
    with pytest.raises(EngineMismatch, match=expected):
        check_compatible(RECORDED, current)
    check_compatible(RECORDED, dict(RECORDED))


def _graph(with_qdq: bool) -> onnx.ModelProto:
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    inits = []
    if with_qdq:
        inits = [helper.make_tensor("s", TensorProto.FLOAT, [], [0.1]), helper.make_tensor("z", TensorProto.INT8, [], [0])]
        nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
                 helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 2, 2])], inits)
    return helper.make_model(graph)


def test_int8_engines_need_a_qdq_onnx(tmp_path):
    assert has_qdq(_graph(True)) and not has_qdq(_graph(False))
    onnx.save(_graph(False), str(tmp_path / "float.onnx"))
    with pytest.raises(EngineBuildError, match=r"no QuantizeLinear/DequantizeLinear nodes; an INT8 engine is built "
                                               r"from the quantize stage's Q/DQ ONNX"):
        build_engine(tmp_path / "float.onnx", tmp_path / "engine", BuildSettings(precision="int8"), "x", (1, 2, 2))


@pytest.mark.skipif(TRT_ABSENT is None, reason="TensorRT and a GPU are present: the skip path does not apply")
def test_missing_tensorrt_is_recorded_as_skipped_or_fails_when_required(tmp_path, tiny_config, write_pipeline, capsys):
    tiny_config["stages"].append({"name": "export", "kind": "export", "formats": ["onnx", "tensorrt"],
                                  "parity": {"samples": 32}})
    path, run_dir = write_pipeline(tiny_config), tmp_path / "run"
    assert main(["run", str(path), "--run-dir", str(run_dir)]) == 0
    assert "export: tensorrt: skipped: " + TRT_ABSENT in capsys.readouterr().err
    metrics = json.loads((run_dir / "manifest.json").read_text())["stages"]["export"]["metrics"]
    assert metrics["tensorrt"] == {"skipped": TRT_ABSENT} and "tensorrt: skipped" in metrics["summary"]
    assert main(["run", str(path), "--run-dir", str(run_dir), "stages.export.tensorrt.required=true"]) == 2
    assert "stages.export.tensorrt.required is true but " + TRT_ABSENT in capsys.readouterr().err


class _NeedsEngineConfig(StageConfig):
    kind: Literal["needs-engine"] = "needs-engine"


class _NeedsEngine(Stage):
    """A consumer of TensorRT engines, as the benchmark stage will be."""

    kind = "needs-engine"
    Config = _NeedsEngineConfig
    input_roles: ClassVar[tuple[str, ...]] = ("engine",)
    required_inputs: ClassVar[tuple[str, ...]] = ("engine",)

    def run(self, ctx, inputs) -> StageResult:
        return StageResult(outputs=[])


@pytest.mark.skipif(TRT_ABSENT is None, reason="TensorRT and a GPU are present: the engine is built")
def test_a_stage_needing_a_skipped_engine_names_the_reason(tmp_path, tiny_config):
    tiny_config["stages"] += [{"name": "export", "kind": "export", "formats": ["onnx", "tensorrt"],
                               "parity": {"samples": 32}},
                              {"name": "use", "kind": "needs-engine", "inputs": {"engine": "export.engine"}}]
    with registry.registered(_NeedsEngine):  # the engine's former output name, read as today's (export.tensorrt)
        pipeline = build_pipeline(tiny_config, "test")
        with pytest.raises(ArtifactError, match=r"needs input export\.tensorrt, which stage 'export' skipped: "
                           + TRT_ABSENT[:20]):
            Runner(pipeline, tmp_path / "run").run()
    assert "needs-engine" not in registry.kinds()  # nothing leaks into later tests


@pytest.mark.gpu
@pytest.mark.skipif(TRT_ABSENT is not None, reason=f"needs TensorRT and a CUDA device: {TRT_ABSENT}")
def test_engine_build_from_exported_onnx(tmp_path):
    import torch

    from export.onnx_export import export_onnx
    from export.tensorrt_engine import load_engine
    from train.models import build_model

    model = build_model("resnet20", 10, 3, {"width": 8}).eval()
    info = export_onnx(model, torch.randn(2, 3, 32, 32), tmp_path / "model.onnx")
    settings = BuildSettings(precision="fp16", max_batch=8, timing_cache=tmp_path / "timing.cache")
    meta = build_engine(info.path, tmp_path / "engine", settings, "input", (3, 32, 32))
    assert meta["layers"] and (tmp_path / "timing.cache").stat().st_size > 0
    engine, loaded = load_engine(tmp_path / "engine")
    assert engine is not None and loaded["precision"] == "fp16"


@pytest.mark.gpu
@pytest.mark.skipif(TRT_ABSENT is not None, reason=f"needs TensorRT and a CUDA device: {TRT_ABSENT}")
def test_int8_engine_build_from_the_quantize_stage_trt_flavour(tmp_path):
    import numpy as np
    import torch

    from compress.quantization.ptq import Calibration, preprocess, quantize
    from export.onnx_export import export_onnx
    from train.models import build_model

    model = build_model("resnet20", 10, 3, {"width": 8}).eval()
    info = export_onnx(model, torch.randn(2, 3, 32, 32), tmp_path / "model.onnx")
    prepped = preprocess(info.path, tmp_path / "prep.onnx")
    calib = np.random.default_rng(0).normal(size=(16, 3, 32, 32)).astype(np.float32)
    qdq = quantize(prepped, tmp_path / "trt.onnx", "tensorrt", Calibration(method="minmax"), calib, tmp_path / "cache.json")
    settings = BuildSettings(precision="int8", max_batch=8, timing_cache=tmp_path / "timing.cache")
    meta = build_engine(qdq, tmp_path / "engine", settings, info.input_name, (3, 32, 32))
    # Every convolution of the fully quantized ResNet-20 runs in INT8: none is left in float.
    assert meta["layers"].get("INT8", 0) > 0
    assert not [name for name in meta["float_compute_layers"] if "conv" in name.lower()], meta["float_compute_layers"]


@pytest.mark.gpu
@pytest.mark.skipif(TRT_ABSENT is not None, reason=f"needs TensorRT and a CUDA device: {TRT_ABSENT}")
def test_concurrent_clients_get_their_own_context_and_device_only_stays_on_the_device(tmp_path):
    import threading

    import numpy as np
    import torch

    from export.onnx_export import export_onnx
    from serve_bench.runners import TensorRTRunner
    from train.models import build_model

    model = build_model("resnet20", 10, 3, {"width": 8}).eval()
    info = export_onnx(model, torch.randn(2, 3, 32, 32), tmp_path / "model.onnx")
    build_engine(info.path, tmp_path / "engine", BuildSettings(precision="fp32", max_batch=8), "input", (3, 32, 32))
    images = np.random.default_rng(0).standard_normal((4, 8, 3, 32, 32)).astype(np.float32)
    with TensorRTRunner(tmp_path / "engine") as runner:
        staged = runner.prepare(images[0])  # device-only timing starts and ends on the device, as for the others
        assert staged.device.type == "cuda" and runner.run_prepared(staged).device.type == "cuda"
        expected = [runner.infer(batch) for batch in images]
        results: dict[int, list] = {}

        def client(c: int) -> None:
            results[c] = [runner.infer(images[c]) for _ in range(20)]

        threads = [threading.Thread(target=client, args=(c,)) for c in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(runner._per_thread.made) == 5  # the main thread's and one per client
        for c, outputs in results.items():
            for out in outputs:
                np.testing.assert_allclose(out, expected[c], rtol=1e-3, atol=1e-3)
