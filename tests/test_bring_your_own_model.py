"""A model trained elsewhere is the run's first artifact: trained weights, or an ONNX file from a plain
``torch.onnx.export``, go through prune/quantize/export/bench/release with no train stage, measured the
same way as a model trained here, and every accuracy says that its training data is unknown."""
from __future__ import annotations

import copy
import json
import shutil

import numpy as np
import onnx
import pytest
import torch
import yaml

from compress.cli import main
from tests.conftest import TINY

BENCH = {"name": "bench", "kind": "bench", "min_iters": 200, "min_samples": 200, "min_duration_s": 0.3,
         "warmup_iters": 5, "block_iters": 50, "threads": 1}
QUANTIZE = {"name": "quantize", "kind": "quantize", "flavours": ["cpu"],
            "calibration": {"method": "minmax", "samples": 64}}


def _manifest(run_dir):
    return json.loads((run_dir / "manifest.json").read_text())


def _write(folder, config, name="p.yaml"):
    path = folder / name
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The tiny pipeline's own train stage, its weights as a plain state dict and as a plain ONNX export."""
    folder = tmp_path_factory.mktemp("trained")
    run_dir = folder / "run"
    assert main(["run", str(_write(folder, copy.deepcopy(TINY))), "--run-dir", str(run_dir)]) == 0
    weights = folder / "weights.safetensors"
    shutil.copy(run_dir / "train" / "model" / "model.safetensors", weights)
    from train.model_io import load_model

    model, _ = load_model(run_dir / "train" / "model")
    exported = folder / "plain.onnx"
    torch.onnx.export(model.eval(), (torch.zeros(1, 1, 8, 8),), str(exported))  # batch fixed at 1
    test_top1 = _manifest(run_dir)["stages"]["train"]["metrics"]["test_top1"]
    return {"folder": folder, "weights": weights, "onnx": exported, "test_top1": test_top1}


def _brought(model: dict, stages: list[dict]) -> dict:
    config = copy.deepcopy(TINY)
    config.update(model=model, red_line={"metric": "top1", "max_drop": 50.0}, gate={"decision": "point"},
                  stages=stages)
    return config


@pytest.mark.slow  # the whole chain
def test_trained_weights_start_the_run_with_the_train_stages_figure_then_prune_quantize_export_release(
        trained, tmp_path):
    config = _brought({"name": "resnet20", "args": {"width": 4}, "weights": str(trained["weights"])}, [
        {"name": "prune", "kind": "prune", "target": {"macs": 0.7}, "deployed_latency": {"enabled": False},
         "sparsity": {"epochs": 1, "amp": "off"},
         "finetune": {"epochs": 1, "amp": "off"}},
        dict(QUANTIZE, qat={"enabled": False}), {"name": "export", "kind": "export", "parity": {"samples": 32}},
        BENCH])
    run_dir = tmp_path / "run"
    assert main(["run", str(_write(tmp_path, config)), "--run-dir", str(run_dir)]) == 0
    manifest = _manifest(run_dir)
    model_stage = manifest["stages"]["model"]
    # the same images through the same evaluation: the very figure the train stage recorded
    assert model_stage["metrics"]["test_top1"] == trained["test_top1"]
    assert model_stage["metrics"]["origin"]["training_data"] == "unknown"
    assert manifest["artifacts"]["prune.model"]["made_from"] == ["model.model"]
    report = json.loads((run_dir / "bench" / "report" / "report.json").read_text())
    assert report["baseline"] == "model.model"
    assert report["data"]["test_independence"]["status"] == "unknown"
    assert any(f.startswith("† ") and "the data they learned from is unknown" in f for f in report["flags"])
    md = (run_dir / "bench" / "report" / "report.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| ") and any(a in line for a in (
        "model.model", "prune.model", "quantize.onnx_cpu", "export.onnx"))]
    assert rows and all("†" in row for row in rows[:4])  # beside every accuracy of the main table
    bundle = tmp_path / "bundle"
    assert main(["release", str(run_dir), "--to", str(bundle)]) == 0
    card = json.loads((bundle / "model_card.json").read_text())
    assert card["accuracy"]["test_independence"]["status"] == "unknown"
    assert "training data unknown" in (bundle / "MODEL_CARD.md").read_text()


def test_a_plain_torch_onnx_export_goes_through_quantize_export_bench_and_release(trained, tmp_path):
    config = _brought({"onnx": str(trained["onnx"])}, [QUANTIZE, {"name": "export", "kind": "export"}, BENCH])
    run_dir = tmp_path / "run"
    assert main(["run", str(_write(tmp_path, config)), "--run-dir", str(run_dir)]) == 0
    manifest = _manifest(run_dir)
    assert manifest["stages"]["model"]["metrics"]["test_top1"] == trained["test_top1"]  # onnxruntime agrees
    imported = manifest["artifacts"]["model.model"]
    assert imported["kind"] == "onnx" and imported["meta"]["batch_made_dynamic"] is True
    graph = onnx.load(str(run_dir / "model" / "model" / "model.onnx")).graph
    assert graph.input[0].type.tensor_type.shape.dim[0].dim_param  # the batch axis is symbolic now
    assert manifest["stages"]["quantize"]["metrics"]["rung"] in ("ptq", "fallback")  # never QAT: no torch model
    assert manifest["artifacts"]["export.onnx"]["meta"]["passed_through"] is True
    report = json.loads((run_dir / "bench" / "report" / "report.json").read_text())
    assert report["baseline"] == "model.model"
    assert {a["name"] for a in report["artifacts"]} == {"model.model", "quantize.onnx_cpu", "export.onnx"}
    assert main(["release", str(run_dir), "--to", str(tmp_path / "bundle")]) == 0


def test_what_a_brought_onnx_file_cannot_do_is_refused_before_anything_runs(trained, tmp_path, capsys):
    config = _brought({"onnx": str(trained["onnx"])}, [{"name": "prune", "kind": "prune", "deployed_latency": {"enabled": False}}, QUANTIZE])
    assert main(["run", str(_write(tmp_path, config)), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "stages[0].kind: a prune stage needs the torch model" in err and "model.weights" in err
    assert not (tmp_path / "run").exists()
    taken = _brought({"onnx": str(trained["onnx"])}, [dict(QUANTIZE, name="model")])
    assert main(["run", str(_write(tmp_path, taken, "t.yaml")), "--run-dir", str(tmp_path / "run")]) == 2
    assert "the name 'model' is taken" in capsys.readouterr().err
    both = _brought({"name": "resnet20", "onnx": str(trained["onnx"])}, [QUANTIZE])
    assert main(["run", str(_write(tmp_path, both, "b.yaml")), "--run-dir", str(tmp_path / "run")]) == 2
    assert "not both" in capsys.readouterr().err


def test_an_onnx_file_of_another_size_or_with_two_inputs_is_a_clear_error(trained, tmp_path, capsys):
    wrong_size = _brought({"onnx": str(trained["onnx"])}, [QUANTIZE])
    wrong_size["data"] = {"name": "digits", "image_size": 16}
    assert main(["run", str(_write(tmp_path, wrong_size)), "--run-dir", str(tmp_path / "r1")]) == 2
    err = capsys.readouterr().err
    assert "height 8, but the data gives 16" in err and "data.image_size" in err

    class TwoInputs(torch.nn.Module):
        def forward(self, x, y):
            return x.flatten(1)[:, :10] + y.flatten(1)[:, :10]

    two = tmp_path / "two.onnx"
    torch.onnx.export(TwoInputs().eval(), (torch.zeros(1, 1, 8, 8), torch.zeros(1, 1, 8, 8)), str(two))
    config = _brought({"onnx": str(two)}, [QUANTIZE])
    assert main(["run", str(_write(tmp_path, config, "two.yaml")), "--run-dir", str(tmp_path / "r2")]) == 2
    assert "has 2 inputs" in capsys.readouterr().err


def test_an_onnx_file_whose_batch_is_baked_in_beyond_a_reshape_is_refused(tmp_path, capsys):
    class Baked(torch.nn.Module):
        """Adds a constant shaped to batch 1 along the batch axis: batch 4 gives another result."""

        def __init__(self):
            super().__init__()
            self.register_buffer("bias", torch.arange(10, dtype=torch.float32).view(1, 10))

        def forward(self, x):
            flat = x.flatten(1)[:, :10]
            return flat + self.bias * flat.sum(0, keepdim=True)  # a sum over the batch: batch-dependent

    path = tmp_path / "baked.onnx"
    torch.onnx.export(Baked().eval(), (torch.zeros(1, 1, 8, 8),), str(path))
    config = _brought({"onnx": str(path)}, [QUANTIZE])
    assert main(["run", str(_write(tmp_path, config)), "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "baked into the graph" in err and "dynamic" in err


def test_a_test_folder_of_the_users_own_is_the_whole_test_split_and_vouches_for_it(tmp_path):
    from PIL import Image

    from train.generated_folder import _image

    for root, offset, count in ((tmp_path / "train", 0, 60), (tmp_path / "test", 10_000, 24)):
        for index in range(offset, offset + count):
            label = index % 3
            (root / f"c{label}").mkdir(parents=True, exist_ok=True)
            Image.fromarray(_image(label, index, 16, 3)).save(root / f"c{label}" / f"{index}.png")
    from compress.config import DataConfig
    from compress.pipeline.pipeline_data import load_section
    from compress.stages.provenance import test_independence
    from compress.config import ModelConfig

    data = DataConfig(name="imagefolder", path=str(tmp_path / "train"), test_path=str(tmp_path / "test"))
    bundle = load_section(data, "p.yaml")
    assert len(bundle.test) == 24 and len(bundle.train) + len(bundle.val) == 60
    # the test split is exactly the second folder: its pixels are none of the first's
    train_pixels = {bytes(img.numpy().tobytes()) for img in bundle.train.images}
    assert not any(bytes(img.numpy().tobytes()) in train_pixels for img in bundle.test.images)
    brought = ModelConfig(name="resnet20", weights="w.safetensors")
    # a folder apart from this run's train split says nothing of where the weights first learned: still unknown
    own_folder = test_independence(brought, data)
    assert own_folder["status"] == "unknown" and "data.test_path" in own_folder["note"]
    assert test_independence(brought, DataConfig(name="digits"))["status"] == "unknown"
    assert test_independence(brought, DataConfig(name="digits", independent_test=True))["status"] == "declared"
    assert test_independence(ModelConfig(name="resnet20"), DataConfig(name="digits")) is None  # trained here
    teacher = [{"name": "distill", "kind": "distill", "teacher": {"name": "resnet20", "weights": "t.safetensors"}}]
    assert test_independence(ModelConfig(name="resnet20"), DataConfig(name="digits"), teacher)["status"] == "unknown"
    # a test folder that repeats an image of the train folder is refused
    shutil.copy(next((tmp_path / "train" / "c0").iterdir()), tmp_path / "test" / "c0" / "copied.png")
    from compress.errors import DataInputError

    with pytest.raises(DataInputError, match=r"1 of its 25 images are also in"):
        load_section(data, "p.yaml")


def test_compress_stage_starts_from_weights_given_on_the_command_line(trained, tmp_path):
    run_dir = tmp_path / "run"
    code = main(["stage", "quantize", "--data", "digits", "--model", "resnet20", "--run-dir", str(run_dir),
                 "model.args={width: 4}", f"model.weights={trained['weights']}", "flavours=[cpu]",
                 "calibration.samples=64", "red_line.max_drop=50"])
    assert code == 0
    manifest = _manifest(run_dir)
    assert manifest["stages"]["model"]["metrics"]["test_top1"] == trained["test_top1"]
    assert manifest["artifacts"]["quantize.onnx_cpu"]["made_from"] == ["model.model"]
    assert np.isfinite(manifest["stages"]["quantize"]["metrics"]["reference_test"])


def test_an_onnx_file_that_records_another_split_is_refused_unless_the_test_is_declared_independent(
        trained, tmp_path, capsys):
    from export.onnx_metadata import DATA_KEY, write_metadata

    made_here = tmp_path / "made_here.onnx"
    onnx.save(onnx.load(str(trained["onnx"])), str(made_here))  # inline weights: the copy stands alone
    write_metadata(made_here, {DATA_KEY: json.dumps({"name": "digits", "split_digest": "f" * 64,
                                                     "sizes": {"train": 1, "val": 1, "calib": 1, "test": 1}})})
    config = _brought({"onnx": str(made_here)}, [QUANTIZE])
    assert main(["run", str(_write(tmp_path, config)), "--run-dir", str(tmp_path / "r1"), "--only", "model"]) == 2
    assert "records that it was made on data split ffffffffffff" in capsys.readouterr().err
    config["data"]["independent_test"] = True
    assert main(["run", str(_write(tmp_path, config, "i.yaml")), "--run-dir", str(tmp_path / "r2"),
                 "--only", "model"]) == 0
    statement = _manifest(tmp_path / "r2")["stages"]["model"]["metrics"]["origin"]
    assert statement["test_independence"] == "declared" and "cannot check" in statement["note"]
