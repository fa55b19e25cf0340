"""Opening an ONNX file from outside without letting it read files outside its folder.

An ONNX tensor may keep its bytes in an "external data" file named by a relative path
inside the model. A crafted model can point that path at /etc/passwd, ../../secrets or
a symlink out of its folder, and onnx.load would read it; so every location is checked
before any external data is loaded.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import onnx
from onnx import TensorProto

from export.errors import ExportLibraryError


class UnsafeModelError(ExportLibraryError):
    bad_input = True
    """An ONNX file refers to data outside its own folder."""


def _graph_tensors(graph: onnx.GraphProto) -> Iterator[TensorProto]:
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _graph_tensors(attr.g)
            for sub in attr.graphs:
                yield from _graph_tensors(sub)


def external_locations(model: onnx.ModelProto) -> list[str]:
    locations = []
    for tensor in _graph_tensors(model.graph):
        if tensor.data_location == TensorProto.EXTERNAL:
            entries = {e.key: e.value for e in tensor.external_data}
            locations.append(entries.get("location", ""))
    return locations


def check_external_data(path: str | Path) -> list[str]:
    """Raise UnsafeModelError for any location that is absolute, has '..', or resolves outside the folder."""
    path = Path(path)
    folder = path.parent.resolve()
    model = onnx.load(str(path), load_external_data=False)
    locations = external_locations(model)
    for location in locations:
        where = f"{path}: external data location {location!r}"
        if not location:
            raise UnsafeModelError(f"{where} is empty; re-export the model")
        if os.path.isabs(location) or Path(location).is_absolute():
            raise UnsafeModelError(f"{where} is an absolute path; external data must sit beside the model")
        if ".." in Path(location).parts:
            raise UnsafeModelError(f"{where} contains '..'; external data must sit beside the model")
        target = (folder / location).resolve()
        if folder not in target.parents:
            raise UnsafeModelError(f"{where} resolves to {target}, outside {folder} (a symlink?); refusing to read it")
    return locations


def load_onnx(path: str | Path) -> onnx.ModelProto:
    """onnx.load, after checking that every external-data location stays in the model's folder."""
    check_external_data(path)
    return onnx.load(str(path))
