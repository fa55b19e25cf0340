"""Model artifacts that load without unpickling: safetensors weights + a JSON description.

The JSON names the registry entry and arguments that rebuild the architecture, the class
count, and the preprocessing the model expects, so a model file handed around between
stages, machines or people can never execute code when it is opened.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save_file
from torch import nn

from train.models import ModelError, build_model

FORMAT = "compress-model/1"
WEIGHTS_FILE = "model.safetensors"
DESCRIPTION_FILE = "model.json"


def describe(name: str, num_classes: int, in_channels: int, args: dict | None, preprocessing: dict,
             **extra: Any) -> dict:
    return {
        "format": FORMAT,
        "architecture": {"name": name, "num_classes": num_classes, "in_channels": in_channels, "args": dict(args or {})},
        "preprocessing": preprocessing,
        **extra,
    }


def save_model(model: nn.Module, directory: str | Path, description: dict) -> None:
    """Write the two files into ``directory`` (the caller makes the folder swap atomic)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    # Clone so tied or views-of-one-storage parameters serialise independently.
    state = {k: v.detach().to("cpu").clone().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(directory / WEIGHTS_FILE), metadata={"format": FORMAT})
    (directory / DESCRIPTION_FILE).write_text(json.dumps(description, indent=2, sort_keys=True))


def read_description(directory: str | Path) -> dict:
    path = Path(directory) / DESCRIPTION_FILE
    try:
        description = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ModelError(f"{path} is missing: {directory} is not a model artifact folder") from exc
    except json.JSONDecodeError as exc:
        raise ModelError(f"{path} is not valid JSON ({exc}); re-run the stage that made it") from exc
    if description.get("format") != FORMAT:
        raise ModelError(f"{path}: format {description.get('format')!r} is not {FORMAT!r}; re-run the stage that made it")
    return description


def replay_pruning(model: nn.Module, pruning: dict) -> None:
    """Re-apply a recorded channel pruning to a freshly built model, so its weights fit.

    The history is torch-pruning's own: (module name, output-channel pruning?, indices) per
    step; the dependency graph replays it, including the coupled layers (residual adds,
    concatenations, BatchNorms) each step touched.
    """
    import torch
    import torch_pruning as tp

    example = torch.zeros(1, *pruning["input_shape"])
    graph = tp.DependencyGraph().build_dependency(model.eval(), example_inputs=example)
    graph.load_pruning_history([(name, bool(out), list(idxs)) for name, out, idxs in pruning["history"]])


def load_model(directory: str | Path) -> tuple[nn.Module, dict]:
    directory = Path(directory)
    description = read_description(directory)
    arch = description["architecture"]
    model = build_model(arch["name"], arch["num_classes"], arch["in_channels"], arch.get("args"))
    if description.get("pruning"):
        replay_pruning(model, description["pruning"])
    state = load_file(str(directory / WEIGHTS_FILE))
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ModelError(f"{directory / WEIGHTS_FILE} does not fit {arch['name']}: {str(exc).splitlines()[0]}") from exc
    return model, description

