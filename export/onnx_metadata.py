"""Key/value metadata carried inside an ONNX file (its ``metadata_props``), read back with onnx alone.

A file handed to another stage, machine or person must say what it was made for: which data
split it was judged and calibrated on and how its input is preprocessed. Anything kept only in
a run directory's manifest is lost when the file travels; the file's own properties are not.
"""
from __future__ import annotations

import json
from pathlib import Path

import onnx

DATA_KEY = "compress.data"  # the data identity: name, split digest, split sizes, preprocessing


def read_metadata(path: str | Path) -> dict[str, str]:
    model = onnx.load(str(path), load_external_data=False)
    return {prop.key: prop.value for prop in model.metadata_props}


def write_metadata(path: str | Path, props: dict[str, str]) -> None:
    """Set ``props`` (replacing same-named ones) in place; the weights are not touched or loaded:
    a file with external data keeps pointing at the same data files."""
    model = onnx.load(str(path), load_external_data=False)
    kept = [(p.key, p.value) for p in model.metadata_props if p.key not in props]
    del model.metadata_props[:]
    for key, value in [*kept, *props.items()]:
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(model, str(path))


def write_data_identity(path: str | Path, identity: dict) -> None:
    write_metadata(path, {DATA_KEY: json.dumps(identity, sort_keys=True)})


def read_data_identity(path: str | Path) -> dict | None:
    value = read_metadata(path).get(DATA_KEY)
    return json.loads(value) if value else None
