"""Models by name: torchvision classifiers, the CIFAR ResNets, or a user's ``module:callable``.

A model is always rebuilt from (name, arguments), never unpickled; the class count and
input channels come from the data set so one pipeline file works on any data.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from train import cifar_resnet
from train.errors import TrainError


class ModelError(TrainError):
    bad_input = True
    """A model name, its arguments or its weights file is wrong; the message says how to fix it."""


_CIFAR = {"resnet20": cifar_resnet.resnet20, "resnet32": cifar_resnet.resnet32, "resnet56": cifar_resnet.resnet56}


def _torchvision_builders() -> dict[str, Callable[..., nn.Module]]:
    from torchvision import models as tvm

    return {name: tvm.get_model_builder(name) for name in tvm.list_models(module=tvm)}


def known_models() -> list[str]:
    return sorted(_CIFAR) + sorted(_torchvision_builders())


def _resolve_callable(spec: str) -> Callable[..., nn.Module]:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ModelError(f"model.name {spec!r}: a user model is written 'package.module:callable'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelError(f"model.name {spec!r}: cannot import module {module_name!r} ({exc}); is it on PYTHONPATH?") from exc
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ModelError(f"model.name {spec!r}: module {module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ModelError(f"model.name {spec!r}: {attr!r} is not callable")
    return target


def code_file(spec: str) -> Path | None:
    """The source file of a user model's module ('package.module:callable'), found without running it.

    None for the registry's models (their code is the installed packages', versioned) and for a
    module that cannot be found (building the model will say why).
    """
    module_name, sep, _ = spec.partition(":")
    if not sep or not module_name:
        return None
    try:
        found = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return None
    if found is None or not found.origin or not Path(found.origin).is_file():
        return None
    return Path(found.origin)


def _accepts(fn: Callable, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def check_model(name: str, in_channels: int | None, weights: str | None = None) -> None:
    """What can be known about a model section without building it: the name resolves (a registry
    model, or a user callable that imports), a torchvision model gets 3-channel input, the weights
    file exists. Raises ModelError with the fix."""
    if ":" in name:
        _resolve_callable(name)
    elif name not in _CIFAR:
        if name not in _torchvision_builders():
            raise ModelError(f"model.name {name!r} is not known; use one of {', '.join(known_models())} or "
                             "'package.module:callable'")
        if in_channels is not None and in_channels != 3:
            raise ModelError(f"model.name {name!r} is a torchvision model and expects 3-channel input, the data has "
                             f"{in_channels}; set data.channels: 3")
    if weights and not Path(weights).is_file():
        raise ModelError(f"model.weights: {weights} does not exist; give a local .safetensors or .pt state dict")


def build_model(name: str, num_classes: int, in_channels: int, args: dict | None = None) -> nn.Module:
    """Construct a freshly initialised model; raises ModelError with the fix on bad input."""
    args = dict(args or {})
    if name in _CIFAR:
        builder: Callable[..., nn.Module] = _CIFAR[name]
        kwargs = {"num_classes": num_classes, "in_channels": in_channels, **args}
    elif ":" in name:
        builder = _resolve_callable(name)
        kwargs = dict(args)
        if _accepts(builder, "num_classes"):
            kwargs.setdefault("num_classes", num_classes)
        if _accepts(builder, "in_channels"):
            kwargs.setdefault("in_channels", in_channels)
    else:
        builders = _torchvision_builders()
        if name not in builders:
            raise ModelError(f"model.name {name!r} is not known; use one of {', '.join(known_models())} or 'package.module:callable'")
        if in_channels != 3:
            raise ModelError(
                f"model.name {name!r} is a torchvision model and expects 3-channel input, the data has {in_channels}; "
                "set data.channels: 3"
            )
        builder = builders[name]
        kwargs = {"weights": None, "num_classes": num_classes, **args}
    try:
        model = builder(**kwargs)
    except TypeError as exc:
        raise ModelError(f"model {name!r} rejected its arguments {sorted(kwargs)}: {exc}") from exc
    if not isinstance(model, nn.Module):
        raise ModelError(f"model {name!r} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def load_state_dict_file(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a weights file without ever unpickling code (safetensors, or torch with weights_only)."""
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"model.weights: {path} does not exist")
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except (SafetensorError, OSError) as exc:
            raise ModelError(f"model.weights: {path} is not a readable safetensors file ({exc}); re-export it with "
                             "safetensors.torch.save_file") from exc
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises UnpicklingError, RuntimeError, EOFError... for bad files
        raise ModelError(
            f"model.weights: {path} is not a plain state dict ({type(exc).__name__}); save it with "
            "torch.save(model.state_dict(), path) or as .safetensors; pickled modules are refused"
        ) from exc
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ModelError(f"model.weights: {path} does not hold a state dict of tensors")
    return state


def load_weights(model: nn.Module, path: str | Path) -> None:
    state = load_state_dict_file(path)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ModelError(f"model.weights: {path} does not fit the model: {str(exc).splitlines()[0]}") from exc


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def count_macs(model: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Multiply-accumulates of one forward pass at batch 1 (torch-pruning's counter)."""
    import torch_pruning as tp

    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        macs, _ = tp.utils.count_ops_and_params(model, torch.zeros(1, *input_shape, device=device))
    finally:
        model.train(was_training)
    return int(macs)
