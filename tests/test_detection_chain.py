"""task: detection through the chain: train (detection loss, mAP validation), quantize with the decode tail in
float (and what happens without it), export with box/score parity, bench with mAP intervals and requests timed
through NMS; a COCO folder written by hand trains one epoch and benches."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml

from compress.cli import main
from compress.quantization.detection_int8 import file_map, tail_nodes
from compress.quantization.ptq import Calibration, preprocess, quantize
from export.onnx_export import export_onnx
from serve_bench.report_model import Report
from tests.report_invariants import untyped_keys
from tests.test_detection_data import hand_written_folder

BENCH = {"name": "bench", "kind": "bench", "min_iters": 200, "min_samples": 200, "min_duration_s": 0.3,
         "warmup_iters": 5, "block_iters": 50, "threads": 1, "profile_iters": 0, "runtimes": ["onnxruntime"]}


def _pipeline(folder, data: dict, stages: list[dict], name="p.yaml"):
    config = {"name": "det", "task": "detection", "seed": 0, "threads": 2, "data": data,
              "model": {"name": "tiny_fcos", "args": {"width": 16}}, "red_line": {"metric": "map", "max_drop": 3.0},
              "gate": {"decision": "point"}, "latency": {"batch_size": 1}, "stages": stages}
    path = folder / name
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def shapes_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("det")
    data = {"name": "shapes", "synthetic_samples": 360, "image_size": 96, "cache_dir": str(folder / "cache"),
            "test_fraction": 0.25, "calib_size": 64}
    stages = [{"name": "train", "kind": "train", "epochs": 14, "batch_size": 16, "lr": 4e-3, "eval_batch_size": 64},
              {"name": "prune", "kind": "prune", "deployed_latency": {"enabled": False}, "sparsity": {"epochs": 1, "batch_size": 16},
               "target": {"macs": 0.5},
               "finetune": {"epochs": 3, "batch_size": 16, "lr": 2e-3, "distill": {"teacher": "train"}}},
              {"name": "quantize", "kind": "quantize", "flavours": ["cpu"],
               "calibration": {"method": "minmax", "samples": 64}, "runtimes": ["onnxruntime"]},
              {"name": "export", "kind": "export", "formats": ["onnx"], "parity": {"batch_sizes": [1, 8]}}, BENCH]
    run_dir = folder / "run"
    assert main(["run", str(_pipeline(folder, data, stages)), "--run-dir", str(run_dir)]) in (0, 1)
    return run_dir


def _manifest(run_dir):
    return json.loads((run_dir / "manifest.json").read_text())


@pytest.mark.slow  # trains, prunes, quantizes and benches a detector: 2 min
def test_the_chain_trains_a_detector_keeps_its_tail_float_and_benches_map_with_intervals(shapes_run):
    stages = _manifest(shapes_run)["stages"]
    trained = stages["train"]["metrics"]
    assert trained["test_map"] > 15 and trained["test_map50"] > 35  # chance is ~0 for boxes
    pruned = stages["prune"]["metrics"]
    assert pruned["macs_fraction"] <= 0.5 and pruned["test_map"] > 5
    curves = json.loads((shapes_run / "prune" / "report" / "history.json").read_text())
    finetune = [row for row in curves if "finetune.train_loss" in row]
    assert len(finetune) == 3  # the finetune distilled from the trained detector, every epoch
    assert all(row["finetune.train_kd_cls"] > 0 and row["finetune.train_feature"] >= 0 for row in finetune)
    ladder = json.loads((shapes_run / "quantize" / "report" / "ladder.json").read_text())
    assert len(ladder["float_tail"]) >= 8  # softplus, sigmoid, the grid arithmetic, the concatenations
    assert "export" in stages and stages["export"]["status"] == "completed"
    report = json.loads((shapes_run / "bench" / "report" / "report.json").read_text())
    assert report["metric"] == "map"
    by_name = {a["name"]: a for a in report["artifacts"]}
    assert set(by_name) == {"train.model", "prune.model", "quantize.onnx_cpu", "export.onnx"}
    for entry in by_name.values():
        lo, hi = entry["accuracy_ci"]["map"]
        assert lo <= entry["accuracy"]["map"] <= hi and hi - lo > 0
        assert entry["postprocess_ms"]["p99"] > 0
    # the pruned weights through onnxruntime: the same boxes, so the same mAP
    # the exported file answers as the model it was made from (the pruned one, or the trained one where the chain
    # fell back because the pruned detector was past the red line on validation)
    source = by_name["export.onnx"]["source_model"]
    assert abs(by_name["export.onnx"]["accuracy"]["map"] - by_name[source]["accuracy"]["map"]) < 0.05
    int8 = by_name["quantize.onnx_cpu"]["accuracy_paired"]
    assert int8["method"] == "paired-bootstrap" and int8["drop_ci"][0] <= int8["drop"] <= int8["drop_ci"][1]
    assert report["gate"]["decided_on"]


@pytest.mark.slow  # trains, prunes, quantizes and benches a detector: 2 min
def test_the_decode_tail_inside_int8_rounds_the_scores_and_loses_map(shapes_run, tmp_path):
    from train.model_io import load_model
    from compress.stages.int8_records import split_arrays
    from compress.pipeline.pipeline_data import load_section
    from compress.config import DataConfig

    model, description = load_model(shapes_run / "train" / "model")
    data = load_section(DataConfig.model_validate(
        {"name": "shapes", "synthetic_samples": 360, "image_size": 96, "test_fraction": 0.25, "calib_size": 64,
         "cache_dir": str(shapes_run.parent / "cache")}), "test")
    calib, _ = split_arrays(data, "calib")
    images, rows = split_arrays(data, "test")
    targets = data.boxes_of(torch.from_numpy(rows))
    export_onnx(model, torch.from_numpy(images[:2]), tmp_path / "f.onnx")
    float_onnx = preprocess(tmp_path / "f.onnx", tmp_path / "f.prep.onnx")
    tail = tail_nodes(float_onnx, model.head_convs)
    files = {name: quantize(float_onnx, tmp_path / f"{name}.onnx", "cpu", Calibration(method="minmax"), calib,
                            tmp_path / "cache.json", exclude=exclude, reduce_range=True)
             for name, exclude in (("tail-int8", []), ("tail-float", tail))}
    reference = file_map(float_onnx, images, targets, 3)["map"]
    print("tail test: float", reference)
    scores = {}
    for name, path in files.items():
        from compress.quantization.measure import logits

        out = logits(path, images, 64)
        scores[name] = (file_map(path, images, targets, 3)["map"], np.unique(np.round(out[..., 4:], 5)).size)
    print("tail test:", scores)
    # one scale for pixels (0..64) and probabilities: a step of ~0.3, so a handful of score values survive
    assert scores["tail-int8"][1] <= 8 < 100 < scores["tail-float"][1]
    assert reference - scores["tail-float"][0] < 2.0
    assert (reference - scores["tail-int8"][0]) > (reference - scores["tail-float"][0]) + 3.0


def test_a_coco_folder_written_by_hand_trains_one_epoch_and_benches(tmp_path):
    folder = hand_written_folder(tmp_path / "coco", n=40)
    data = {"name": "coco", "path": str(folder), "image_size": 64, "test_fraction": 0.25, "val_fraction": 0.15}
    stages = [{"name": "train", "kind": "train", "epochs": 1, "batch_size": 8},
              {"name": "export", "kind": "export", "formats": ["onnx"], "parity": {"batch_sizes": [1, 2]}}, BENCH]
    run_dir = tmp_path / "run"
    assert main(["run", str(_pipeline(tmp_path, data, stages)), "--run-dir", str(run_dir)]) in (0, 1)
    manifest = _manifest(run_dir)
    assert manifest["data"]["name"] == "coco" and manifest["data"]["sizes"]["test"] == 10
    report = json.loads((run_dir / "bench" / "report" / "report.json").read_text())
    names = {a["name"] for a in report["artifacts"]}
    assert names == {"train.model", "export.onnx"}
    assert untyped_keys(Report, report) == []  # a detector's figures (mAP, its bootstrap, the NMS) are all typed
    meta = json.loads((run_dir / "manifest.json").read_text())["artifacts"]["export.onnx"]
    import onnx

    props = {p.key: p.value for p in onnx.load(str(run_dir / meta["path"] / "model.onnx")).metadata_props}
    pre = json.loads(props["compress.preprocessing"])
    assert pre["resize"] == "letterbox" and pre["pad_value"] == 114 and pre["classes"] == ["square", "disc"]


@pytest.mark.slow  # trains, prunes, quantizes and benches a detector: 2 min
def test_a_detection_release_carries_map_with_its_bootstrap_interval_and_the_nms(shapes_run, tmp_path):
    from compress.errors import ConfigError
    from compress.pipeline.compare import load_runs

    bundle = tmp_path / "bundle"
    assert main(["release", str(shapes_run), "--to", str(bundle), "--anyway"]) == 0
    card = json.loads((bundle / "model_card.json").read_text())
    acc = card["accuracy"]
    assert acc["metric"] == "map" and acc["interval"] == "bootstrap" and acc["nms"]["iou_threshold"] == 0.5
    assert acc["map_ci"][0] <= acc["map"] <= acc["map_ci"][1]
    text = (bundle / "MODEL_CARD.md").read_text()
    assert "bootstrap percentile interval" in text and "N×A×(4+C)" in text and "Wilson" not in text
    assert main(["verify", str(bundle)]) == 0
    assert main(["verify", str(bundle), str(tmp_path)]) == 2  # mAP is not reproduced from a class-per-folder set
    with pytest.raises(ConfigError, match="a detection run cannot be compared yet"):
        load_runs([shapes_run], None)
