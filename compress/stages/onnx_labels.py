"""The properties every ONNX file a stage writes carries, so the file alone says how to feed it.

A deployer receives a file, not a run directory: its input (layout, size, colour, scale, mean,
std), the class names its outputs mean, where it came from (the source model's digest and the
data split's digest) and how it was quantized must travel inside it.
"""
from __future__ import annotations

from pathlib import Path

from compress import __version__
from compress.stages.base import InputArtifact, StageContext
from export.onnx_metadata import deployment_properties, write_metadata


def label_onnx(path: Path, ctx: StageContext, source: InputArtifact, description: dict, *,
               data_identity: dict | None, quantization: dict | None = None) -> None:
    data = ctx.data
    # Content only (no pipeline name, no cache key, which covers the machine): the same model made with the
    # same settings from another pipeline file, as `compress search` re-creates its choice, is the same bytes.
    lineage = {"source_model": source.name, "source_sha256": source.sha256,
               "data_split_digest": data.digest()}
    write_metadata(path, deployment_properties(
        preprocessing=description["preprocessing"], class_names=data.class_names, lineage=lineage,
        version=__version__, quantization=quantization, data_identity=data_identity))
