"""The train stage's settings reach the loop, and its bad settings fail as config errors."""
from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from torch import nn

from compress.cli import main


def _metrics(run_dir) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())["stages"]["train"]["metrics"]


def test_speed_and_regularisation_settings_run_together(tmp_path, tiny_config, write_pipeline):
    tiny_config["stages"][0].update(
        batch_size=32, grad_accum=2, channels_last=True, checkpoint_blocks=["layer1"], optimizer="sgd",
        schedule="step", label_smoothing=0.1, clip_grad_norm=1.0, amp="bf16", augment={"pad": 1, "hflip": True})
    run_dir = tmp_path / "run"
    assert main(["run", str(write_pipeline(tiny_config)), "--run-dir", str(run_dir)]) == 0
    metrics = _metrics(run_dir)
    assert metrics["effective_batch"] == 64 and metrics["steps"] == 1294 // 64 and metrics["precision"] == "bf16"
    assert metrics["precision_reason"].startswith("amp: bf16")
    history = json.loads((run_dir / "train" / "history" / "history.json").read_text())
    assert [h["epoch"] for h in history] == [1] and "val_top1" in history[0]


@pytest.mark.parametrize("override, expected", [
    ("stages.train.checkpoint_blocks=[layer9]", "stages.train.checkpoint_blocks: no module named layer9"),
    ("stages.train.batch_size=5000", "stages.train.batch_size: 5000 × grad_accum 1 is more than the 1294 training images"),
    ("model.name=resnet18", "expects 3-channel input, the data has 1; set data.channels: 3"),
])
def test_bad_settings_found_while_building_exit_2(tmp_path, tiny_config, write_pipeline, capsys, override, expected):
    code = main(["run", str(write_pipeline(tiny_config)), "--run-dir", str(tmp_path / "run"), override])
    assert code == 2
    assert expected in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown when CUDA is absent")
def test_cuda_requested_without_a_gpu(tmp_path, tiny_config, write_pipeline, capsys):
    tiny_config["stages"][0]["device"] = "cuda"
    assert main(["run", str(write_pipeline(tiny_config)), "--run-dir", str(tmp_path / "run")]) == 2
    assert "device: cuda was asked for but torch sees no CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["stage", "tracking"])
def test_tensorboard_logging(tmp_path, tiny_config, write_pipeline, capsys, where):
    if where == "stage":
        tiny_config["stages"][0]["tensorboard"] = True
    else:
        tiny_config["tracking"] = {"tensorboard": True}
    run_dir = tmp_path / "run"
    code = main(["run", str(write_pipeline(tiny_config)), "--run-dir", str(run_dir)])
    if importlib.util.find_spec("tensorboard") is None:
        field = "stages.train.tensorboard" if where == "stage" else "tracking.tensorboard"
        assert code == 2
        assert f"{field}: true needs the tensorboard package" in capsys.readouterr().err
    else:
        assert code == 0 and any((run_dir / "train" / "tensorboard").iterdir())


def test_synthetic_data_accuracy_is_flagged(tmp_path, tiny_config, write_pipeline):
    tiny_config["data"] = {"name": "synthetic", "image_size": 8, "channels": 1, "synthetic_samples": 300}
    run_dir = tmp_path / "run"
    assert main(["run", str(write_pipeline(tiny_config)), "--run-dir", str(run_dir)]) == 0
    assert "meaningless" in _metrics(run_dir)["accuracy_meaningless"]


def test_train_images_limits_training_to_the_first_n_images(tmp_path, tiny_config, write_pipeline, capsys):
    tiny_config["stages"][0].update(train_images=128, batch_size=32, epochs=2)
    run_dir = tmp_path / "run"
    assert main(["run", str(write_pipeline(tiny_config)), "--run-dir", str(run_dir)]) == 0
    assert _metrics(run_dir)["steps"] == 2 * 128 // 32
    tiny_config["stages"][0].update(train_images=16)
    assert main(["run", str(write_pipeline(tiny_config)), "--run-dir", str(tmp_path / "small")]) == 2
    assert "than the 16 training images" in capsys.readouterr().err


def test_a_forced_precision_the_cpu_emulates_runs_and_warns_in_the_log(tmp_path, tiny_config, write_pipeline,
                                                                       capsys, monkeypatch):
    from train import precision
    from train.hardware import NativeTypes

    monkeypatch.setattr(precision, "native_types", lambda device: NativeTypes(False, False, "AVX2 only, torch AVX2"))
    tiny_config["stages"][0]["amp"] = "bf16"
    run_dir = tmp_path / "run"
    assert main(["run", str(write_pipeline(tiny_config)), "--run-dir", str(run_dir)]) == 0
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert "warning: stages.train.amp: bf16 is not native on this cpu (AVX2 only, torch AVX2)" in " ".join(out.split())
    metrics = _metrics(run_dir)
    assert metrics["precision"] == "bf16" and "emulated" in metrics["precision_reason"]
    capsys.readouterr()
    tiny_config["stages"][0]["amp"] = "auto"
    assert main(["run", str(write_pipeline(tiny_config)), "--run-dir", str(tmp_path / "auto")]) == 0
    assert _metrics(tmp_path / "auto")["precision"] == "fp32"  # auto keeps an emulating CPU in fp32


def test_test_accuracy_is_the_deployable_fp32_one_whatever_the_training_precision(tmp_path, tiny_config,
                                                                                  write_pipeline):
    from safetensors.torch import save_file

    from compress.stages.training_run import TrainingSettings, eval_stream
    from train.data import DataSpec, load_data
    from train.evaluate import evaluate
    from train.model_io import load_model
    from train.precision import make_precision

    # A least-squares linear classifier on the digits train split, so the weights start good and a
    # vanishing learning rate keeps them so under bf16 training.
    data = load_data(DataSpec(name="digits"))
    x, y = next(eval_stream(data, "train", TrainingSettings(eval_batch_size=4096), torch.device("cpu")).epoch(0))
    features = torch.cat([x.flatten(1), torch.ones(len(x), 1)], dim=1)
    solution = torch.linalg.lstsq(features, nn.functional.one_hot(y, 10).float()).solution
    weights = tmp_path / "lstsq.safetensors"
    save_file({"head.weight": (solution[:-1].T * 100).contiguous(), "head.bias": (solution[-1] * 100).contiguous()},
              str(weights))
    tiny_config["model"] = {"name": "tests.user_models:NearTies", "weights": str(weights)}
    tiny_config["stages"][0].update(amp="bf16", optimizer="sgd", lr=1e-9, weight_decay=0.0)
    run_dir = tmp_path / "run"
    assert main(["run", str(write_pipeline(tiny_config)), "--run-dir", str(run_dir)]) == 0
    metrics = _metrics(run_dir)
    model, _ = load_model(run_dir / "train" / "model")
    stream = eval_stream(data, "test", TrainingSettings(), torch.device("cpu"))
    fp32 = evaluate(model, stream)["top1"]
    under_bf16 = evaluate(model, stream, make_precision("bf16", torch.device("cpu")).autocast)["top1"]
    assert fp32 - under_bf16 > 30  # the two precisions really disagree on this model
    assert metrics["test_top1"] == pytest.approx(fp32, abs=1e-3) and metrics["test_precision"] == "fp32"
