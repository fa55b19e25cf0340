"""Writes a class-per-folder image tree of generated JPEGs, for scale tests of the data path.

A data set larger than memory is needed to show that training reads from the on-disk decode
cache and not from RAM; downloading one is not an option on an offline machine, so this makes
one. Each class has its own colour and stripe frequency under per-image noise, so a model can
learn it (accuracy on it means "the pipeline works", not "the model is good").

    python -m train.generated_folder OUT --images 200000 --size 224 --classes 10 --workers 2
"""
from __future__ import annotations

import argparse
import logging
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)


def _image(label: int, index: int, size: int, classes: int) -> np.ndarray:
    rng = np.random.default_rng(index)
    hue = np.array([np.cos(2 * np.pi * label / classes), np.sin(2 * np.pi * label / classes), 0.5]) * 60 + 128
    y = np.linspace(0, 1, size, dtype=np.float32)
    stripes = np.sin(2 * np.pi * (2 + label) * (y[:, None] + rng.uniform(0, 1))) * 40  # horizontal stripes
    base = hue[None, None, :] + stripes[:, :, None]
    noise = rng.normal(0, 25, (size // 8, size // 8, 3)).repeat(8, 0).repeat(8, 1)
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def _write_chunk(args: tuple[str, int, int, int, int]) -> int:
    from PIL import Image

    root, start, stop, size, classes = args
    for index in range(start, stop):
        label = index % classes
        path = Path(root) / f"class_{label:02d}" / f"{index:07d}.jpg"
        Image.fromarray(_image(label, index, size, classes)).save(path, quality=85)
    return stop - start


def write_folder(root: Path, images: int, size: int, classes: int, workers: int) -> float:
    """Write the tree; returns the seconds it took. An existing folder is refused, never mixed into."""
    root = Path(root)
    if root.exists():
        raise FileExistsError(f"{root} exists; choose a new folder")
    for label in range(classes):
        (root / f"class_{label:02d}").mkdir(parents=True)
    start = time.perf_counter()
    chunk = 2000
    jobs = [(str(root), s, min(s + chunk, images), size, classes) for s in range(0, images, chunk)]
    done = 0
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for count in pool.map(_write_chunk, jobs):
            done += count
            logger.info("%d/%d images written", done, images)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--images", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    seconds = write_folder(args.out, args.images, args.size, args.classes, args.workers)
    logger.info("wrote %d images of %dx%d to %s in %.0f s", args.images, args.size, args.size, args.out, seconds)


if __name__ == "__main__":
    main()
