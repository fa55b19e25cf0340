"""The quantize stage on the real digits: PTQ flavours, calibration data, the ladder climbing, the gate."""
from __future__ import annotations

import copy
import importlib.util
import json
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import yaml

from compress.cli import main
from compress.pipeline.pipeline_file import load_pipeline
from compress.pipeline.input_wiring import input_refs
from compress.quantization import ladder as int8_ladder, measure as int8_measure, qat_pt2e
from compress.quantization.qdq_lint import graph_constants, lint_qdq
from compress.quantization.qdq_rewrite import WEIGHT_7BIT_MAX, int8_to_uint8_activations, weights_to_7bit
from compress.stages.quantize_record import ShippedFile
from compress.stages.int8_records import split_arrays
from serve_bench.limits import Limits
from tests.report_entries import as_entries
from serve_bench.gate import evaluate
from serve_bench.report.int8_flags import quantized_not_faster
from export.onnx_export import export_onnx
from tests.report_invariants import points_outside_intervals
from tests.conftest import TINY, start_from, trained_digits_config
from train.data import DataSpec, load_data

def _pipeline(folder, quantize: dict, max_drop: float) -> str:
    """The shared trained digits model (tests/conftest.py) then a quantize stage: a run started from
    ``start_from(trained_digits_run, …)`` skips the training."""
    config = trained_digits_config()
    config["red_line"] = {"metric": "top1", "max_drop": max_drop}
    config["stages"].append({"name": "quantize", "kind": "quantize", **quantize})
    path = folder / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


@pytest.fixture(scope="module")
def calibration_seen():
    """Every image array handed to onnxruntime's calibration during the module's runs."""
    seen: list[np.ndarray] = []
    original = int8_ladder.quantize

    def spy(*args, **kwargs):
        seen.append(np.array(args[4]))
        return original(*args, **kwargs)

    int8_ladder.quantize = spy
    yield seen
    int8_ladder.quantize = original


@pytest.fixture(scope="module")
def ptq_run(tmp_path_factory, calibration_seen, trained_digits_run):
    folder = tmp_path_factory.mktemp("ptq")
    path = _pipeline(folder, {"calibration": {"method": "minmax", "samples": 64}}, max_drop=100.0)
    run_dir = start_from(trained_digits_run, folder / "run")
    assert main(["run", path, "--run-dir", str(run_dir)]) == 0
    return run_dir


@pytest.mark.slow  # PT2E's convert and two compiles
def test_pytorchs_own_int8_file_is_made_beside_the_ladder_and_judged_through_the_compiled_module(
        tmp_path, trained_digits_run):
    """``native: [inductor]``: PT2E with X86InductorQuantizer from the same torch model and calibration images, an
    output of its own that runs on torch.compile alone, with its red-line check made through that runtime and the
    data it was made on recorded (its folder holds the model description)."""
    from serve_bench.runners.inductor import native_int8
    from train.model_io import read_description

    path = _pipeline(tmp_path, {"calibration": {"method": "minmax", "samples": 64}, "native": ["inductor"]},
                     max_drop=100.0)
    ptq_run = start_from(trained_digits_run, tmp_path / "run")
    assert main(["run", path, "--run-dir", str(ptq_run)]) == 0
    manifest = json.loads((ptq_run / "manifest.json").read_text())
    record = manifest["artifacts"]["quantize.native_inductor"]
    meta, native = record["meta"], manifest["stages"]["quantize"]["metrics"]["native"]["native_inductor"]
    assert record["kind"] == native_int8.KIND and meta["runtimes"] == ["inductor"] and meta["precision"] == "int8"
    assert meta["red_line"] == {"within": native["within"], "test_drop": {"inductor": native["test_drop"]}}
    assert native["recipe"]["calibration_images"] == 64 and "X86InductorQuantizer" in native["recipe"]["quantizer"]
    assert native["judged_with"]["options"] == {"mode": "default", "freezing": True, "precision": "fp32"}  # as benched
    assert abs(native["test_drop"]) < 5.0  # INT8 of a trained model, not a broken one (the drop is on 1,000 images)
    folder = ptq_run / record["path"]
    assert native_int8.is_native_int8(folder)
    assert read_description(folder)["data"]["split_digest"] == manifest["data"]["split_hash"]


def test_ptq_writes_both_flavours_and_records_the_rung(ptq_run):
    manifest = json.loads((ptq_run / "manifest.json").read_text())
    metrics = manifest["stages"]["quantize"]["metrics"]
    assert metrics["rung"] == "ptq" and metrics["climbed"] == [] and metrics["red_line"]["within"]
    ptq = metrics["rungs"][0]
    assert ptq["calibration"] == {"method": "minmax", "samples": 64, "split": "calib (a seeded subset of train)"}
    has_openvino = importlib.util.find_spec("openvino") is not None
    openvino = has_openvino and importlib.util.find_spec("nncf") is not None
    assert set(ptq["flavours"]) == {"cpu", "tensorrt", *(["openvino"] if openvino else [])}
    assert "latency" in ptq and ptq["tensorrt_lint"]["ok"]
    artifacts = manifest["artifacts"]
    assert artifacts["quantize.onnx_cpu"]["meta"]["flavour"] == "cpu"
    # each runtime's file runs there only: the CPU file on onnxruntime, NNCF's file on OpenVINO; without an
    # OpenVINO file of its own, the CPU file also runs on OpenVINO where OpenVINO is installed
    cpu_runs_on = ["onnxruntime"] if openvino or not has_openvino else ["onnxruntime", "openvino"]
    assert artifacts["quantize.onnx_cpu"]["meta"]["runtimes"] == cpu_runs_on
    kernels = metrics["kernels"]
    assert kernels["cpu@onnxruntime"]["integer"] == 22 and kernels["cpu@onnxruntime"]["float"] == 0  # 21 convs, fc
    if openvino:
        meta = artifacts["quantize.onnx_openvino"]["meta"]
        assert meta["runtimes"] == ["openvino"] and meta["qdq"].startswith("NNCF auto preset (cnn)")
        assert ptq["nncf"]["preset"] == "auto" and ptq["nncf"]["model_type"] == "cnn"
        assert kernels["openvino@openvino"]["integer"] >= 20  # NNCF's file runs its convolutions in int8 there
    assert artifacts["quantize.onnx_tensorrt"]["meta"]["quantization"]["rung"] == "ptq"
    from export.onnx_metadata import read_data_identity

    split = manifest["data"]["split_hash"]
    for flavour in ("cpu", "tensorrt"):  # each shipped file says which split calibrated and judged it
        identity = read_data_identity(ptq_run / "quantize" / f"onnx_{flavour}" / "model.onnx")
        assert identity["split_digest"] == split and identity["preprocessing"]["channels"] == 1


def _optimized_ops(path, folder) -> Counter:
    """Node types of the graph onnxruntime actually runs, after its Q/DQ fusions."""
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(folder / "optimized.onnx")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    session.run(None, {session.get_inputs()[0].name: np.zeros((2, 1, 8, 8), np.float32)})
    return Counter(n.op_type for n in onnx.load(str(folder / "optimized.onnx")).graph.node)


def test_the_cpu_flavour_becomes_qlinearconv_in_onnxruntime(ptq_run, tmp_path):
    ops = _optimized_ops(ptq_run / "quantize" / "onnx_cpu" / "model.onnx", tmp_path)
    assert ops["QLinearConv"] == 21 and ops["Conv"] == 0, ops  # every ResNet-20 conv runs in integer


def test_the_trt_flavour_is_symmetric_int8_and_runs(ptq_run):
    path = ptq_run / "quantize" / "onnx_tensorrt" / "model.onnx"
    model = onnx.load(str(path))
    assert lint_qdq(model).ok
    zero_points = [numpy for numpy in (onnx.numpy_helper.to_array(t) for t in model.graph.initializer)
                   if numpy.dtype in (np.int8, np.uint8) and numpy.size == 1]
    assert zero_points and all(z.dtype == np.int8 and z == 0 for z in zero_points)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert session.run(None, {session.get_inputs()[0].name: np.zeros((3, 1, 8, 8), np.float32)})[0].shape == (3, 10)


def _weights(path) -> list[np.ndarray]:
    model = onnx.load(str(path))
    consts = graph_constants(model.graph)
    return [consts[n.input[0]] for n in model.graph.node
            if n.op_type == "DequantizeLinear" and n.input[0] in consts and consts[n.input[0]].ndim >= 2]


def test_the_cpu_file_has_7bit_weights_and_the_trt_file_full_range(ptq_run):
    # 7 bits: |q| ≤ 64, so a uint8 × int8 pair sums to ≤ 32,640 and cannot saturate the
    # 16-bit pair sums of onnxruntime's u8s8 kernels on CPUs without VNNI.
    cpu = _weights(ptq_run / "quantize" / "onnx_cpu" / "model.onnx")
    trt = _weights(ptq_run / "quantize" / "onnx_tensorrt" / "model.onnx")
    assert len(cpu) == len(trt) == 22 and all(w.dtype == np.int8 for w in cpu + trt)
    assert max(int(np.abs(w.astype(int)).max()) for w in cpu) <= WEIGHT_7BIT_MAX
    assert min(int(np.abs(w.astype(int)).max()) for w in trt) == 127  # TensorRT keeps every bit


def test_qat_weights_move_to_7_bits_within_half_a_step(ptq_run, tmp_path):
    source = ptq_run / "quantize" / "onnx_tensorrt" / "model.onnx"  # full-range symmetric int8, as QAT writes
    full, _ = int8_to_uint8_activations(onnx.load(str(source)))
    seven, halved = weights_to_7bit(full)
    assert halved == 22
    before, after = graph_constants(full.graph), graph_constants(seven.graph)
    dq = {n.output[0]: n for n in full.graph.node if n.op_type == "DequantizeLinear"}
    for node in seven.graph.node:
        if node.op_type != "DequantizeLinear" or node.input[0] not in after or after[node.input[0]].ndim < 2:
            continue
        old = dq[node.output[0]]
        q_old, s_old = before[old.input[0]].astype(np.float32), before[old.input[1]]
        q_new, s_new = after[node.input[0]].astype(np.float32), after[node.input[1]]
        shape = (-1,) + (1,) * (q_old.ndim - 1)
        assert np.abs(q_new).max() <= WEIGHT_7BIT_MAX and np.allclose(s_new, 2 * s_old)
        error = np.abs(q_new * s_new.reshape(shape) - q_old * s_old.reshape(shape))
        assert np.all(error <= s_old.reshape(shape) * (1 + 1e-4))  # at most half a new step
    path = tmp_path / "seven.onnx"
    onnx.save(seven, str(path))
    assert _optimized_ops(path, tmp_path)["QLinearConv"] == 21  # still integer convolutions
    images = np.asarray(split_arrays(load_data(DataSpec(name="digits")), "val")[0][:64])
    a = int8_measure.logits(source, images)
    b = int8_measure.logits(path, images)
    assert np.mean(a.argmax(1) == b.argmax(1)) > 0.9  # the same model, on a coarser weight grid


def test_calibration_never_touches_the_test_split(ptq_run, calibration_seen):
    data = load_data(DataSpec(name="digits"))
    calib = {row.tobytes() for row in split_arrays(data, "calib")[0]}
    test = {row.tobytes() for row in split_arrays(data, "test")[0]}
    assert calibration_seen
    for images in calibration_seen:
        rows = {row.tobytes() for row in images}
        assert rows <= calib and not rows & test


@pytest.mark.slow  # every rung, QAT included
def test_the_ladder_climbs_past_ptq_and_fallback_and_qat_recovers(tmp_path, trained_digits_run):
    # One calibration image and its 60th percentile as every activation range: PTQ clips nearly
    # everything and collapses (val drops of 81 and 87 points measured with AVX-512 and with
    # emulated AVX2 kernels), far past a 10-point red line; QAT learns the ranges back (val drops
    # -0.7 and +0.7, test +0.84 at worst). Both sides sit many images away from the line, so
    # float kernels that differ between machines cannot flip a verdict.
    path = _pipeline(tmp_path, {"calibration": {"method": "percentile", "percentile": 60.0, "samples": 1},
                                "fallback": {"max_float_layers": 1, "sensitivity_samples": 32},
                                "qat": {"epochs": 2, "batch_size": 64, "lr": 1e-4, "checkpoint_every": 0}},
                     max_drop=10.0)
    assert main(["run", path, "--run-dir", str(start_from(trained_digits_run, tmp_path / "run"))]) == 0
    metrics = json.loads((tmp_path / "run" / "manifest.json").read_text())["stages"]["quantize"]["metrics"]
    assert [r["rung"] for r in metrics["rungs"]] == ["ptq", "fallback", "qat"]
    ptq, fallback, qat = metrics["rungs"]
    drops = {rung["rung"]: [rung["flavours"][f]["drop"] for f in ("cpu", "tensorrt")] for rung in metrics["rungs"]}
    assert min(drops["ptq"]) > 40 and min(drops["fallback"]) > 40  # missed by far: four times the red line
    assert max(drops["qat"]) < 5 and max(metrics["red_line"]["test_drop"].values()) < 5  # recovered by far
    assert not ptq["within_red_line"] and not fallback["within_red_line"] and qat["within_red_line"]
    assert len(fallback["float_layers"]) == 1 and fallback["sensitivity"][0]["error"] >= fallback["sensitivity"][-1]["error"]
    assert metrics["climbed"][0].startswith("ptq: ") and metrics["climbed"][1].startswith("fallback: ")
    assert metrics["rung"] == "qat" and metrics["red_line"]["within"]
    assert qat["qat"]["engine"].startswith("torchao PT2E") and qat["tensorrt_lint"]["ok"]
    assert qat["qat"]["cpu_flavour"].endswith(", 22 weight tensors to 7 bits")
    cpu_file = tmp_path / "run" / "quantize" / "onnx_cpu" / "model.onnx"
    assert _optimized_ops(cpu_file, tmp_path)["QLinearConv"] == 21  # QAT's CPU file runs every conv in integer
    assert max(int(np.abs(w.astype(int)).max()) for w in _weights(cpu_file)) <= WEIGHT_7BIT_MAX


def test_more_calibration_samples_than_images_is_a_config_error(tmp_path, capsys, trained_digits_run):
    path = _pipeline(tmp_path, {"calibration": {"samples": 100000}}, max_drop=1.0)
    assert main(["run", path, "--run-dir", str(start_from(trained_digits_run, tmp_path / "run"))]) == 2
    assert "stages.quantize.calibration.samples" in capsys.readouterr().err


def test_the_tensorrt_files_former_names_are_read_as_todays_and_said(tmp_path, caplog):
    """One name for TensorRT's files: the quantize flavour ``trt``, its output ``onnx_trt``, the export stage's output
    ``engine`` and the manifest kind ``trt-engine`` (all before) are read as ``tensorrt``, each with a warning."""
    from compress.pipeline.manifest import ArtifactRecord

    config = copy.deepcopy(TINY)
    config["stages"] += [{"name": "quantize", "kind": "quantize", "flavours": ["cpu", "trt"]},
                         {"name": "export", "kind": "export", "formats": ["tensorrt"], "tensorrt": {"precision": "int8"},
                          "inputs": {"qdq": "quantize.onnx_trt"}},
                         {"name": "bench", "kind": "bench", "artifacts": ["quantize.onnx_cpu", "export.engine"]}]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(config))
    with caplog.at_level("WARNING"):
        pipeline = load_pipeline(path)
        refs = input_refs(pipeline)
        record = ArtifactRecord(name="export.engine", kind="trt-engine", path="export/engine", sha256="0" * 64,
                                size_bytes=1, stage="export")
    assert pipeline.stage("quantize").flavours == ["cpu", "tensorrt"]
    assert refs["export"]["qdq"] == "quantize.onnx_tensorrt" and "export.tensorrt" in refs["bench"].values()
    assert record.kind == "tensorrt"
    for said in ("quantize flavours: trt (deprecated names) read as cpu, tensorrt",
                 "stages.export.inputs.qdq: quantize.onnx_trt is a former name of quantize.onnx_tensorrt",
                 "stages.bench.artifacts: export.engine is a former name of export.tensorrt",
                 "artifact kind 'trt-engine' is a former name of 'tensorrt'"):
        assert said in caplog.text


def test_an_int8_engine_reads_the_quantize_stage_trt_file_and_no_other_export_does(tmp_path):
    config = copy.deepcopy(TINY)
    config["stages"] += [{"name": "quantize", "kind": "quantize"},
                         {"name": "export", "kind": "export", "formats": ["tensorrt"], "tensorrt": {"precision": "int8"}}]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(config))
    refs = input_refs(load_pipeline(path))
    assert refs["export"]["qdq"] == "quantize.onnx_tensorrt" and refs["quantize"]["baseline"] == "train.model"
    for formats, precision in ((["onnx"], "int8"), (["onnx", "tensorrt"], "fp16")):  # made from the model alone
        config["stages"][-1].update(formats=formats, tensorrt={"precision": precision})
        path.write_text(yaml.safe_dump(config))
        assert input_refs(load_pipeline(path))["export"] == {"model": "train.model"}
    config["stages"][-2]["flavours"] = ["cpu"]  # makes no TensorRT file: the engine's own error says what to add
    config["stages"][-1].update(formats=["tensorrt"], tensorrt={"precision": "int8"})
    path.write_text(yaml.safe_dump(config))
    assert input_refs(load_pipeline(path))["export"] == {"model": "train.model"}
    config["stages"][-2]["flavours"] = ["tensorrt"]  # makes no CPU file: a bench does not ask for one
    config["stages"].append({"name": "bench", "kind": "bench"})
    path.write_text(yaml.safe_dump(config))
    assert not any("onnx_cpu" in name for name in input_refs(load_pipeline(path))["bench"].values())
    config["stages"][-3]["flavours"] = ["cpu", "tensorrt"]
    path.write_text(yaml.safe_dump(config))
    assert "quantize.onnx_cpu" in input_refs(load_pipeline(path))["bench"].values()


def test_an_fp32_export_beside_a_cpu_only_quantize_stage_is_made_from_the_model_alone(tmp_path, capsys):
    """It once read quantize's TensorRT file by default: missing with flavours [cpu], a re-export after any
    re-quantization where present."""
    config = copy.deepcopy(TINY)
    config["stages"] += [{"name": "quantize", "kind": "quantize", "flavours": ["cpu"],  # the ladder is not the point
                          "calibration": {"method": "minmax", "samples": 64}, "fallback": {"enabled": False},
                          "qat": {"enabled": False}},
                         {"name": "export", "kind": "export", "formats": ["onnx"], "parity": {"samples": 32}}]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(config))
    run_dir = tmp_path / "run"
    assert main(["run", str(path), "--run-dir", str(run_dir)]) == 0
    export = json.loads((run_dir / "manifest.json").read_text())["stages"]["export"]
    assert list(export["key_material"]["inputs"]) == ["model"]
    capsys.readouterr()
    assert main(["run", str(path), "--run-dir", str(run_dir), "stages.quantize.calibration.samples=32"]) == 0
    stages = json.loads((run_dir / "manifest.json").read_text())["stages"]
    assert stages["quantize"]["started"] > export["started"] and stages["export"]["started"] == export["started"]


def test_int8_engine_without_a_qdq_file_is_refused(tmp_path, capsys):
    config = copy.deepcopy(TINY)
    config["stages"] += [{"name": "export", "kind": "export", "tensorrt": {"precision": "int8"},
                          "formats": ["onnx", "tensorrt"]}]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(config))
    # A config error with or without TensorRT on the machine: the pipeline itself is wrong.
    assert main(["run", str(path), "--run-dir", str(tmp_path / "run")]) == 2
    assert "stages.export.tensorrt.precision: int8 needs a Q/DQ ONNX" in capsys.readouterr().err


class _SharedReLU(torch.nn.Module):
    """Like torchvision's BasicBlock: one ReLU module called twice."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.BatchNorm2d(4)
        self.conv2, self.bn2 = torch.nn.Conv2d(4, 4, 3, padding=1), torch.nn.BatchNorm2d(4)
        self.relu = torch.nn.ReLU()
        self.conv3 = torch.nn.Conv2d(4, 4, 1)
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)) + y)
        return self.fc(self.conv3(y).mean((2, 3)))


def test_qat_captures_a_model_that_reuses_one_relu_and_exports_clean_qdq(tmp_path):
    sample = torch.randn(2, 1, 8, 8)
    prepared = qat_pt2e.prepare(_SharedReLU().eval(), sample)
    qat_pt2e.observe(prepared, torch.randn(8, 1, 8, 8))
    prepared.train()
    prepared(torch.randn(4, 1, 8, 8)).sum().backward()
    export_onnx(qat_pt2e.convert(prepared), sample, tmp_path / "qat.onnx", captured=True)
    assert lint_qdq(tmp_path / "qat.onnx").ok
    cpu, _ = int8_to_uint8_activations(onnx.load(str(tmp_path / "qat.onnx")))
    onnx.save(cpu, str(tmp_path / "cpu.onnx"))
    ops = _optimized_ops(tmp_path / "cpu.onnx", tmp_path)
    # Both block convs and the residual add run in integer; conv3 feeds an unquantized mean.
    assert ops["QLinearConv"] == 2 and ops["QLinearAdd"] == 1, ops


class _Batches:
    def __init__(self, batches):
        self.batches = batches

    def epoch(self, epoch, start=0):
        return iter(self.batches)


def _ranges(prepared) -> dict:
    return {k: v.clone() for k, v in prepared.state_dict().items()
            if "activation_post_process" in k and k.endswith(("scale", "min_val", "max_val"))}


def test_evaluating_a_qat_model_leaves_its_ranges_alone():
    from train.evaluate import evaluate

    torch.manual_seed(0)
    sample = torch.randn(2, 1, 8, 8)
    prepared = qat_pt2e.prepare(_SharedReLU().eval(), sample)
    qat_pt2e.observe(prepared, torch.randn(16, 1, 8, 8))
    before = _ranges(prepared)
    judged = _Batches([(torch.randn(32, 1, 8, 8) * 20, torch.randint(0, 3, (32,))) for _ in range(4)])
    with qat_pt2e.observers_paused(prepared):
        evaluate(prepared, judged)
    after = _ranges(prepared)
    assert before and all(torch.equal(before[k], after[k]) for k in before)
    evaluate(prepared, judged)  # observers back on: the same pass now moves the ranges (the old behaviour)
    moved = _ranges(prepared)
    assert any(not torch.allclose(before[k], moved[k]) for k in before if k.endswith("max_val"))
    qat_pt2e.freeze_ranges(prepared)
    with qat_pt2e.observers_paused(prepared):
        pass
    assert not any(bool(q.observer_enabled[0]) for q in qat_pt2e._fake_quantizers(prepared))  # frozen stays frozen


def test_the_loop_wraps_every_validation_pass_in_the_evaluation_hook():
    import contextlib

    from train.data import BatchStream, DataSpec, load_data
    from train.loop import Hooks, LoopSettings, fit
    from train.models import build_model
    from train.optim import lr_factor, make_optimizer, make_scheduler
    from train.precision import make_precision

    digits = load_data(DataSpec(name="digits"))
    train = BatchStream(digits.train.__class__(digits.train.images[:128], digits.train.labels[:128]), digits, 64,
                        shuffle=False, drop_last=True)
    val = BatchStream(digits.val, digits, 256, shuffle=False, drop_last=False)
    model = build_model("resnet20", 10, 1, {"width": 4})
    entered = []

    @contextlib.contextmanager
    def evaluation():
        entered.append(model.training)
        yield

    optimizer = make_optimizer(model, "sgd", 0.01, 0.0)
    fit(model, train, val, optimizer, make_scheduler(optimizer, lr_factor("constant", 6)),
        make_precision("off", torch.device("cpu")), LoopSettings(epochs=3, heartbeat_s=1e9),
        Hooks(evaluation=evaluation))
    assert len(entered) == 3


def _entry(name, precision, p50, p99, source="prune.model", fmt="onnx", **extra):
    return {"name": name, "precision": precision, "format": fmt, "runtime": "onnxruntime", "source_model": source,
            "accuracy_drop": 0.1, "latency_ms": {"p50": p50, "p99": p99}, **extra}


def test_an_int8_file_slower_than_its_fp32_onnx_is_flagged():
    entries = [_entry("export.onnx", "fp32", 1.0, 2.0), _entry("quantize.onnx_cpu", "int8", 1.2, 1.5),
               _entry("other.onnx_cpu", "int8", 0.5, 0.9, source="train.model")]
    flags = quantized_not_faster(as_entries(entries))
    assert len(flags) == 1 and flags[0].startswith("quantize.onnx_cpu (int8) is not faster than export.onnx")
    assert quantized_not_faster(as_entries([_entry("export.onnx", "fp32", 1.0, 2.0), _entry("q", "int8", 0.4, 0.8)])) == []
    # two runs side by side (compare, a search's final bench): the same model name is another model in each
    two_runs = [_entry("a:export.onnx", "fp32", 0.4, 0.8, run="runs/a"), _entry("b:q", "int8", 1.2, 1.5, run="runs/b")]
    assert quantized_not_faster(as_entries(two_runs)) == []
    one_run = [_entry("a:export.onnx", "fp32", 0.4, 0.8, run="runs/a"), _entry("a:q", "int8", 1.2, 1.5, run="runs/a")]
    assert quantized_not_faster(as_entries(one_run))[0].startswith("a:q (int8) is not faster than a:export.onnx")


def test_the_flag_says_whether_the_instruction_set_explains_a_slow_int8_file():
    entries = [_entry("export.onnx", "fp32", 1.0, 2.0), _entry("quantize.onnx_cpu", "int8", 0.8, 2.5)]
    avx2 = quantized_not_faster(as_entries(entries), {"int8_dot_product": "AVX2 (no VNNI)"})[0]
    assert "multiplies int8 with AVX2 (no VNNI)" in avx2 and "on a CPU with VNNI the same file is faster" in avx2
    vnni = quantized_not_faster(as_entries(entries), {"int8_dot_product": "AVX-512 VNNI"})[0]
    assert "has AVX-512 VNNI, so the int8 kernels are not the cause" in vnni
    assert "not recorded" in quantized_not_faster(as_entries(entries))[0]


def _refusal(meta: dict, runtime: str) -> str | None:
    return ShippedFile.model_validate(meta).refusal(runtime)


def test_the_gate_refuses_an_int8_file_that_missed_the_red_line():
    reason = _refusal({"red_line": {"within": False, "test_drop": {"onnxruntime": 3.2}}}, "onnxruntime")
    assert reason and "no rung within the red line" in reason
    assert _refusal({"red_line": {"within": True, "test_drop": {"onnxruntime": 0.2}}}, "onnxruntime") is None
    entries = [_entry("train.model", "fp32", 5.0, 6.0, fmt="torch"), _entry("q", "int8", 0.5, 0.6, refused=reason)]
    gate = evaluate(as_entries(entries), Limits(max_drop=1.0, p99_budget_ms=None))
    assert gate["release"] == "train.model" and any(r.startswith("q: the quantize stage") for r in gate["reasons"])


def _tiny_quantize_run(tmp_path, quantize: dict, max_drop: float, *extra_stages: dict,
                       **red_line) -> tuple[int, dict]:
    config = copy.deepcopy(TINY)
    config["red_line"] = {"metric": "top1", "max_drop": max_drop, **red_line}
    config["stages"] += [{"name": "quantize", "kind": "quantize", "fallback": {"enabled": False},
                          "qat": {"enabled": False}, **quantize}, *extra_stages]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(config))
    code = main(["run", str(path), "--run-dir", str(tmp_path / "run")])
    return code, json.loads((tmp_path / "run" / "manifest.json").read_text())


def test_no_rung_within_the_red_line_still_ships_the_closest_and_the_gate_refuses_it(tmp_path, monkeypatch):
    from compress.stages import quantize_stage
    from tests.test_bench_stage import FAST_BENCH

    # A reference no quantized file can come near: every rung misses the red line (by so much that the collapse
    # guard would stop the stage: off here, this test is about the closest rung shipped and refused)
    monkeypatch.setattr(quantize_stage, "reference_accuracy", lambda *a: {"top1": 100.0, "top5": 100.0, "n": 1})
    code, manifest = _tiny_quantize_run(tmp_path, {}, 0.5, dict(FAST_BENCH), collapse_margin=None)
    assert code == 0  # the gate releases the baseline instead
    quantize = manifest["stages"]["quantize"]
    assert quantize["status"] == "completed" and not quantize["metrics"]["red_line"]["within"]
    assert manifest["artifacts"]["quantize.onnx_cpu"]["meta"]["red_line"]["within"] is False
    report = json.loads((tmp_path / "run" / "bench" / "report" / "report.json").read_text())
    entry = next(a for a in report["artifacts"] if a["name"] == "quantize.onnx_cpu")
    assert points_outside_intervals(report) == []  # INT8-vs-fp32 ratios included
    assert "no rung within the red line" in entry["refused"] and report["gate"]["release"] != "quantize.onnx_cpu"
    assert any(r.startswith("quantize.onnx_cpu: the quantize stage found no rung") for r in report["gate"]["reasons"])


def test_a_trt_file_that_fails_the_lint_is_left_out_and_the_rest_of_the_run_goes_on(tmp_path, monkeypatch):
    from compress.quantization.qdq_lint import LintResult
    from compress.stages import quantize_stage

    monkeypatch.setattr(quantize_stage, "lint_qdq", lambda *a, **k: LintResult(violations=["Conv x: input not quantized"]))
    engine = {"name": "export", "kind": "export", "formats": ["onnx", "tensorrt"], "tensorrt": {"precision": "int8"},
              "parity": {"samples": 32}}
    code, manifest = _tiny_quantize_run(tmp_path, {}, 100.0, engine)
    assert code == 0  # no TensorRT here: the engine is skipped, not failed for want of the file left out
    quantize = manifest["stages"]["quantize"]["metrics"]
    assert "quantize.onnx_cpu" in manifest["artifacts"] and "quantize.onnx_tensorrt" not in manifest["artifacts"]
    assert quantize["left_out"]["tensorrt"].startswith("the TensorRT Q/DQ file of rung ptq fails the lint (1 violation: "
                                                  "Conv x: input not quantized)")
    assert "skipped" in quantize["onnx_tensorrt"] and "skipped" in manifest["stages"]["export"]["metrics"]["tensorrt"]


def test_an_int8_engine_from_a_trt_file_left_out_fails_naming_why(tmp_path, monkeypatch, capsys):
    from compress.quantization.qdq_lint import LintResult
    from compress.stages import export_stage, quantize_stage

    monkeypatch.setattr(quantize_stage, "lint_qdq", lambda *a, **k: LintResult(violations=["Gemm g: weight not quantized"]))
    monkeypatch.setattr(export_stage, "unavailable_reason", lambda: None)  # TensorRT "present"
    code, manifest = _tiny_quantize_run(tmp_path, {}, 100.0, {"name": "export", "kind": "export", "formats": ["tensorrt"],
                                                              "tensorrt": {"precision": "int8"}})
    assert code == 3 and manifest["stages"]["quantize"]["status"] == "completed"
    assert "no INT8 engine: quantize left quantize.onnx_tensorrt out: the TensorRT Q/DQ file" in capsys.readouterr().err


def test_a_lint_violation_fails_the_stage_when_the_trt_file_is_all_it_ships(tmp_path, monkeypatch, capsys):
    from compress.quantization.qdq_lint import LintResult
    from compress.stages import quantize_stage

    monkeypatch.setattr(quantize_stage, "lint_qdq", lambda *a, **k: LintResult(violations=["Conv x: input not quantized"]))
    code, manifest = _tiny_quantize_run(tmp_path, {"flavours": ["tensorrt"]}, 100.0)
    assert code == 3 and "fails the lint (1 violation: Conv x: input not quantized); add cpu" in capsys.readouterr().err
    assert "quantize.onnx_tensorrt" not in manifest["artifacts"]  # nothing registered from a failed stage


class _TimmShapedTail(torch.nn.Module):
    """The layers the x86 quantizer missed by their exact type: timm's ``Conv2dSame`` (stride-2 convolutions of the
    ``tf_*`` ports) before a depthwise ReLU6 block, and MobileNetV3's head: 1×1 conv, hard-swish, flatten, then
    timm's ``Linear`` (a subclass of ``nn.Linear``)."""

    def __init__(self) -> None:
        super().__init__()
        from timm.layers import Conv2dSame, Linear

        self.stem, self.bn = Conv2dSame(1, 8, 3, stride=2), torch.nn.BatchNorm2d(8)
        self.dw, self.bn_dw = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8), torch.nn.BatchNorm2d(8)
        self.act = torch.nn.ReLU6()
        self.pool, self.conv_head, self.hswish = torch.nn.AdaptiveAvgPool2d(1), torch.nn.Conv2d(8, 16, 1), torch.nn.Hardswish()
        self.flatten, self.classifier = torch.nn.Flatten(1), Linear(16, 3)

    def forward(self, x):
        y = self.act(self.bn_dw(self.dw(self.act(self.bn(self.stem(x))))))
        return self.classifier(self.flatten(self.hswish(self.conv_head(self.pool(y)))))


def test_qat_fake_quantizes_subclassed_conv_and_linear_layers():
    prepared = qat_pt2e.prepare(_TimmShapedTail().eval(), torch.randn(2, 1, 12, 12))
    layers = [n for n in prepared.graph.nodes if n.target in (torch.ops.aten.conv2d.default, torch.ops.aten.linear.default)]
    assert len(layers) == 4
    for layer in layers:  # input and weight of every layer through a fake-quantizer (before: Conv2dSame's and Linear's not)
        assert all(a.op == "call_module" and a.target.startswith("activation_post_process") for a in layer.args[:2]), layer


@pytest.mark.slow  # convert_pt2e alone takes ~11 s
def test_qat_of_timm_shaped_layers_writes_a_trt_file_that_passes_the_lint(tmp_path):
    sample = torch.randn(2, 1, 12, 12)
    prepared = qat_pt2e.prepare(_TimmShapedTail().eval(), sample)
    qat_pt2e.observe(prepared, torch.randn(8, 1, 12, 12))
    export_onnx(qat_pt2e.convert(prepared), sample, tmp_path / "qat.onnx", captured=True)
    lint = lint_qdq(tmp_path / "qat.onnx")
    assert lint.ok, lint.violations  # before: "Conv …: input and weight not quantized", "Gemm …: weight not quantized"
    ops = Counter(n.op_type for n in onnx.load(str(tmp_path / "qat.onnx")).graph.node)
    assert ops["Conv"] == 3 and ops["Gemm"] + ops["MatMul"] == 1 and ops["BatchNormalization"] == 0  # both BNs folded


def test_a_model_qat_cannot_capture_keeps_the_earlier_rung_marked_over_the_red_line(tmp_path, monkeypatch):
    from compress.stages import qat_rung
    from compress.stages import quantize_stage

    def refuse(*_):
        raise qat_pt2e.QATUnavailable("torch.export could not capture the model: data-dependent control flow")

    monkeypatch.setattr(quantize_stage, "reference_accuracy", lambda *a: {"top1": 100.0, "top5": 100.0, "n": 1})
    monkeypatch.setattr(qat_rung, "prepare", refuse)
    code, manifest = _tiny_quantize_run(tmp_path, {"qat": {"enabled": True}}, 0.5, collapse_margin=None)
    assert code == 0
    metrics = manifest["stages"]["quantize"]["metrics"]
    assert metrics["rung"] == "ptq" and not metrics["red_line"]["within"]
    assert metrics["climbed"][-1] == "qat: could not run: torch.export could not capture the model: data-dependent control flow"


def test_the_int8_engine_is_built_from_the_trt_flavour_file(tmp_path, monkeypatch):
    from compress.stages import export_stage

    built = {}

    def fake_build(onnx_file, folder, settings, input_name, chw):
        built.update(onnx=onnx_file, precision=settings.precision)
        (folder / "model.engine").write_bytes(b"stand-in")
        return {"tensorrt_version": "test", "gpu_name": "none", "layers": {"INT8": 1}, "float_compute_layers": [],
                "precision": settings.precision}

    monkeypatch.setattr(export_stage, "unavailable_reason", lambda: None)  # TensorRT "present"
    monkeypatch.setattr(export_stage, "build_engine", fake_build)
    code, _ = _tiny_quantize_run(tmp_path, {}, 100.0, {"name": "export", "kind": "export", "formats": ["tensorrt"],
                                                       "tensorrt": {"precision": "int8"}})
    assert code == 0 and built["precision"] == "int8"
    assert built["onnx"] == tmp_path / "run" / "quantize" / "onnx_tensorrt" / "model.onnx"


def test_the_int8_flag_reads_the_block_paired_ratio_interval():
    def ratio(lo, hi, verdict):
        return {"ratio": (lo + hi) / 2, "ci": [lo, hi], "rounds": 12, "verdict": verdict}

    fp32 = _entry("export.onnx", "fp32", 1.0, 2.0)
    faster = _entry("q", "int8", 1.0, 2.0, int8_vs_fp32={"reference": "export.onnx", "p50": ratio(0.5, 0.7, "faster"),
                                                            "p99": ratio(0.6, 0.9, "faster")})
    assert quantized_not_faster(as_entries([fp32, faster])) == []  # the interval decides, not the (equal) point estimates
    unclear = _entry("q", "int8", 0.5, 1.0, int8_vs_fp32={"reference": "export.onnx",
                                                          "p50": ratio(0.5, 0.7, "faster"),
                                                          "p99": ratio(0.8, 1.2, "not distinguishable")})
    flag = quantized_not_faster(as_entries([fp32, unclear]))[0]
    assert flag.startswith("q (int8) is not shown faster than export.onnx (fp32)")
    assert "p99 ×1.00 (95% CI 0.80–1.20): not distinguishable" in flag
    slower = _entry("q", "int8", 0.5, 1.0, int8_vs_fp32={"reference": "export.onnx", "p50": ratio(1.1, 1.3, "slower"),
                                                         "p99": ratio(0.8, 1.2, "not distinguishable")})
    assert quantized_not_faster(as_entries([fp32, slower]))[0].startswith("q (int8) is slower than export.onnx")


def test_depthwise_convolutions_get_one_weight_scale_per_channel_in_both_flavours(tmp_path):
    """A depthwise convolution has one filter per channel, whose ranges differ by orders of magnitude after
    BatchNorm folding; one scale for all would round the small ones to zero. Both flavours quantize every
    convolution's weights per output channel (axis 0), the depthwise one included, and the CPU file runs."""
    from compress.quantization.ptq import Calibration, quantize

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU6(),
        torch.nn.Conv2d(16, 16, 3, padding=1, groups=16), torch.nn.BatchNorm2d(16), torch.nn.Hardswish(),
        torch.nn.Conv2d(16, 24, 1), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(24, 10)).eval()
    with torch.no_grad():  # per-channel ranges a thousandfold apart in the depthwise layer
        model[3].weight.mul_(torch.logspace(-2, 1, 16).view(16, 1, 1, 1))
    float_file = tmp_path / "dw.onnx"
    export_onnx(model, torch.zeros(1, 3, 16, 16), float_file)
    images = np.random.default_rng(0).standard_normal((32, 3, 16, 16)).astype(np.float32)
    for flavour in ("cpu", "tensorrt"):
        out = quantize(float_file, tmp_path / f"dw_{flavour}.onnx", flavour, Calibration(method="minmax"), images,
                       tmp_path / f"cache_{flavour}")
        graph = onnx.load(str(out)).graph
        constants = {i.name: onnx.numpy_helper.to_array(i) for i in graph.initializer}
        produced = {o: n for n in graph.node for o in n.output}
        convs = [n for n in graph.node if n.op_type == "Conv"]
        assert len(convs) == 3
        for conv in convs:
            dequant = produced[conv.input[1]]
            assert dequant.op_type == "DequantizeLinear"
            axis = next((a.i for a in dequant.attribute if a.name == "axis"), 1)
            scale = constants[dequant.input[1]]
            out_channels = constants[dequant.input[0]].shape[0]
            assert scale.shape == (out_channels,) and axis == 0, conv.name
        depthwise = next(c for c in convs if any(a.name == "group" and a.i == 16 for a in c.attribute))
        scales = constants[produced[depthwise.input[1]].input[1]]
        assert scales.max() / scales.min() > 100  # one scale per filter, following its range
    session = ort.InferenceSession(str(tmp_path / "dw_cpu.onnx"), providers=["CPUExecutionProvider"])
    assert session.run(None, {session.get_inputs()[0].name: images[:4]})[0].shape == (4, 10)


def test_a_file_made_for_openvino_is_measured_and_judged_there_only(tmp_path):
    from types import SimpleNamespace

    from compress.stages.base import InputArtifact
    from compress.stages.measurement import candidates_of
    from serve_bench.runners.openvino_runner import OpenVinoSettings

    folder = tmp_path / "onnx_openvino"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"")
    meta = {"file": "model.onnx", "precision": "int8", "runtimes": ["openvino"],
            "red_line": {"within": True, "test_drop": {"openvino": 0.4}}}
    cfg = SimpleNamespace(runtimes=["onnxruntime", "openvino"], device="cpu", name="bench", openvino=OpenVinoSettings(),
                          torch_compile=False, inter_op_threads=1)
    artifact = InputArtifact("quantize.onnx_openvino", "onnx", folder, meta)
    specs = candidates_of(artifact, cfg)
    assert [(s.name, s.runtime, s.refused) for s in specs] == [("quantize.onnx_openvino", "openvino", None)]
    assert candidates_of(artifact, SimpleNamespace(**{**vars(cfg), "runtimes": ["onnxruntime"]})) == []
    assert _refusal(meta, "openvino") is None and "checked its red line on openvino only" in _refusal(meta, "onnxruntime")


def test_the_openvino_flavour_is_left_out_with_its_reason_unless_asked_for_by_name(monkeypatch):
    from compress.errors import ConfigError
    from compress.stages import int8_flavours

    monkeypatch.setattr(int8_flavours, "cpu_check_plan", lambda *a: {"runtimes": [], "versions": {}, "serve_batch": 1,
                                                                     "threads": None, "options": {}})
    plan = int8_flavours.flavour_plan(["cpu", "tensorrt", "openvino"], False, None, [], 1, "stages.quantize")
    assert plan["flavours"] == ["cpu", "tensorrt"] and "not among the runtimes the bench measures" in plan["left_out"]["openvino"]
    with pytest.raises(ConfigError, match=r"stages\.quantize\.flavours: openvino cannot be made here: OpenVINO is not"):
        int8_flavours.flavour_plan(["cpu", "openvino"], True, None, [], 1, "stages.quantize")
    monkeypatch.setattr(int8_flavours, "cpu_check_plan", lambda *a: {"runtimes": ["openvino"], "versions": {},
                                                                     "serve_batch": 1, "threads": None, "options": {}})
    monkeypatch.setattr(int8_flavours, "nncf_version", lambda: "3.4")
    plan = int8_flavours.flavour_plan(["cpu", "openvino"], False, None, [], 1, "stages.quantize")
    # NNCF's file ships on OpenVINO, so the CPU file is no longer checked (nor released) there
    assert plan["flavours"] == ["cpu", "openvino"] and plan["runtimes"] == [] and plan["nncf"] == "3.4"
    assert int8_flavours.ships_on("cpu", plan["runtimes"]) == ["onnxruntime"]
    assert int8_flavours.flavour_plan(["cpu"], True, None, [], 1, "q")["runtimes"] == ["openvino"]
