"""A folder of image files turned into input tensors the way a deployed file says it wants them.

A released bundle is checked on images a deployer has, not on a run's arrays: the input
tensor is made only from what the file's metadata states (colour mode, size, resize, the
pixel divisor, mean and std), so a wrong or missing entry there shows up as a wrong accuracy.
The arithmetic is the training data path's (float32 ``pixel / 255``, minus mean, over std),
so the test split written out as images gives back the very tensors it was judged on.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from serve_bench.errors import BenchError
from train.datasets import IMAGE_SUFFIXES


class ImageFolderError(BenchError):
    """A folder that is not one sub-folder per class of images, or an image that does not decode."""

    bad_input = True


@dataclass
class LabelledImages:
    images: np.ndarray  # float32 N×C×H×W, ready for the model
    labels: np.ndarray  # int64 N: indices into the class names


def to_input(path: Path, spec: dict) -> np.ndarray:
    """One image file as the C×H×W float32 array ``spec`` (an ONNX file's preprocessing entry) describes."""
    from PIL import Image

    try:
        with Image.open(path) as img:
            img = img.convert(spec["color"]).resize((spec["width"], spec["height"]), Image.BILINEAR)
            pixels = np.asarray(img, dtype=np.float32)
    except OSError as exc:
        raise ImageFolderError(f"cannot read image {path}: {exc}; remove or replace the file") from exc
    pixels = pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)
    mean = np.asarray(spec["mean"], dtype=np.float32).reshape(-1, 1, 1)
    std = np.asarray(spec["std"], dtype=np.float32).reshape(-1, 1, 1)
    return (pixels / np.float32(spec["pixel_divisor"]) - mean) / std


def read_labelled_folder(root: str | Path, spec: dict, class_names: list[str]) -> LabelledImages:
    """Every image under ``root/<class name>/``, ordered by file name (then folder), so a split written
    out with its indices as file names comes back in its own order."""
    root = Path(root)
    if not root.is_dir():
        raise ImageFolderError(f"{root} is not a folder; give a folder with one sub-folder per class")
    index = {name: i for i, name in enumerate(class_names)}
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    unknown = [p.name for p in folders if p.name not in index]
    if unknown:
        raise ImageFolderError(f"{root}: sub-folder(s) {', '.join(unknown[:5])} name no class of the model "
                               f"(classes: {', '.join(class_names[:20])}); name each sub-folder after its class")
    files = [(p, index[folder.name]) for folder in folders for p in folder.iterdir()
             if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES]
    if not files:
        raise ImageFolderError(f"{root} holds no images in class sub-folders ({', '.join(sorted(IMAGE_SUFFIXES))})")
    files.sort(key=lambda item: (item[0].name, item[0].parent.name))
    images = np.stack([to_input(path, spec) for path, _ in files])
    return LabelledImages(images, np.array([label for _, label in files], dtype=np.int64))
