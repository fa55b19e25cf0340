"""Where a stage's model comes from: an earlier artifact, or the pipeline's model section.

Library errors (a bad name, a weights file that does not fit) become config errors that
name the pipeline field, so the CLI exits 2 with the fix instead of a stack trace.
"""
from __future__ import annotations

import functools
from pathlib import Path

from pydantic import BaseModel
from torch import nn

from compress.config import ModelConfig
from compress.errors import ArtifactError, ConfigError
from compress.stages.base import InputArtifact
from export.external_data import UnsafeModelError, check_external_data
from train.data import DataBundle
from train.file_digest import file_sha256
from train.model_io import describe, load_model
from train.head_transfer import HeadMismatch, load_for_data
from train.models import TIMM_PREFIX, ModelError, build_model, code_file, load_state_dict_file


@functools.lru_cache(maxsize=64)
def _digest(path: Path, size: int, mtime_ns: int) -> str:
    return file_sha256(path)


def _content_digest(path: Path) -> str:
    """sha256 of a file, computed once per version of it: every stage's cache key names the
    pipeline's weights file, and a pretrained one can be hundreds of megabytes."""
    stat = path.stat()
    return _digest(path.resolve(), stat.st_size, stat.st_mtime_ns)


def source_digests(cfg: ModelConfig) -> dict:
    """What a model section's results depend on beyond its text: the weights file's bytes and the
    user module's source. A path string alone would call a retrained weights file, or edited model
    code, "cached"."""
    digests: dict = {}
    if cfg.onnx:
        path = Path(cfg.onnx)
        digests["onnx"] = _content_digest(path) if path.is_file() else f"missing: {path}"
        digests.update(_external_digests(path))
        return digests
    if (cfg.name or "").startswith(TIMM_PREFIX):  # a new timm can change an architecture's defaults, not its shapes
        import timm

        digests["timm"] = timm.__version__
    if cfg.weights:
        path = Path(cfg.weights)
        digests["weights"] = _content_digest(path) if path.is_file() else f"missing: {path}"
    code = code_file(cfg.name or "")
    if code is not None:
        digests["code"] = _content_digest(code)
    return digests


def _external_digests(path: Path) -> dict:
    """The bytes of an ONNX file's external-data files: retrained weights may change only those."""
    if not path.is_file():
        return {}
    try:
        locations = check_external_data(path)
    except (UnsafeModelError, OSError, ValueError) as exc:  # refused with the fix when the model stage runs
        return {"external_data": f"unreadable: {exc}"}
    return {f"external_data:{loc}": _content_digest(path.parent / loc) if (path.parent / loc).is_file()
            else f"missing: {loc}" for loc in locations}


def model_sources(*sections: BaseModel | None) -> list[dict]:
    """``source_digests`` of every model section inside the given settings (teachers, students too)."""
    found: list[dict] = []

    def walk(value) -> None:
        if isinstance(value, ModelConfig):
            found.append({"name": value.name, **source_digests(value)})
        if isinstance(value, BaseModel):
            for name in type(value).model_fields:
                walk(getattr(value, name))
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)

    for section in sections:
        walk(section)
    return found


def model_from_config(cfg: ModelConfig, data: DataBundle) -> tuple[nn.Module, dict]:
    """The model section's model for the data: built for its classes, with ``model.weights`` loaded; weights
    trained on other classes load all but the classifier, which is re-made (train.head_transfer), and the
    description records it (``transfer``)."""
    channels = data.input_shape[0]
    transfer = None
    try:
        model = build_model(cfg.name, data.num_classes, channels, cfg.args)
        if cfg.weights:
            transfer = load_for_data(model, load_state_dict_file(cfg.weights), cfg.head, cfg.classifier)
    except ModelError as exc:
        raise ConfigError(str(exc)) from exc
    except HeadMismatch as exc:
        raise ConfigError(f"model.weights: {cfg.weights} does not fit {cfg.name} built for {data.num_classes} "
                          f"classes: {exc}") from exc
    description = describe(cfg.name, data.num_classes, channels, cfg.args, data.preprocessing(), data=data.identity())
    if transfer is not None:
        description["transfer"] = {"weights": str(cfg.weights), **transfer.as_dict()}
    return model, description


def trained_on(description: dict, data: DataBundle) -> dict:
    """Record in a model's description the data it has just been trained on (what later stages check)."""
    description["data"] = data.identity()
    description["preprocessing"] = data.preprocessing()
    return description


def model_from_artifact(artifact: InputArtifact, data: DataBundle) -> tuple[nn.Module, dict]:
    if artifact.kind == "onnx":
        raise ConfigError(f"input {artifact.name} is an ONNX file, and this stage trains or rewrites a torch model "
                          "(training, pruning, distillation and QAT need one): give model.name and model.weights "
                          "instead of model.onnx, or drop the stage (quantize, export and bench take ONNX files)")
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


def onnx_description(artifact: InputArtifact) -> dict:
    """The description an imported ONNX file's artifact carries (what a torch model's model.json holds)."""
    description = artifact.meta.get("description")
    if not description:
        raise ArtifactError(f"input {artifact.name} is an ONNX file without the description this stage needs "
                            "(made by an older version); re-run the stage that made it")
    return description


def model_meta(metrics: dict, description: dict) -> dict:
    """The manifest metadata of a saved model artifact (what the bench and export read without loading it)."""
    return {"params": metrics["params"], "macs": metrics["macs"],
            **{k: metrics[k] for k in ("test_top1", "test_map", "test_map50") if k in metrics},
            "preprocessing": description["preprocessing"]}
