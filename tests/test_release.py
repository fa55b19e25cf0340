"""What ships: self-describing ONNX files, the release bundle and its check, the docs' serving
example, report paths relative to the run, and the MLflow record of a run."""
from __future__ import annotations

import copy
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml

from compress.cli import main
from serve_bench.accuracy.predictions import load_predictions
from serve_bench.report_model import Report
from serve_bench.runners import usable_onnx_runtimes
from tests.conftest import ROOT, TINY, run_cli
from tests.report_invariants import untyped_keys

# OpenVINO (where a test adds it) pinned to f32: its default (auto) runs the INT8 file's float parts in bf16 on a CPU
# with native bf16, which moved 9 of 359 answers (2.5%) between the runtimes on an AVX-512 BF16 EPYC; the parity
# check is about INT8 rounding in two runtimes, the same on every CPU.
FAST_BENCH = {"min_iters": 100, "min_samples": 100, "min_duration_s": 0.0, "warmup_iters": 2, "warmup_s": 0.0,
              "block_iters": 50, "threads": 1, "settle_s": 0.0, "block_s": 0.0, "profile_iters": 0, "runtimes": ["onnxruntime"],
              "openvino": {"inference_precision": "f32"}}
EPOCHS = 6
PROJECT_PACKAGES = ("compress", "train", "export", "serve_bench")


def _config(store) -> dict:
    config = copy.deepcopy(TINY)
    config["model"] = {"name": "resnet20", "args": {"width": 8}}
    config["red_line"] = {"metric": "top1", "max_drop": 100.0}
    config["tracking"] = {"mlflow": {"tracking_uri": str(store), "experiment": "release-test"}}
    config["stages"] = [{**config["stages"][0], "epochs": EPOCHS, "lr": 3e-3, "schedule": "wsd"},
                        {"name": "quantize", "kind": "quantize", "calibration": {"method": "minmax", "samples": 64},
                         "qat": {"enabled": False}},
                        {"name": "export", "kind": "export", "parity": {"samples": 32}},
                        {"name": "bench", "kind": "bench", **FAST_BENCH}]
    return config


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A digits run (train, quantize, export, bench) logged to a local MLflow store, and its test split as PNGs."""
    folder = tmp_path_factory.mktemp("release")
    pipeline = folder / "pipeline.yaml"
    pipeline.write_text(yaml.safe_dump(_config(folder / "mlstore")))
    run_dir = folder / "run"
    assert main(["run", str(pipeline), "--run-dir", str(run_dir)]) == 0
    assert main(["images", str(run_dir), "--split", "test", "--to", str(folder / "test-images")]) == 0
    return folder, pipeline, run_dir


def _manifest(run_dir) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())


def _report(run_dir) -> dict:
    return json.loads((run_dir / "bench" / "report" / "report.json").read_text())


def test_every_onnx_written_states_its_input_classes_lineage_and_recipe_read_with_onnx_alone(finished):
    _, _, run_dir = finished
    manifest = _manifest(run_dir)
    data = manifest["data"]
    for name in ("export.onnx", "quantize.onnx_cpu", "quantize.onnx_tensorrt"):
        record = manifest["artifacts"][name]
        model = onnx.load(str(run_dir / record["path"] / "model.onnx"), load_external_data=False)
        props = {p.key: p.value for p in model.metadata_props}
        spec = json.loads(props["compress.preprocessing"])
        assert (spec["channels"], spec["height"], spec["width"], spec["layout"], spec["color"]) == (1, 8, 8, "NCHW", "L")
        assert spec["pixel_divisor"] == 255 and spec["scale"] == pytest.approx(1 / 255)
        assert spec["mean"] == data["mean"] and spec["std"] == data["std"]
        assert json.loads(props["compress.classes"]) == [str(i) for i in range(10)]
        lineage = json.loads(props["compress.lineage"])
        assert lineage["source_model"] == "train.model"
        assert lineage["source_sha256"] == manifest["artifacts"]["train.model"]["sha256"]
        assert lineage["data_split_digest"] == data["split_hash"]
        assert set(lineage) == {"source_model", "source_sha256", "data_split_digest"}  # content, no run names
        assert props["compress.version"] and json.loads(props["compress.data"])["split_digest"] == data["split_hash"]
        recipe = json.loads(props["compress.quantization"]) if "compress.quantization" in props else None
        if name == "export.onnx":
            assert recipe is None
        else:
            assert recipe["flavour"] == name.rsplit("_", 1)[1] and recipe["rung"] == "ptq"
            assert recipe["calibration"] == {"method": "minmax", "samples": 64, **{k: v for k, v in
                                             recipe["calibration"].items() if k not in ("method", "samples")}}


def test_every_key_the_bench_writes_is_a_field_of_the_report_model(finished):
    """The generated report reference lists the model's fields: a key the bench writes outside them would be
    undocumented (and unchecked), so a produced report.json holds none."""
    _, _, run_dir = finished
    report = _report(run_dir)
    assert len(report["artifacts"]) >= 3 and all("latency_ms" in a for a in report["artifacts"])
    assert untyped_keys(Report, report) == []


def test_report_paths_are_relative_to_the_run_directory_and_survive_a_move(finished, tmp_path):
    _, _, run_dir = finished
    moved = tmp_path / "moved"
    shutil.copytree(run_dir, moved)
    for entry in _report(moved)["artifacts"]:
        assert not os.path.isabs(entry["path"])
        assert (moved / entry["path"]).exists(), entry["path"]


def test_release_then_verify_on_the_held_out_images_reproduces_the_card(finished, tmp_path):
    folder, _, run_dir = finished
    bundle = tmp_path / "bundle"
    assert main(["release", str(run_dir), "--to", str(bundle)]) == 0
    report = _report(run_dir)
    released = report["gate"]["release"]
    entry = next(a for a in report["artifacts"] if a["name"] == released)
    card = json.loads((bundle / "model_card.json").read_text())
    assert card["released"]["artifact"] == released and not card["released_anyway"]
    assert card["released"]["sha256"] == _manifest(run_dir)["artifacts"][released]["sha256"]
    assert card["accuracy"]["top1"] == entry["accuracy"]["top1"] and card["accuracy"]["top1_ci"] == entry["accuracy_ci"]["top1"]
    assert card["latency"]["p99"] == entry["latency_ms"]["p99"] and card["latency"]["p99_ci"] == entry["latency_ms"]["p99_ci"]
    assert card["latency"]["environment"]["isa_summary"] and card["gate"]["limits"]["max_drop"] == 100.0
    assert [a["artifact"] for a in card["lineage"]][-1] == "train.model"
    text = (bundle / "MODEL_CARD.md").read_text()
    assert f"{card['accuracy']['top1']}%" in text and "95% Wilson interval" in text and "measured on:" in text
    # a deployer's own check, without this project
    assert subprocess.run(["sha256sum", "-c", "--quiet", "SHA256SUMS"], cwd=bundle).returncode == 0

    servers = card["servers"]  # the model servers' files, from the settings the bench measured
    assert (bundle / "serving" / servers["triton_config"]).is_file() and servers["runtime"] == entry["runtime"]
    assert (bundle / "serving" / servers["served_file"]).read_bytes() == (bundle / card["released"]["file"]).read_bytes()

    result = run_cli("verify", str(bundle), str(folder / "test-images"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "same digest), same accuracy" in result.stdout and "parses with Triton's schema" in result.stdout
    assert f"top1 {card['accuracy']['top1']}% on {card['accuracy']['test_images']} images" in result.stdout


def test_verify_finds_a_changed_file_and_images_that_do_not_match_the_card(finished, tmp_path):
    folder, _, run_dir = finished
    bundle = tmp_path / "bundle"
    assert main(["release", str(run_dir), "--to", str(bundle)]) == 0
    with open(bundle / "report" / "report.md", "a") as fh:
        fh.write("edited\n")
    result = run_cli("verify", str(bundle))
    assert result.returncode == 1 and "report/report.md has changed" in result.stdout

    (bundle / "report" / "report.md").write_text((run_dir / "bench" / "report" / "report.md").read_text())
    swapped = tmp_path / "swapped"  # every image filed under the next class: labels the card's figure cannot match
    for image in (folder / "test-images").rglob("*.png"):
        target = swapped / str((int(image.parent.name) + 1) % 10) / image.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(image, target)
    result = run_cli("verify", str(bundle), str(swapped))
    assert result.returncode == 1 and "the interval excludes 0, so these images disagree with the card" in result.stdout


def test_a_failed_gate_is_refused_unless_anyway_which_marks_the_bundle(finished, tmp_path):
    folder, pipeline, run_dir = finished
    failed = tmp_path / "failed"
    shutil.copytree(run_dir, failed)  # paths in the manifest and report are relative: the copy is a run
    assert main(["run", str(pipeline), "--run-dir", str(failed), "latency.p99_budget_ms=0.00001",
                 "tracking.mlflow=null"]) == 1
    bundle = tmp_path / "bundle"
    assert main(["release", str(failed), "--to", str(bundle)]) == 1
    assert not bundle.exists() and not list(tmp_path.glob(".bundle.*"))

    assert main(["release", str(failed), "--to", str(bundle), "--anyway", "--artifact", "train.model"]) == 0
    card = json.loads((bundle / "model_card.json").read_text())
    assert card["released_anyway"] and not card["gate"]["passed"] and (bundle / "GATE_FAILED.txt").is_file()
    assert "NOT PASSED BY THE RELEASE GATE" in (bundle / "MODEL_CARD.md").read_text()
    assert (bundle / "model" / "model.safetensors").is_file()
    # a torch model verifies too: its card's accuracy from its own runner on the PNGs
    result = run_cli("verify", str(bundle), str(folder / "test-images"))
    assert result.returncode == 0, result.stdout + result.stderr

    before = sorted(p.name for p in bundle.iterdir())
    assert main(["release", str(run_dir), "--to", str(bundle)]) == 2  # an existing bundle is never written into
    assert sorted(p.name for p in bundle.iterdir()) == before


SERVING_PAGE = ROOT / "docs" / "pages" / "guides" / "release-and-verify.md"


def _serving_example(marker: str = "serving-example") -> str:
    """A serving example as the docs show it (the README links to that page)."""
    text = SERVING_PAGE.read_text()
    block = re.search(rf"<!-- {marker} -->\n```python\n(.*?)```", text, re.S)
    assert block, f"{SERVING_PAGE.relative_to(ROOT)}'s serving example is marked with <!-- {marker} -->"
    return block.group(1)


def _serve_alone(example: str, model: Path, images: list[Path], folder: Path) -> list[str]:
    """The docs' serving example run from ``folder`` with ``-I`` (no project on the path), one answer per image."""
    script = folder / "serve.py"
    script.write_text(example.rsplit("\n\nprint(", 1)[0] + "\n\nimport sys\nfor path in sys.argv[2:]:\n"
                      "    print(classify(sys.argv[1], path))\n"
                      f"assert not [m for m in sys.modules if m.split('.')[0] in {PROJECT_PACKAGES!r}]\n")
    result = subprocess.run([sys.executable, "-I", str(script), str(model), *map(str, images)], cwd=folder,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_the_docs_serving_example_classifies_real_images_from_the_bundle_alone(finished, tmp_path):
    folder, _, run_dir = finished
    bundle = tmp_path / "bundle"
    assert main(["release", str(run_dir), "--to", str(bundle)]) == 0
    card = json.loads((bundle / "model_card.json").read_text())
    images = sorted((folder / "test-images").rglob("*.png"), key=lambda p: p.name)[:40]
    answers = _serve_alone(_serving_example(), bundle / card["released"]["file"], images, tmp_path)
    # the answers are the measured file's own: its top-1 for these test images, as the bench recorded them
    predictions = load_predictions(run_dir / "bench" / "report")
    order = [int(p.stem.split("-")[1]) for p in images]
    assert answers == [card["classes"][c] for c in predictions.topk[card["released"]["artifact"]][order, 0]]
    truth = [p.parent.name for p in images]
    assert sum(a == t for a, t in zip(answers, truth)) >= 0.5 * len(images)  # real digits, mostly right


def test_the_mlflow_store_holds_the_run_stage_by_stage(finished):
    from mlflow import MlflowClient

    folder, _, run_dir = finished
    client = MlflowClient(f"sqlite:///{folder / 'mlstore' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("release-test")
    runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"])
    run = runs[0]
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    params, metrics, tags = run.data.params, run.data.metrics, run.data.tags
    assert params["train.epochs"] == str(EPOCHS) and params["quantize.calibration.method"] == "minmax"
    assert params["pipeline.red_line.max_drop"] == "100.0"
    manifest, report = _manifest(run_dir), _report(run_dir)
    assert metrics["train.test_top1"] == manifest["stages"]["train"]["metrics"]["test_top1"]
    for entry in report["artifacts"]:
        assert metrics[f"bench.{entry['name']}.p99_ms"] == entry["latency_ms"]["p99"]
        assert metrics[f"bench.{entry['name']}.top1"] == entry["accuracy"]["top1"]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train.val_top1")] == list(range(1, EPOCHS + 1))
    assert {tags[f"{s}.status"] for s in ("train", "quantize", "export", "bench")} == {"completed"}
    assert tags["bench.release"] == report["gate"]["release"]
    logged = {f.path for f in client.list_artifacts(run.info.run_id, "bench/report")}
    assert "bench/report/report.json" in logged
    assert {f.path for f in client.list_artifacts(run.info.run_id)} >= {"manifest.json", "pipeline.resolved.yaml"}


def test_without_a_tracking_section_nothing_is_logged_and_a_bad_store_stops_before_any_stage(tmp_path, write_pipeline):
    config = copy.deepcopy(TINY)
    plain = write_pipeline(config, "plain.yaml")
    assert main(["run", str(plain), "--run-dir", str(tmp_path / "runs" / "plain")]) == 0
    assert not (tmp_path / "runs" / "mlflow.db").exists() and not (tmp_path / "runs" / "mlartifacts").exists()

    config["tracking"] = {"mlflow": {"tracking_uri": f"file:{tmp_path / 'mlruns'}"}}  # refused by MLflow ≥3.7
    bad = write_pipeline(config, "bad.yaml")
    result = run_cli("run", str(bad), "--run-dir", str(tmp_path / "bad-run"))
    assert result.returncode == 2 and "tracking.mlflow" in result.stderr
    assert not (tmp_path / "bad-run" / "manifest.json").exists()

    with socket.socket() as probe:  # a port nothing listens on: a stopped or mistyped server
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config["tracking"] = {"mlflow": {"tracking_uri": f"http://127.0.0.1:{port}"}}
    down = write_pipeline(config, "down.yaml")
    # MLflow's own retries took 250 s to give up here; the opening calls get one retry (4 s measured).
    result = run_cli("run", str(down), "--run-dir", str(tmp_path / "down-run"), timeout=120)
    assert result.returncode == 2 and f"cannot open the MLflow store http://127.0.0.1:{port}" in result.stderr
    assert not (tmp_path / "down-run" / "manifest.json").exists()


def test_tables_printed_to_a_log_show_full_artifact_names(finished):
    _, _, run_dir = finished
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    result = subprocess.run([sys.executable, "-m", "compress", "inspect", str(run_dir)], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert "quantize.onnx_cpu" in result.stdout and "quantize/onnx_cpu" in result.stdout
    assert "…" not in result.stdout


def test_the_tensorrt_sibling_is_the_engine_of_the_same_model():
    from compress.pipeline.manifest import ArtifactRecord, Manifest
    from compress.release.bundle import _engines_of

    def record(name, kind, made_from, source=None):
        return ArtifactRecord(name=name, kind=kind, path=name, sha256="0" * 64, size_bytes=1, stage=name.split(".")[0],
                              meta={"source_model": source} if source else {}, made_from=made_from)

    manifest = Manifest(pipeline="p")
    for r in (record("prune.model", "torch-model", []),
              record("quantize.onnx_cpu", "onnx", ["prune.model"], "prune.model"),
              record("quantize.onnx_tensorrt", "onnx", ["prune.model"], "prune.model"),
              record("export.tensorrt", "tensorrt", ["quantize.onnx_tensorrt"]),  # INT8 engine of the same model
              record("other.onnx", "onnx", ["train.model"], "train.model"),
              record("other.engine", "tensorrt", ["other.onnx"])):
        manifest.artifacts[r.name] = r
    assert [e.name for e in _engines_of(manifest, manifest.artifacts["quantize.onnx_cpu"])] == ["export.tensorrt"]
    assert [e.name for e in _engines_of(manifest, manifest.artifacts["other.onnx"])] == ["other.engine"]


def test_a_file_re_made_after_the_bench_is_not_released_even_anyway(finished, tmp_path, capsys):
    _, pipeline, run_dir = finished
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    before = _manifest(run)["artifacts"]["quantize.onnx_cpu"]["sha256"]
    # re-quantize after the bench: the manifest gets the new file, the bench's report stays the old file's
    assert main(["run", str(pipeline), "--run-dir", str(run), "--only", "quantize",
                 "stages.quantize.calibration.samples=32", "tracking.mlflow=null"]) == 0
    manifest = _manifest(run)
    assert manifest["artifacts"]["quantize.onnx_cpu"]["sha256"] != before
    assert before in manifest["stages"]["bench"]["input_digests"].values()
    capsys.readouterr()
    plain = [] if _report(run)["gate"]["release"] == "quantize.onnx_cpu" else ["--anyway"]
    for extra in (plain, ["--anyway"]):
        bundle = tmp_path / "bundle"
        assert main(["release", str(run), "--to", str(bundle), "--artifact", "quantize.onnx_cpu", *extra]) == 2
        err = capsys.readouterr().err
        assert "it measured another quantize.onnx_cpu" in err and "--from bench" in err, err
        assert not bundle.exists() and not list(tmp_path.glob(".bundle*"))


def _add_engine(manifest, report: dict, run, name: str, made_from: str, precision: str, **entry) -> None:
    """An engine of the same model, as an export stage on a TensorRT machine would record it, measured by the bench."""
    from compress.pipeline.manifest import ArtifactRecord, digest_path

    folder = run / "export" / name
    folder.mkdir(parents=True)
    (folder / "model.engine").write_bytes(f"engine {name}".encode())
    sha, size = digest_path(folder)
    manifest.artifacts[name] = ArtifactRecord(name=name, kind="tensorrt", path=f"export/{name}", sha256=sha,
                                              size_bytes=size, stage="export", made_from=[made_from],
                                              meta={"precision": precision})
    bench = manifest.stages["bench"]
    bench.input_digests[f"artifact:{name}"] = sha
    bench.key_material["input_names"][f"artifact:{name}"] = name
    fp32 = next(a for a in report["artifacts"] if a["name"] == "export.onnx")
    report["artifacts"].append({**fp32, "name": name, "runtime": "tensorrt", "format": "tensorrt",
                                "precision": precision, **entry})


def test_releasing_the_fp32_file_ships_only_the_engines_the_gate_passed(finished, tmp_path, capsys):
    from compress.pipeline.manifest import Manifest, digest_path

    _, _, run_dir = finished
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    manifest, report = Manifest.load(run), _report(run)
    _add_engine(manifest, report, run, "export.engine_fp16", "export.onnx", "fp16")
    refusal = "the quantize stage found no rung within the red line (its test drop 3.1 points); refused"
    _add_engine(manifest, report, run, "export.engine_int8", "quantize.onnx_tensorrt", "int8", refused=refusal)
    report["gate"]["release"] = "export.onnx"  # the gate chose the fp32 file
    (run / "bench" / "report" / "report.json").write_text(json.dumps(report))
    record = manifest.artifacts["bench.report"]
    record.sha256, record.size_bytes = digest_path(run / "bench" / "report")
    manifest.save(run)

    bundle = tmp_path / "bundle"
    capsys.readouterr()
    assert main(["release", str(run), "--to", str(bundle)]) == 0
    out = capsys.readouterr().out
    assert (bundle / "tensorrt" / "export.engine_fp16" / "model.engine").is_file()
    assert not (bundle / "tensorrt" / "export.engine_int8").exists()
    card = json.loads((bundle / "model_card.json").read_text())
    assert [e["artifact"] for e in card["tensorrt"]] == ["export.engine_fp16"]
    assert card["tensorrt_withheld"] == [{"artifact": "export.engine_int8", "precision": "int8",
                                          "reason": f"the release gate refused it ({refusal})"}]
    assert ("`export.engine_int8` (int8) of the same model is not shipped: the release gate refused it"
            in (bundle / "MODEL_CARD.md").read_text())
    assert "export.engine_int8 (int8) not shipped" in out and "export.engine_fp16 (fp16) shipped" in out


def test_verify_on_a_folder_that_names_no_class_is_bad_input(finished, tmp_path):
    _, _, run_dir = finished
    bundle = tmp_path / "bundle"
    assert main(["release", str(run_dir), "--to", str(bundle)]) == 0
    (tmp_path / "images" / "cats").mkdir(parents=True)
    result = run_cli("verify", str(bundle), str(tmp_path / "images"))
    assert result.returncode == 2 and "sub-folder(s) cats name no class" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_store_that_fails_mid_run_stops_only_the_logging(tmp_path, write_pipeline, monkeypatch, capsys):
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    config = copy.deepcopy(TINY)
    config["tracking"] = {"mlflow": {"tracking_uri": str(tmp_path / "store")}}

    def down(self, *args, **kwargs):
        raise MlflowException("the tracking server went away")

    monkeypatch.setattr(MlflowClient, "log_batch", down)
    assert main(["run", str(write_pipeline(config)), "--run-dir", str(tmp_path / "run")]) == 0
    err = capsys.readouterr().err
    assert err.count("MLflow logging stopped") == 1 and "the tracking server went away" in err
    assert json.loads((tmp_path / "run" / "manifest.json").read_text())["stages"]["train"]["status"] == "completed"


def test_where_the_store_is(tmp_path, monkeypatch):
    from compress.config import MlflowSettings
    from compress.pipeline.tracking import store_uri

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run_dir = tmp_path / "runs" / "q"
    assert store_uri(MlflowSettings(), run_dir) == (f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}",
                                                   tmp_path / "runs" / "mlartifacts")
    assert store_uri(MlflowSettings(tracking_uri=str(tmp_path / "s")), run_dir)[0] == f"sqlite:///{tmp_path / 's' / 'mlflow.db'}"
    assert store_uri(MlflowSettings(tracking_uri="http://mlflow:5000"), run_dir) == ("http://mlflow:5000", None)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://elsewhere:5000")
    assert store_uri(MlflowSettings(), run_dir) == ("http://elsewhere:5000", None)


def test_the_quick_opening_leaves_mlflow_settings_the_user_made_and_restores_the_rest(monkeypatch):
    from compress.pipeline.tracking import _answer_soon

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "99")
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    with _answer_soon():
        assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "1" and os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "99"
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ and os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "99"


@pytest.mark.skipif("openvino" not in usable_onnx_runtimes(), reason="OpenVINO is not installed here (compress[cpu])")
def test_a_release_on_openvino_names_its_runtime_verifies_in_it_and_serves_with_openvino_alone(finished, tmp_path):
    """The quantize stage's OpenVINO file (NNCF's), measured and judged on OpenVINO alone, released, verified and
    served there."""
    folder, pipeline, run_dir = finished
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    # from quantize: its flavours follow the bench's runtimes, so it now makes the OpenVINO file too
    assert main(["run", str(pipeline), "--run-dir", str(run), "--from", "quantize",
                 "stages.bench.runtimes=[onnxruntime, openvino]"]) in (0, 1)
    artifacts = json.loads((run / "manifest.json").read_text())["artifacts"]
    meta = artifacts["quantize.onnx_openvino"]["meta"]
    assert meta["runtimes"] == ["openvino"] and "test_drop" in meta["red_line"]  # checked where it ships
    assert artifacts["quantize.onnx_cpu"]["meta"]["runtimes"] == ["onnxruntime"]  # no longer run in OpenVINO
    report = json.loads((run / "bench" / "report" / "report.json").read_text())
    names = [a["name"] for a in report["artifacts"]]
    assert "quantize.onnx_cpu@openvino" not in names and "quantize.onnx_openvino@onnxruntime" not in names
    candidate = next(a for a in report["artifacts"] if a["name"] == "quantize.onnx_openvino")
    assert candidate["artifact"] == "quantize.onnx_openvino" and candidate["runtime"] == "openvino"
    assert not candidate.get("refused") and candidate["runner"]["inference_precision"] == "f32"
    kernels = json.loads((run / "manifest.json").read_text())["stages"]["quantize"]["metrics"]["kernels"]
    assert kernels["openvino@openvino"]["integer"] > 0  # NNCF's layout runs in int8 there
    # Two quantizers of one model (NNCF's and onnxruntime's, different ranges): on the tiny model's 359 test images
    # sound ones were seen up to 5.3 points apart (19 images, on a busy machine); a broken one loses tens of points
    assert abs(candidate["accuracy"]["top1"] - next(a for a in report["artifacts"] if a["name"] ==
                                                    "quantize.onnx_cpu")["accuracy"]["top1"]) <= 10.0
    bundle = tmp_path / "bundle"
    chosen = report["gate"]["release"] == candidate["name"] and report["gate"]["passed"]
    args = [] if chosen else ["--artifact", candidate["name"], "--anyway"]
    assert main(["release", str(run), "--to", str(bundle), *args]) == 0
    card = json.loads((bundle / "model_card.json").read_text())
    assert card["released"]["artifact"] == "quantize.onnx_openvino" and card["released"]["candidate"] == candidate["name"]
    assert card["runtime"]["name"] == "openvino" and card["runtime"]["version"] == candidate["runner"]["version"]
    assert f"openvino {card['runtime']['version']}" in (bundle / "MODEL_CARD.md").read_text()
    result = run_cli("verify", str(bundle), str(folder / "test-images"))
    assert "loads in openvino" in result.stdout and "same accuracy" in result.stdout, result.stdout + result.stderr
    images = sorted((folder / "test-images").rglob("*.png"), key=lambda p: p.name)[:40]
    answers = _serve_alone(_serving_example("serving-example-openvino"), bundle / card["released"]["file"], images,
                           tmp_path)
    order = [int(p.stem.split("-")[1]) for p in images]
    expected = load_predictions(run / "bench" / "report").topk[candidate["name"]][order, 0]
    assert answers == [card["classes"][c] for c in expected]  # OpenVINO's own answers, as the bench recorded them


def test_serve_refuses_a_bundle_whose_checksums_fail_and_starts_nothing(finished, tmp_path, capsys):
    _, _, run_dir = finished
    bundle = tmp_path / "bundle"
    assert main(["release", str(run_dir), "--to", str(bundle)]) == 0
    with open(bundle / "MODEL_CARD.md", "a") as fh:
        fh.write("edited\n")
    assert main(["serve", str(bundle)]) == 2
    err = capsys.readouterr().err
    assert "does not match its SHA256SUMS" in err and "MODEL_CARD.md has changed" in err
    assert main(["serve", str(bundle), "--artifact", "train.model"]) == 2  # a bundle holds one file
    assert main(["serve", str(run_dir), "--artifact", "train.model"]) == 2  # a torch model: no server here runs it
    assert "compress serve serves ONNX files" in capsys.readouterr().err


@pytest.mark.slow  # a real server: about 20 s to start and stop
def test_compress_serve_answers_a_plain_http_client_as_the_bench_recorded_and_stops_on_sigterm(finished, tmp_path):
    """``compress serve BUNDLE`` in one process, a client with nothing but the standard library in this one: the
    answers to the test images are the released file's own, as the bench recorded them; SIGTERM stops it, exit 0."""
    import json as json_module
    import signal
    import urllib.request

    from serve_bench.accuracy.image_folder import read_labelled_folder
    from serve_bench.servers.base import free_port, wait_until_ready

    folder, _, run_dir = finished
    bundle = tmp_path / "bundle"
    assert main(["release", str(run_dir), "--to", str(bundle)]) == 0
    card = json.loads((bundle / "model_card.json").read_text())
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "compress.cli", "serve", str(bundle), "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}/{card['servers']['model']}"
        wait_until_ready(url, 180, lambda: server.poll() is None, "compress serve")  # a ServerError names a dead one
        images = read_labelled_folder(folder / "test-images", card["input"], card["classes"]).images[:20]
        answers = []
        for image in images:
            request = urllib.request.Request(f"{url}/infer", data=json_module.dumps({"inputs": image.tolist()}).encode(),
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=30) as answer:
                answers.append(int(np.argmax(json_module.loads(answer.read())["outputs"])))
        recorded = load_predictions(run_dir / "bench" / "report").topk[card["released"]["artifact"]][:20, 0]
        assert answers == [int(c) for c in recorded]
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=120) == 0
        out = server.stdout.read()
        assert "serving http://127.0.0.1" in out and "stopping" in out
    finally:
        if server.poll() is None:
            server.kill()
