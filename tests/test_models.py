"""The model registry and model artifacts that load without unpickling."""
from __future__ import annotations

import pytest
import torch

from train.model_io import describe, load_model, read_description, save_model
from train.models import ModelError, build_model, count_params, load_weights


@pytest.mark.parametrize("name, paper_params", [("resnet20", 0.27e6), ("resnet32", 0.46e6), ("resnet56", 0.85e6)])
def test_cifar_resnets_build_for_the_data_shape(name, paper_params):
    model = build_model(name, num_classes=10, in_channels=3)
    assert count_params(model) == pytest.approx(paper_params, rel=0.03)  # He et al. 2016, table 6
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    grey = build_model(name, num_classes=7, in_channels=1)
    assert grey(torch.randn(2, 1, 28, 28)).shape == (2, 7)


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "efficientnet_b0"])
def test_torchvision_models_get_the_class_count(name):
    model = build_model(name, num_classes=5, in_channels=3).eval()
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 5)


def test_user_callable_receives_classes_and_channels():
    model = build_model("tests.user_models:SmallNet", num_classes=4, in_channels=1, args={"width": 6})
    assert model(torch.randn(2, 1, 8, 8)).shape == (2, 4)


@pytest.mark.parametrize("name, channels, expected", [
    ("resnet1000", 3, r"'resnet1000' is not known; use one of resnet20, resnet32, resnet56"),
    ("resnet18", 1, r"expects 3-channel input, the data has 1; set data.channels: 3"),
    ("tests.user_models", 1, r"is not known"),
    ("tests.nowhere:Net", 1, r"cannot import module 'tests.nowhere'"),
    ("tests.user_models:Missing", 1, r"has no attribute 'Missing'"),
    ("tests.user_models:not_a_module", 1, r"returned str, not a torch.nn.Module"),
])
def test_bad_model_names_say_how_to_fix_them(name, channels, expected):
    with pytest.raises(ModelError, match=expected):
        build_model(name, num_classes=10, in_channels=channels)


def test_bad_builder_arguments_are_named():
    with pytest.raises(ModelError, match=r"rejected its arguments"):
        build_model("resnet20", 10, 3, {"colour": "red"})


def test_model_artifact_round_trip_gives_identical_outputs(tmp_path):
    torch.manual_seed(0)
    model = build_model("resnet20", 10, 1, {"width": 8}).eval()
    x = torch.randn(3, 1, 28, 28)
    description = describe("resnet20", 10, 1, {"width": 8}, {"mean": [0.1], "std": [0.3]})
    save_model(model, tmp_path / "m", description)
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["model.json", "model.safetensors"]
    loaded, desc = load_model(tmp_path / "m")
    assert torch.equal(model(x), loaded.eval()(x))
    assert desc["architecture"]["args"] == {"width": 8} and desc["preprocessing"]["std"] == [0.3]


def test_model_artifact_errors(tmp_path):
    with pytest.raises(ModelError, match=r"model.json is missing"):
        read_description(tmp_path)
    (tmp_path / "model.json").write_text('{"format": "something-else"}')
    with pytest.raises(ModelError, match=r"format 'something-else' is not 'compress-model/1'"):
        read_description(tmp_path)


def test_weights_file_is_read_without_unpickling_code(tmp_path):
    model = build_model("resnet20", 10, 3, {"width": 4})
    good = tmp_path / "good.pt"
    torch.save(model.state_dict(), good)
    other = build_model("resnet20", 10, 3, {"width": 4})
    load_weights(other, good)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values()))

    whole = tmp_path / "whole_module.pt"
    torch.save(model, whole)  # a pickled module: loading it would execute code
    with pytest.raises(ModelError, match=r"is not a plain state dict .*pickled modules are refused"):
        load_weights(other, whole)
    with pytest.raises(ModelError, match=r"does not fit the model"):
        load_weights(build_model("resnet32", 10, 3, {"width": 4}), good)
    with pytest.raises(ModelError, match=r"does not exist"):
        load_weights(other, tmp_path / "nope.pt")


def test_pipeline_model_weights_are_loaded(tmp_path, tiny_config, write_pipeline):
    from compress.cli import main
    from safetensors.torch import load_file, save_file

    torch.manual_seed(123)
    start = build_model("resnet20", 10, 1, {"width": 4})
    save_file({k: v.contiguous() for k, v in start.state_dict().items()}, str(tmp_path / "init.safetensors"))
    tiny_config["model"]["weights"] = str(tmp_path / "init.safetensors")
    tiny_config["stages"][0]["lr"] = 1e-9  # the trained weights stay at the loaded ones
    tiny_config["stages"][0]["optimizer"] = "sgd"
    tiny_config["stages"][0]["momentum"] = 0.0
    tiny_config["stages"][0]["weight_decay"] = 0.0
    assert main(["run", str(write_pipeline(tiny_config)), "--run-dir", str(tmp_path / "run")]) == 0
    trained = load_file(str(tmp_path / "run" / "train" / "model" / "model.safetensors"))
    torch.testing.assert_close(trained["conv1.weight"], start.state_dict()["conv1.weight"], atol=1e-6, rtol=0)
