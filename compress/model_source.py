"""Where a stage's model comes from: an earlier artifact, or the pipeline's model section.

Library errors (a bad name, a weights file that does not fit) become config errors that
name the pipeline field, so the CLI exits 2 with the fix instead of a stack trace.
"""
from __future__ import annotations

from torch import nn

from compress.config import ModelConfig
from compress.errors import ArtifactError, ConfigError
from compress.stages.base import InputArtifact
from train.data import DataBundle
from train.model_io import describe, load_model
from train.models import ModelError, build_model, load_weights


def model_from_config(cfg: ModelConfig, data: DataBundle) -> tuple[nn.Module, dict]:
    channels = data.input_shape[0]
    try:
        model = build_model(cfg.name, data.num_classes, channels, cfg.args)
        if cfg.weights:
            load_weights(model, cfg.weights)
    except ModelError as exc:
        raise ConfigError(str(exc)) from exc
    return model, describe(cfg.name, data.num_classes, channels, cfg.args, data.preprocessing())


def model_from_artifact(artifact: InputArtifact, data: DataBundle) -> tuple[nn.Module, dict]:
    try:
        model, description = load_model(artifact.path)
    except ModelError as exc:
        raise ArtifactError(f"input {artifact.name}: {exc}") from exc
    arch = description["architecture"]
    if arch["num_classes"] != data.num_classes or arch["in_channels"] != data.input_shape[0]:
        raise ConfigError(
            f"input {artifact.name} was made for {arch['num_classes']} classes and {arch['in_channels']} channels, "
            f"but data {data.name} has {data.num_classes} classes and {data.input_shape[0]} channels"
        )
    return model, description
