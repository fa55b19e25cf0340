"""Checks of a pipeline that need the outside world but no training: run by `validate` and before a run.

The schema (pipeline_file) says whether the file is well formed; this says whether what it
names exists: the data source (folder, class folders, images, without decoding them), every
model section (a known name or an importable callable, 3-channel input for torchvision
models, the weights file), so `compress validate` and `compress run` reject the same files,
and a run rejects them before it writes anything into its run directory.

Not checked (only running tells): whether each image decodes, whether a user model accepts
its arguments and the data's shape, whether training converges, whether TensorRT can build.
"""
from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from compress.config import ModelConfig
from compress.errors import ConfigError
from compress.pipeline.pipeline_file import Pipeline
from train.datasets import DataError, check_source, imagefolder_files
from train.models import ModelError, check_model

NOT_CHECKED = ("whether every image decodes, whether a user model accepts its arguments and the data's shape, "
               "whether training converges, whether a TensorRT engine builds")
_NATIVE_CHANNELS = {"digits": 1, "mnist5k": 1, "cifar10": 3}  # an image folder's depends on its images


def _model_sections(value, path: tuple) -> list[tuple[tuple, ModelConfig]]:
    found = []
    if isinstance(value, ModelConfig):
        found.append((path, value))
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            found += _model_sections(getattr(value, name), (*path, name))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found += _model_sections(item, (*path, i))
    return found


def _path(loc: tuple) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")


def preflight(pipeline: Pipeline) -> None:
    """Raise ConfigError listing every problem found, each with its field path and fix."""
    config, problems = pipeline.config, []
    try:
        check_source(config.data.name, config.data.path)
    except DataError as exc:
        problems.append(("data.path" if config.data.path or config.data.name in ("imagefolder", "cifar10")
                         else "data.name", str(exc)))
    if config.data.test_path:
        try:
            imagefolder_files(config.data.test_path)
        except DataError as exc:
            problems.append(("data.test_path", str(exc).removeprefix("imagefolder: ")))
    channels = config.data.channels or _NATIVE_CHANNELS.get(config.data.name)
    sections = _model_sections(config.model, ("model",))
    for stage in pipeline.stages:  # by name: a brought model's stage goes in front, so indexes would shift
        sections += [(("stages", stage.name, *loc), section) for loc, section in _model_sections(stage, ())]
    for loc, section in sections:
        if section.onnx is not None:
            if loc != ("model",):
                problems.append((_path((*loc, "onnx")), "an ONNX file cannot be trained or distilled; give name "
                                 "(and weights) of the torch model"))
            elif not Path(section.onnx).is_file():
                problems.append(("model.onnx", f"{section.onnx} does not exist; give the path of an .onnx file"))
            continue
        try:
            check_model(section.name, channels, section.weights)
        except ModelError as exc:
            message = str(exc)
            if message.startswith("model.weights: "):
                problems.append((_path((*loc, "weights")), message.removeprefix("model.weights: ")))
            else:
                problems.append((_path((*loc, "name")), message.removeprefix("model.name ")))
    problems += _sync_batchnorm_without_gpus(pipeline)
    if problems:
        noun = "problem" if len(problems) == 1 else "problems"
        raise ConfigError(f"{pipeline.source}: {len(problems)} {noun} in what the pipeline names:\n"
                          + "\n".join(f"  {pipeline.source}: {where}: {message}" for where, message in problems))


def _sync_batchnorm_without_gpus(pipeline: Pipeline) -> list[tuple[str, str]]:
    """SyncBatchNorm asked for where torch sees no CUDA device: every rank would refuse it after torchrun had
    started them all, so say it before anything is launched (the ranks still check their own device)."""
    import torch

    from compress.stages import registry

    if torch.cuda.is_available():
        return []
    problems = []
    for stage in pipeline.stages:
        if not getattr(registry.get(stage.kind), "distributable", False):
            continue
        own = getattr(stage, "distributed", None)
        spread = own or pipeline.config.distributed
        if spread.processes > 1 and spread.sync_batchnorm:
            where = f"stages.{stage.name}.distributed" if own else "distributed"
            problems.append((f"{where}.sync_batchnorm", "true needs GPUs (torch's SyncBatchNorm runs only on CUDA) "
                             "and torch sees none here; set it false or leave it unset (then each CPU process "
                             "normalises over its batch)"))
    return problems
