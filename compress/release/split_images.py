"""`compress images`: a split of a run's data written out as image files, one folder per class.

A bundle's accuracy is checked on image files (what a deployer has), so the held-out test
split must exist as files: lossless PNGs of the very pixels the run judged, named by their
place in the split, so that reading them back in file-name order restores the split's order
(and its digest).
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from compress.errors import ArtifactError, ConfigError
from compress.pipeline.pipeline_data import load_section
from compress.pipeline.pipeline_file import load_pipeline
from train.atomic_io import atomic_dir
from train.data import DataBundle

logger = logging.getLogger(__name__)
CHUNK = 1024  # images decoded at once: a large split never sits in memory whole


def write_split_images(data: DataBundle, split: str, to: Path) -> int:
    """Write ``split`` of ``data`` under ``to/<class name>/<split>-<index>.png``; the count written."""
    from PIL import Image

    to = Path(to)
    if to.exists() and (not to.is_dir() or any(to.iterdir())):
        raise ConfigError(f"--to {to}: it exists and is not an empty folder; give a new folder")
    unsafe = [c for c in data.class_names if not c or c.startswith(".") or "/" in c or "\\" in c]
    if unsafe:
        raise ConfigError(f"class name(s) {unsafe[:5]} cannot name a folder; these images cannot be written as "
                          "class folders")
    part = getattr(data, split)
    labels = part.labels.numpy()
    with atomic_dir(to) as work:  # an existing `to` is empty, checked above
        for name in data.class_names:
            (work / name).mkdir()
        width = len(str(len(labels)))
        for start in range(0, len(labels), CHUNK):  # uint8 C×H×W pixels as stored, before normalisation
            chunk = part.take(torch.arange(start, min(start + CHUNK, len(labels)))).numpy()
            for index, image in enumerate(chunk, start):
                array = image[0] if image.shape[0] == 1 else image.transpose(1, 2, 0)
                Image.fromarray(np.ascontiguousarray(array)).save(
                    work / data.class_names[labels[index]] / f"{split}-{index:0{width}d}.png")
    logger.info("wrote %d %s images to %s", len(labels), split, to)
    return len(labels)


def write_run_split(run_dir: Path, split: str, to: Path) -> int:
    """The split of the data a run used, as its resolved pipeline names it."""
    resolved = Path(run_dir) / "pipeline.resolved.yaml"
    if not resolved.is_file():
        raise ArtifactError(f"{resolved} is missing: give the run directory of a `compress run`")
    pipeline = load_pipeline(resolved)
    return write_split_images(load_section(pipeline.config.data, str(resolved)), split, to)
