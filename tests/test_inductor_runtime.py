"""torch.compile (Inductor) as a runtime, PyTorch's own INT8 file it runs, and how a bench makes their candidates.

A tiny model keeps each compile to seconds, and the tests that compile are in the slow tier (a compile is seconds
even there); the default suite keeps the candidates' making and naming. The real-size measurement is the resnet18
pipeline's bench."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from serve_bench.bench import ArtifactSpec, on_runtimes
from serve_bench.bench.references import compile_alone_of, reference_on_runtime
from serve_bench.runners import RUNNER_OF_KIND, InductorRunner, RunnerError, TorchRunner, runtimes_of_kind
from serve_bench.runners.inductor import native_int8
from train.model_io import describe, save_model
from train.models import build_model

needs_inductor = pytest.mark.skipif(InductorRunner.unavailable() is not None,
                                    reason=f"Inductor cannot compile here: {InductorRunner.unavailable()}")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("inductor")
    torch.manual_seed(0)
    model = build_model("resnet20", 10, 1, {"width": 4}).eval()
    description = describe("resnet20", 10, 1, {"width": 4}, {})
    save_model(model, folder / "model", description)
    images = np.random.default_rng(0).standard_normal((48, 1, 8, 8)).astype(np.float32)
    return folder, model, description, images


@pytest.mark.slow
@needs_inductor
def test_the_compiled_model_answers_as_eager_and_reports_its_compiles_apart(tiny):
    folder, _, _, images = tiny
    from torch._dynamo.utils import counters

    with TorchRunner(folder / "model", threads=1) as eager, InductorRunner(folder / "model", threads=1) as compiled:
        compiled.warm(images[:1])
        compiles = dict(compiled.info()["compile_s"])
        assert set(compiles) == {"batch 1", "batch 2", "batch 64"} and all(s > 0 for s in compiles.values())
        graphs = counters["stats"]["unique_graphs"]
        for size in (1, 5, 17, 3):  # batch 1's own graph, then the dynamic-batch ones: no compile per size
            np.testing.assert_allclose(compiled.infer(images[:size]), eager.infer(images[:size]), rtol=1e-3, atol=1e-4)
        assert counters["stats"]["unique_graphs"] == graphs  # guard hits, not more graphs
        assert compiled.info()["compile_s"] == compiles  # and none reported as a compile
        info = compiled.info()
        assert (info["precision"], info["freezing"], info["mode"]) == ("fp32", True, "default")
        assert InductorRunner.options_from_info(info) == {"precision": "fp32", "mode": "default", "freezing": True}


@pytest.mark.slow
@needs_inductor
def test_the_native_int8_file_rebuilds_without_unpickling_and_refuses_a_changed_model(tiny, tmp_path, caplog):
    folder, model, description, images = tiny
    recipe = InductorRunner.make_native_int8(model, description, images[:32], tmp_path / "int8")
    assert recipe["format"] == native_int8.FORMAT and recipe["calibration_images"] == 32
    assert native_int8.is_native_int8(tmp_path / "int8") and not native_int8.is_native_int8(folder / "model")
    with InductorRunner(tmp_path / "int8", threads=1) as runner:
        quantized = runner.infer(images[32:48])
    float_logits = model(torch.from_numpy(images[32:48])).detach().numpy()
    cosine = (quantized * float_logits).sum(1) / np.linalg.norm(quantized, axis=1) / np.linalg.norm(float_logits, axis=1)
    assert cosine.min() > 0.98  # INT8 arithmetic, close to the float model's answers
    assert not np.array_equal(quantized, float_logits)  # and not the float model itself
    # made by another torchao: it loads, and the log says its red-line check was made on that version
    recipe_file = tmp_path / "int8" / native_int8.RECIPE_FILE
    recipe_file.write_text(json.dumps({**json.loads(recipe_file.read_text()), "torchao": "0.0.1"}))
    with caplog.at_level("WARNING", logger=native_int8.__name__):
        InductorRunner(tmp_path / "int8", threads=1).load().close()
    assert "made with torchao 0.0.1, rebuilt with torchao" in caplog.text
    # The state must fit the graph the quantizer annotates: another model's weights are refused, by name
    other = build_model("resnet20", 10, 1, {"width": 8}).eval()
    save_model(other, tmp_path / "int8", describe("resnet20", 10, 1, {"width": 8}, {}))
    with pytest.raises(RunnerError, match="does not fit the model"):
        InductorRunner(tmp_path / "int8", threads=1).load()


def test_a_bench_makes_each_torch_file_one_candidate_per_runtime_and_way():
    torch_model = ArtifactSpec(name="train.model", stage="train", runtime="torch", path="t", format="torch",
                               precision="fp32", size_bytes=1)
    settings = {"inductor": {"mode": "default", "freezing": True, "bf16": "on"}}
    specs = on_runtimes(torch_model, ["torch", "onnxruntime", "inductor"], settings)
    assert [(s.name, s.runtime, s.precision) for s in specs] == [
        ("train.model", "torch", "fp32"), ("train.model@inductor", "inductor", "fp32"),
        ("train.model@inductor-bf16", "inductor", "bf16")]
    assert specs[2].options == {"mode": "default", "freezing": True, "precision": "bf16"}
    assert specs[2].extra["variant"] == "-bf16" and "variant" not in specs[1].extra
    off = on_runtimes(torch_model, ["torch", "inductor"], {"inductor": {"bf16": "off"}})
    assert [s.name for s in off] == ["train.model", "train.model@inductor"]
    # PyTorch's INT8 file runs on Inductor alone, and gets no bf16 candidate
    assert RUNNER_OF_KIND[native_int8.KIND] == "inductor" and runtimes_of_kind("torch-model") == ["torch", "inductor"]
    int8 = ArtifactSpec(name="quantize.native_inductor", stage="quantize", runtime="inductor", path="q",
                        format="pt2e", precision="int8", size_bytes=1, source_model="prune.model")
    native = on_runtimes(int8, ["inductor"], {"inductor": {"mode": "max-autotune-no-cudagraphs", "freezing": False}})
    assert [s.name for s in native] == ["quantize.native_inductor"]  # on its home runtime, with the bench's settings
    assert native[0].options == {"mode": "max-autotune-no-cudagraphs", "freezing": False, "precision": "fp32"}


def test_compile_alone_is_a_reference_every_other_runtime_is_divided_by():
    from compress.stages.measurement import compile_alone
    from compress.stages.runtime_choice import runtimes_for_kind

    def spec(name, runtime, fmt, precision="fp32", artifact=None):
        return ArtifactSpec(name=name, stage=name.split(".")[0], runtime=runtime, path=name, format=fmt,
                            precision=precision, size_bytes=1, artifact=artifact)

    specs = compile_alone([spec("train.model", "torch", "torch"),
                           spec("train.model@inductor", "inductor", "torch", artifact="train.model"),
                           spec("train.model@inductor-bf16", "inductor", "torch", "bf16", artifact="train.model"),
                           spec("prune.model@inductor", "inductor", "torch", artifact="prune.model"),
                           spec("quantize.onnx_cpu", "onnxruntime", "onnx", "int8")], "train.model")
    roles = {s.name: s.extra.get("role") for s in specs}
    assert roles == {"train.model": None, "train.model@inductor": "reference",
                     "train.model@inductor-bf16": "reference", "prune.model@inductor": None, "quantize.onnx_cpu": None}
    by_name = {s.name: s for s in specs}
    assert compile_alone_of(by_name["quantize.onnx_cpu"], specs).name == "train.model@inductor"
    assert compile_alone_of(by_name["train.model"], specs).name == "train.model@inductor"  # eager over compiled
    assert compile_alone_of(by_name["prune.model@inductor"], specs) is None  # same runtime: export alone's job
    assert reference_on_runtime(by_name["prune.model@inductor"], specs).name == "train.model@inductor"
    # torch eager stays measured when only the optional runtime is named; an ONNX file keeps to the ONNX ones
    assert runtimes_for_kind("torch-model", ["onnxruntime", "inductor"]) == ["torch", "inductor"]
    assert runtimes_for_kind("onnx", ["onnxruntime", "openvino", "inductor"]) == ["onnxruntime", "openvino"]
    assert runtimes_for_kind(native_int8.KIND, ["onnxruntime"]) == ["inductor"]
    # named in any order, torch eager keeps the model's own name: the baseline is never the compiled model
    assert runtimes_for_kind("torch-model", ["inductor", "torch"]) == ["torch", "inductor"]


def test_a_bench_names_runtimes_by_the_registry_and_the_old_switch_is_said_deprecated():
    from compress.stages.bench_stage import BenchConfig
    from compress.stages.runtime_choice import bench_runtimes

    with pytest.raises(ValueError, match=r"unknown runtime 'torch-compile'; known: torch, onnxruntime"):
        BenchConfig(name="bench", runtimes=["onnxruntime", "torch-compile"])
    cfg = BenchConfig(name="bench", runtimes=["onnxruntime", "inductor"])
    assert bench_runtimes(cfg) == (["onnxruntime", "inductor"] if InductorRunner.unavailable() is None else None)
    old = BenchConfig(name="bench", runtimes=["onnxruntime"], torch_compile=True)
    assert bench_runtimes(old)[-1] == "inductor"


def test_pytorchs_own_int8_file_of_the_baseline_is_paired_with_compile_alone():
    """PyTorch's own INT8 file made from the baseline has no fp32 Inductor file of its model but the baseline
    compiled as it is: that reference is its fp32 counterpart (its ratio, its traffic pairing, the gate's rule), the
    fp32 way of running it and never the bf16 one. A compressed model's own fp32 file, where there is one, is
    preferred to the reference."""
    from compress.stages.measurement import compile_alone
    from serve_bench.bench.references import fp32_reference, traffic_pairs

    def spec(name, runtime, fmt, precision="fp32", artifact=None, source="train.model", variant=None):
        return ArtifactSpec(name=name, stage=name.split(".")[0], runtime=runtime, path=name, format=fmt,
                            precision=precision, size_bytes=1, artifact=artifact, source_model=source,
                            extra={"variant": variant} if variant else {})

    specs = compile_alone([spec("train.model", "torch", "torch"),
                           spec("train.model@inductor-bf16", "inductor", "torch", "bf16", "train.model",
                                variant="-bf16"),
                           spec("train.model@inductor", "inductor", "torch", artifact="train.model"),
                           spec("quantize.native_inductor", "inductor", "pt2e", "int8"),
                           spec("prune.model@inductor", "inductor", "torch", artifact="prune.model",
                                source="prune.model"),
                           spec("quantize2.native_inductor", "inductor", "pt2e", "int8", source="prune.model"),
                           spec("quantize3.native_inductor", "inductor", "pt2e", "int8", source="distill.model")],
                          "train.model")
    by_name = {s.name: s for s in specs}
    assert fp32_reference(by_name["quantize.native_inductor"], specs).name == "train.model@inductor"
    assert fp32_reference(by_name["quantize2.native_inductor"], specs).name == "prune.model@inductor"
    # a compressed model whose fp32 file is not measured compiled (resnet18.yaml's): the baseline compiled as it is
    assert fp32_reference(by_name["quantize3.native_inductor"], specs).name == "train.model@inductor"
    assert traffic_pairs(specs)["quantize.native_inductor"] == {"fp32": "train.model@inductor"}
