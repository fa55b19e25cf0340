"""Refuse to judge a model on data it was not made for.

A model artifact or ONNX file records the data identity it was trained, calibrated or judged
on (split digest, preprocessing). A stage that evaluates, calibrates or trains it on a split
with another digest could be measuring it on its own training images: with the digits set, a
model trained with ``split_seed: 1`` had 72% of the default split's test images in its training
set. So such a stage refuses, unless the user states that the test data is independent; a
different preprocessing is refused always, since the model would see differently scaled inputs.
"""
from __future__ import annotations

import json
from pathlib import Path

from compress.errors import ArtifactError, DataMismatchError
from compress.stages.base import InputArtifact
from export.external_data import UnsafeModelError, check_external_data
from export.onnx_metadata import read_data_identity
from export.tensorrt_engine import ENGINE_KIND
from train.data import DataBundle
from train.model_io import DESCRIPTION_FILE, read_description
from train.models import ModelError

_SHAPE = ("channels", "height", "width")
_TOLERANCE = 1e-5  # mean/std are recorded rounded to 6 decimals


def recorded_identity(artifact: InputArtifact) -> dict | None:
    """The data identity an artifact records, or None where it records none."""
    path = Path(artifact.path)
    try:
        if artifact.kind == "torch-model" or (path / DESCRIPTION_FILE).is_file():  # a torch file of any runtime
            return read_description(path).get("data")
        if artifact.kind == "onnx":
            file = path / artifact.meta.get("file", "model.onnx") if path.is_dir() else path
            check_external_data(file)  # a hostile file is refused for that first, whatever it records
            return read_data_identity(file)
        if artifact.kind == ENGINE_KIND:
            meta_file = path / "engine.json" if path.is_dir() else path.with_name("engine.json")
            meta = json.loads(meta_file.read_text()) if meta_file.is_file() else artifact.meta
            value = (meta.get("onnx_metadata") or {}).get("compress.data")
            return json.loads(value) if value else None
    except UnsafeModelError as exc:
        raise ArtifactError(f"input {artifact.name}: {exc}") from exc
    except (ModelError, OSError, ValueError) as exc:
        raise ArtifactError(f"input {artifact.name}: cannot read the data it was made for ({exc})") from exc
    return None


def preprocessing_difference(recorded: dict, current: dict) -> list[str]:
    differ = [f"{k} {recorded.get(k)} vs {current.get(k)}" for k in _SHAPE if recorded.get(k) != current.get(k)]
    for key in ("mean", "std"):
        a, b = recorded.get(key), current.get(key)
        if a is None or b is None or len(a) != len(b) or any(abs(x - y) > _TOLERANCE for x, y in zip(a, b)):
            differ.append(f"{key} {a} vs {b}")
    return differ


def check_same_data(artifact: InputArtifact, data: DataBundle, *, source: str, independent: bool) -> None:
    """Raise DataMismatchError when ``artifact`` was made on other data than ``data`` (see module doc)."""
    if artifact.kind not in ("torch-model", "onnx", ENGINE_KIND) and not (Path(artifact.path) / DESCRIPTION_FILE).is_file():
        return
    recorded = recorded_identity(artifact)
    current = data.identity()
    fix = (f"run it with the data section of the pipeline that made it, or, only if {source}'s test images share "
           "none with the images it was trained on, say so: data.independent_test=true")
    if recorded is None:
        if not independent:
            raise DataMismatchError(
                f"input {artifact.name} does not record the data split it was made on (made by an older version or "
                f"outside compress), so its test images could be its own training images; {fix}")
        return
    if recorded.get("split_digest") != current["split_digest"] and not independent:
        raise DataMismatchError(
            f"input {artifact.name} was made on data split {str(recorded.get('split_digest'))[:12]}… "
            f"({recorded.get('name')}, sizes {recorded.get('sizes')}), but {source} uses split "
            f"{current['split_digest'][:12]}… ({current['name']}, sizes {current['sizes']}): its test images can "
            f"be images the model trained on; {fix}")
    pre = recorded.get("preprocessing") or {}
    differ = preprocessing_difference(pre, current["preprocessing"])
    if differ:
        raise DataMismatchError(
            f"input {artifact.name} expects other input preprocessing than {source}'s data gives it "
            f"({'; '.join(differ)}), so it would see differently scaled images; set data.image_size and "
            f"data.channels to the model's and data.mean: {pre.get('mean')}, data.std: {pre.get('std')}")
