"""OpenVINO as a runtime: the runner, a file measured per runtime, the paired parity of their answers, its profile."""
from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from torch import nn

from compress.quantization.ptq import Calibration, preprocess, quantize
from export.onnx_export import export_onnx
from compress.release.model_card import _served_batch_lines
from serve_bench.bench import (ArtifactSpec, BenchSettings, eval_batch_of, on_runtimes, served_batch,
                               served_batch_accuracy)
from serve_bench.latency.harness import HarnessSettings
from serve_bench.runners import RunnerError, make_runner, usable_onnx_runtimes
from serve_bench.accuracy.runtime_parity import runtime_parity, same_file_pairs

needs_openvino = pytest.mark.skipif("openvino" not in usable_onnx_runtimes(),
                                    reason="OpenVINO is not installed here: pip install 'compress[cpu]'")


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                  nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(self.body(x))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A small float ONNX file and its Q/DQ INT8 file (onnxruntime's PTQ, as the quantize stage makes it)."""
    folder = tmp_path_factory.mktemp("ov")
    torch.manual_seed(0)
    images = torch.randn(64, 3, 16, 16)
    model = _Net().eval()
    float_onnx = folder / "float.onnx"
    export_onnx(model, images[:2], float_onnx)
    prepared = preprocess(float_onnx, folder / "float.prep.onnx")
    int8 = quantize(prepared, folder / "int8.onnx", "cpu", Calibration(method="minmax"), images.numpy()[:32],
                    folder / "calibration.json", reduce_range=True)
    return {"float": float_onnx, "int8": int8, "images": images.numpy()}


@needs_openvino
def test_openvino_runs_the_float_file_as_onnxruntime_does_and_says_what_it_ran_with(files):
    x = files["images"][:8]
    with make_runner("onnxruntime", files["float"], threads=1) as ort_runner:
        expected = ort_runner.infer(x)
    with make_runner("openvino", files["float"], threads=1, inference_precision="f32") as runner:
        got = runner.infer(x)
        info = runner.info()
    assert np.abs(got - expected).max() < 1e-4 * max(1.0, float(np.abs(expected).max()))
    assert info["runtime"] == "openvino" and info["hint"] == "LATENCY" and info["inference_precision"] == "f32"
    assert info["threads_used"] == 1 and info["version"].startswith("20")


@needs_openvino
def test_openvino_runs_the_qdq_int8_file_and_its_profile_names_int8_kernels(files):
    from serve_bench.latency.operator_profile import profile_artifact

    x = files["images"][:1]
    with make_runner("onnxruntime", files["int8"], threads=1) as ort_runner:
        expected = ort_runner.infer(files["images"])
    with make_runner("openvino", files["int8"], threads=1) as runner:
        got = np.concatenate([runner.infer(files["images"][i:i + 1]) for i in range(len(files["images"]))])
    assert (got.argmax(1) == expected.argmax(1)).mean() >= 0.9  # INT8 in two runtimes: the same answers, mostly
    profile = profile_artifact("openvino", str(files["int8"]), x, threads=1, iters=3)
    assert profile["runtime"] == "openvino" and abs(sum(op["share"] for op in profile["ops"]) - 1) < 1e-6
    assert any("I8" in node["provider"] for node in profile["top_nodes"])  # convolutions ran as INT8 kernels
    assert [q["node"] for q in profile["edge_qdq"]] and all(q["op"] == "FakeQuantize" for q in profile["edge_qdq"])


def test_openvino_settings_are_checked_and_its_absence_is_a_clear_error(files, monkeypatch):
    if "openvino" in usable_onnx_runtimes():
        with pytest.raises(RunnerError, match="hint must be one of LATENCY, THROUGHPUT"):
            make_runner("openvino", files["float"], hint="fastest").load()
        with pytest.raises(RunnerError, match="CPU only"):
            make_runner("openvino", files["float"], device="cuda").load()
    monkeypatch.setitem(sys.modules, "openvino", None)  # as if not installed
    with pytest.raises(RunnerError, match=r"OpenVINO is not installed: pip install 'compress\[cpu\]'"):
        make_runner("openvino", files["float"]).load()
    from serve_bench.runners import runtime_status

    assert "not installed" in runtime_status()["openvino"] and "openvino" not in usable_onnx_runtimes()


def test_each_onnx_file_is_one_candidate_per_runtime_and_keeps_its_name_on_the_first():
    onnx = ArtifactSpec(name="quantize.onnx_cpu", stage="quantize", runtime="onnxruntime", path="q/model.onnx",
                        format="onnx", precision="int8", size_bytes=1, options={"inter_op_threads": 1})
    torch_model = ArtifactSpec(name="train.model", stage="train", runtime="torch", path="t", format="torch",
                               precision="fp32", size_bytes=1)
    specs = [torch_model, *on_runtimes(torch_model, ["onnxruntime", "openvino"]),
             *on_runtimes(onnx, ["onnxruntime", "openvino"], {"openvino": {"hint": "LATENCY"}})]
    assert [s.name for s in specs] == ["train.model", "train.model", "quantize.onnx_cpu", "quantize.onnx_cpu@openvino"]
    ov = specs[-1]
    assert (ov.runtime, ov.artifact, ov.options, ov.runtime_in_name) == ("openvino", "quantize.onnx_cpu",
                                                                         {"hint": "LATENCY"}, True)
    assert specs[2].options == {"inter_op_threads": 1} and specs[2].artifact == "quantize.onnx_cpu"
    assert same_file_pairs(specs[1:]) == {"quantize.onnx_cpu@openvino": "quantize.onnx_cpu"}
    settings = BenchSettings(harness=HarnessSettings(), batch_size=4, eval_batch=64)
    assert eval_batch_of(ov, settings) == 4 and eval_batch_of(specs[2], settings) == 64  # OpenVINO: the serving batch


def test_an_openvino_file_served_in_batches_states_its_accuracy_at_the_batch_the_card_recommends():
    ov = ArtifactSpec(name="q@openvino", stage="quantize", runtime="openvino", path="q.onnx", format="onnx",
                      precision="int8", size_bytes=1)
    ort = ArtifactSpec(name="q", stage="quantize", runtime="onnxruntime", path="q.onnx", format="onnx",
                       precision="int8", size_bytes=1)
    swept = {"sweep": {"best": {"label": "batch <= 8", "serving": {"max_batch": 8, "instances": 1}}}}
    assert served_batch(ov, swept, 1) == 8  # the batch the serving section recommends, larger than measured
    assert served_batch(ov, swept, 8) is None and served_batch(ort, swept, 1) is None  # already there / any batch
    assert served_batch(ov, {"sweep": {"best": None}}, 1) is None and served_batch(ov, None, 1) is None
    gated = {"at_target": {"serving": {"max_batch": 4}}, "sweep": None}  # no sweep: the configuration the gate read
    assert served_batch(ov, gated, 1) == 4
    # a known answer: 1,000 images, 900 right at batch 1; at batch 8, 30 right answers turn wrong, 10 wrong right
    labels = np.arange(1000) % 10
    reference = np.eye(10, dtype=np.float32)[np.where(np.arange(1000) < 900, labels, (labels + 1) % 10)]
    served = reference.copy()
    served[:30] = np.eye(10, dtype=np.float32)[(labels[:30] + 2) % 10]
    served[900:910] = np.eye(10, dtype=np.float32)[labels[900:910]]
    got = served_batch_accuracy(8, served, reference, labels, "top1")
    assert (got["batch"], got["top1"], got["difference"], got["changed_answers"], got["n"]) == (8, 88.0, -2.0, 40,
                                                                                                1000)
    assert got["ci"][0] < 88.0 < got["ci"][1]
    line = _served_batch_lines({"at_serving_batch": got, "eval_batch": 1}, "top1")[0]
    assert "batches of up to 8" in line and "measured at batch 1" in line and "top1 88.0%" in line
    assert "-2 points, 40 of 1,000 top-1 answers changed" in line
    assert _served_batch_lines({"eval_batch": 1}, "top1") == []
    # paired against the baseline at that batch, and a flag where that drop is past the red line
    baseline_hits = reference.argmax(1) == labels  # a baseline that answers as the file did at batch 1
    paired = served_batch_accuracy(8, served, reference, labels, "top1", baseline_hits, 1.0)["paired"]
    assert (paired["baseline_only"], paired["artifact_only"], paired["drop"]) == (30, 10, 2.0)
    from compress.stages.measurement import served_batch_flags

    flagged = {"name": "q@openvino", "eval_batch": 1, "accuracy_at_serving_batch": {"batch": 8, "paired": paired}}
    assert "in batches of 8" in served_batch_flags([flagged], 1.0)[0] and served_batch_flags([flagged], 2.5) == []


def test_runtime_parity_counts_the_images_whose_answer_differs_with_a_known_answer():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, size=2000)
    reference = rng.normal(size=(2000, 10)).astype(np.float32)
    reference[np.arange(2000), labels] += 3.0  # mostly right
    other = reference.copy()
    flipped = rng.choice(2000, size=40, replace=False)  # 40 images answer another class on the other runtime
    wrong = (reference[flipped].argmax(1) + 1) % 10
    other[flipped, wrong] = reference[flipped].max(1) + 1.0
    parity = runtime_parity("file", reference, other, labels, "top1")
    assert parity["top1_differs"] == 40 and parity["n"] == 2000 and parity["top1_differs_pct"] == 2.0
    assert parity["top1_differs_ci"][0] < 2.0 < parity["top1_differs_ci"][1] < 3.0
    paired = parity["accuracy_vs_reference"]
    right_before = int((reference[flipped].argmax(1) == labels[flipped]).sum())
    right_after = int((wrong == labels[flipped]).sum())
    assert paired["baseline_only"] == right_before and paired["artifact_only"] == right_after
    assert paired["drop"] == pytest.approx(100.0 * (right_before - right_after) / 2000, abs=1e-4)
    assert paired["drop_ci"][0] <= paired["drop"] <= paired["drop_ci"][1]
    same = runtime_parity("file", reference, reference.copy(), labels, "top1")
    assert same["top1_differs"] == 0 and same["max_abs_logit_diff"] == 0.0 and same["top1_differs_ci"][0] == 0.0


def test_a_file_is_refused_on_a_runtime_its_red_line_was_not_checked_on(caplog):
    """The quantize stage's record, read by the bench as the same typed record: refused where the check failed or
    never ran; a manifest of the older shape (the own runtime's drop alone, the others under test_drop_on) is read
    the same, with a warning."""
    from compress.stages.quantize_record import ShippedFile

    def refusal(meta: dict, runtime: str) -> str | None:
        return ShippedFile.model_validate(meta).refusal(runtime)

    checked_on_ort = {"red_line": {"within": True, "test_drop": {"onnxruntime": 0.1}}}  # without the OpenVINO check
    assert refusal(checked_on_ort, "onnxruntime") is None
    assert "not on openvino" in refusal(checked_on_ort, "openvino")
    both = {"red_line": {"within": True, "test_drop": {"onnxruntime": 0.1, "openvino": 0.2}}}
    assert refusal(both, "openvino") is None and refusal(both, "onnxruntime") is None
    over = {"red_line": {"within": False, "test_drop": {"onnxruntime": 0.1, "openvino": 2.5}}}
    assert "onnxruntime 0.1, openvino 2.5" in refusal(over, "onnxruntime")  # says which runtime missed it
    assert refusal({}, "openvino") is None  # a file no ladder judged (NNCF's, the fp32 export): the gate judges it
    assert refusal({"red_line": {}}, "openvino") is None  # a record without a check refuses nothing, as before
    with caplog.at_level("WARNING", logger="compress.stages.quantize_record"):
        old = ShippedFile.model_validate({"runtimes": ["onnxruntime", "openvino"], "red_line": {
            "within": False, "test_drop": 0.1, "test_drop_on": {"openvino": 2.5}}})
    assert old.red_line == ShippedFile.model_validate(over).red_line and "older manifest's shape" in caplog.text
    assert "not on inductor" in refusal({"red_line": {"within": True}}, "inductor")  # older still: no drop written


def test_the_same_file_twice_on_one_runtime_is_not_a_runtime_pair_and_a_tie_is_noted():
    from serve_bench.accuracy.runtime_parity import runtime_choice_note

    def spec(name, runtime, path="a.onnx"):
        return ArtifactSpec(name=name, stage="s", runtime=runtime, path=path, format="onnx", precision="int8",
                            size_bytes=1)

    assert same_file_pairs([spec("a", "onnxruntime"), spec("b", "onnxruntime")]) == {}
    assert same_file_pairs([spec("a", "onnxruntime"), spec("a@openvino", "openvino")]) == {"a@openvino": "a"}
    ort = {"name": "q", "artifact": "q", "runtime": "onnxruntime"}

    def ov(ci):
        return {"name": "q@openvino", "artifact": "q", "runtime": "openvino",
                "runtime_parity": {"reference": "q", "latency_ratio": {"p99": {"ratio": 1.05, "ci": ci}}}}

    assert "not told apart" in runtime_choice_note([ort, ov([0.8, 1.3])], "q")
    assert runtime_choice_note([ort, ov([1.1, 1.3])], "q") is None  # OpenVINO slower, clearly
    assert "released on openvino" in runtime_choice_note([ort, ov([0.8, 1.3])], "q@openvino")


def test_the_quantize_check_follows_the_bench_stages_and_its_cache_key_holds_the_runtime_versions(monkeypatch):
    from compress.stages import runtime_choice

    monkeypatch.setattr(runtime_choice, "runtime_status", lambda device: {"onnxruntime": None, "openvino": None})
    monkeypatch.setattr(runtime_choice, "usable_onnx_runtimes", lambda device: ["onnxruntime", "openvino"])
    monkeypatch.setattr(runtime_choice, "runtime_versions", lambda names: {n: "2026.4.1" for n in names})
    stages = [{"name": "quantize", "kind": "quantize"},
              {"name": "bench", "kind": "bench", "runtimes": ["onnxruntime"], "threads": 1}]
    plan = runtime_choice.cpu_check_plan(None, stages, 1, "stages.quantize.runtimes")
    assert plan["runtimes"] == []  # the bench measures onnxruntime alone: nothing else to check
    stages[1] = {"name": "bench", "kind": "bench", "openvino": {"inference_precision": "f32"}, "threads": 1}
    plan = runtime_choice.cpu_check_plan(None, stages, 4, "stages.quantize.runtimes")
    assert plan == {"runtimes": ["openvino"], "versions": {"openvino": "2026.4.1"}, "serve_batch": 4, "threads": 1,
                    "options": {"openvino": {"hint": "LATENCY", "inference_precision": "f32"}}}
    monkeypatch.setattr(runtime_choice, "runtime_versions", lambda names: {n: "2027.0" for n in names})
    assert runtime_choice.cpu_check_plan(None, stages, 4, "f") != plan  # a new OpenVINO: the key changes
