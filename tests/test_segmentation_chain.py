"""task: segmentation through the chain on generated scenes: train (pixel loss, mIoU validation), prune with the
class convolution whole and a pixel-distilled finetune, INT8 judged on val mIoU, export with pixel parity, and a
bench whose every file has mIoU with image-bootstrap intervals, a paired drop and IoU per class."""
from __future__ import annotations

import json

import pytest
import yaml

from compress.cli import main
from serve_bench.report_model import Report
from tests.report_invariants import untyped_keys

BENCH = {"name": "bench", "kind": "bench", "min_iters": 200, "min_samples": 200, "min_duration_s": 0.3,
         "warmup_iters": 5, "block_iters": 50, "threads": 1, "profile_iters": 0, "runtimes": ["onnxruntime"],
         "export_alone": False}


@pytest.fixture(scope="module")
def scenes_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("seg")
    config = {"name": "seg", "task": "segmentation", "seed": 0, "threads": 2,
              "data": {"name": "scenes", "synthetic_samples": 320, "image_size": 64, "cache_dir": str(folder / "cache"),
                       "test_fraction": 0.25, "calib_size": 64},
              "model": {"name": "tiny_segmenter", "args": {"width": 16}},
              "red_line": {"metric": "miou", "max_drop": 3.0}, "gate": {"decision": "point"},
              "latency": {"batch_size": 1},
              "stages": [
                  {"name": "train", "kind": "train", "epochs": 24, "batch_size": 16, "lr": 5e-3, "eval_batch_size": 64},
                  {"name": "prune", "kind": "prune", "deployed_latency": {"enabled": False},
                   "sparsity": {"epochs": 2, "batch_size": 16, "l1": 3e-4}, "target": {"macs": 0.7},
                   "finetune": {"epochs": 6, "batch_size": 16, "lr": 3e-3,
                                "distill": {"teacher": "train", "temperature": 2.0}}},
                  {"name": "quantize", "kind": "quantize", "flavours": ["cpu"],
                   "calibration": {"method": "minmax", "samples": 64}, "runtimes": ["onnxruntime"]},
                  {"name": "export", "kind": "export", "formats": ["onnx"], "parity": {"batch_sizes": [1, 8]}},
                  BENCH]}
    path = folder / "seg.yaml"
    path.write_text(yaml.safe_dump(config))
    run_dir = folder / "run"
    assert main(["run", str(path), "--run-dir", str(run_dir)]) in (0, 1)
    return run_dir


@pytest.mark.slow  # trains, prunes, quantizes and benches a segmenter: about 2 min on 2 cores
def test_the_chain_trains_prunes_quantizes_and_benches_a_segmenter_with_paired_miou(scenes_run):
    stages = json.loads((scenes_run / "manifest.json").read_text())["stages"]
    trained = stages["train"]["metrics"]
    # 4 classes with background at ~55% of pixels: answering background everywhere scores mIoU ≈ 14
    assert trained["test_miou"] > 45 and trained["best_val_miou"] > 45
    pruned = stages["prune"]["metrics"]
    assert pruned["macs_fraction"] <= 0.75
    curves = json.loads((scenes_run / "prune" / "report" / "history.json").read_text())
    finetune = [row for row in curves if "finetune.train_loss" in row]
    assert len(finetune) == 6 and all(row["finetune.train_kd"] > 0 for row in finetune)  # distilled per pixel
    assert stages["export"]["status"] == "completed"
    report = json.loads((scenes_run / "bench" / "report" / "report.json").read_text())
    assert untyped_keys(Report, report) == []  # mIoU, its bootstrap and the per-class IoU are all typed
    assert report["metric"] == "miou"
    by_name = {a["name"]: a for a in report["artifacts"]}
    assert {"train.model", "prune.model", "quantize.onnx_cpu", "export.onnx"} <= set(by_name)
    for entry in by_name.values():
        lo, hi = entry["accuracy_ci"]["miou"]
        assert lo <= entry["accuracy"]["miou"] <= hi and hi - lo > 0
        assert set(entry["per_class_iou"]) == {"background", "rectangle", "ellipse", "triangle"}
    source = by_name["export.onnx"]["source_model"]  # the file answers as the model it was made from
    assert abs(by_name["export.onnx"]["accuracy"]["miou"] - by_name[source]["accuracy"]["miou"]) < 0.05
    int8 = by_name["quantize.onnx_cpu"]["accuracy_paired"]
    assert int8["method"] == "paired-bootstrap" and int8["drop_ci"][0] <= int8["drop"] <= int8["drop_ci"][1]
    assert report["gate"]["decided_on"]
    md = (scenes_run / "bench" / "report" / "report.md").read_text()
    assert "## IoU per class" in md


@pytest.mark.slow  # the chain above, released and verified
def test_a_released_segmenter_has_a_card_with_iou_per_class_and_verify_says_what_it_cannot_measure(scenes_run,
                                                                                                    tmp_path):
    bundle = tmp_path / "release"
    assert main(["release", str(scenes_run), "--to", str(bundle), "--anyway"]) == 0
    card = (bundle / "MODEL_CARD.md").read_text()
    assert "- miou **" in card and "IoU per class: `background`" in card
    assert "N×C×H×W class logits at the input's resolution" in card
    assert "letterbox" in json.loads((bundle / "model_card.json").read_text())["input"]["resize"]
    assert main(["verify", str(bundle)]) == 0
    images = tmp_path / "images"
    (images / "background").mkdir(parents=True)
    assert main(["verify", str(bundle), str(images)]) == 2  # mIoU from a class folder: refused, said


@pytest.mark.slow  # the chain above, asked for an nncf stage
def test_the_nncf_stage_refuses_a_segmenter_before_writing_anything(scenes_run, tmp_path, capsys):
    import shutil

    config = yaml.safe_load((scenes_run / "pipeline.resolved.yaml").read_text())
    config["stages"].append({"name": "nncf", "kind": "nncf", "inputs": {"model": "train"}})
    path = tmp_path / "with-nncf.yaml"
    path.write_text(yaml.safe_dump(config))
    run_dir = tmp_path / "run"
    shutil.copytree(scenes_run, run_dir)
    capsys.readouterr()
    assert main(["run", str(path), "--run-dir", str(run_dir), "--only", "nncf", "--reuse-run-dir"]) == 2
    assert "cannot score a segmentation model; use the quantize stage's openvino flavour" in capsys.readouterr().err
    assert not (run_dir / "nncf" / "onnx").exists()
