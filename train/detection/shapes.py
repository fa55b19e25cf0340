"""A seeded synthetic detection set written in COCO format: ``images/`` plus ``annotations/instances.json``.

No data set with boxes ships in any installed package, so tests, the reference pipeline and the
README's figures run on this one. It is written in exactly the format users have (and read back
by the same loader as theirs), so nothing about it is special-cased: rectangles, ellipses and
triangles of random colour and size on a noisy gradient background, 1–4 per image, overlapping
at most a little so every box is visible.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from train.atomic_io import atomic_dir

CATEGORIES = ("rectangle", "ellipse", "triangle")


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    base = rng.uniform(40, 200, size=3)
    tilt = rng.uniform(-60, 60, size=(2, 3))
    ys, xs = np.mgrid[0:size, 0:size] / size
    img = base + ys[..., None] * tilt[0] + xs[..., None] * tilt[1]
    img += rng.normal(0, 12, size=(size, size, 3))
    return img


def _mask(kind: str, x: int, y: int, w: int, h: int, size: int) -> np.ndarray:
    ys, xs = np.mgrid[0:size, 0:size] + 0.5
    if kind == "rectangle":
        return (xs >= x) & (xs < x + w) & (ys >= y) & (ys < y + h)
    if kind == "ellipse":
        return ((xs - x - w / 2) / (w / 2)) ** 2 + ((ys - y - h / 2) / (h / 2)) ** 2 <= 1.0
    # an upright triangle whose apex is the top middle of its box and whose base is the bottom edge
    frac = (ys - y) / h
    half = frac * w / 2
    return (ys >= y) & (ys < y + h) & (np.abs(xs - x - w / 2) <= half)


def _iou(a: tuple, b: tuple) -> float:
    ax, ay, aw, ah = a
    bx, by, bw, bh = b
    iw = max(0.0, min(ax + aw, bx + bw) - max(ax, bx))
    ih = max(0.0, min(ay + ah, by + bh) - max(ay, by))
    inter = iw * ih
    return inter / (aw * ah + bw * bh - inter)


def render(rng: np.random.Generator, size: int, min_side: int, max_side: int) -> tuple[np.ndarray, list[dict]]:
    """One image and its objects (COCO ``bbox`` as x, y, w, h in pixels, ``category`` index)."""
    img = _background(rng, size)
    objects: list[dict] = []
    for _ in range(int(rng.integers(1, 5))):
        for _attempt in range(20):
            w, h = (int(v) for v in rng.integers(min_side, max_side + 1, size=2))
            x, y = int(rng.integers(0, size - w + 1)), int(rng.integers(0, size - h + 1))
            if all(_iou((x, y, w, h), o["bbox"]) < 0.1 for o in objects):
                break
        else:
            continue
        category = int(rng.integers(0, len(CATEGORIES)))
        colour = rng.uniform(0, 255, size=3)
        while np.abs(colour - img[y:y + h, x:x + w].mean(axis=(0, 1))).max() < 60:  # visible against its ground
            colour = rng.uniform(0, 255, size=3)
        img[_mask(CATEGORIES[category], x, y, w, h, size)] = colour
        objects.append({"bbox": (x, y, w, h), "category": category})
    return np.clip(img, 0, 255).astype(np.uint8), objects


def write_shapes(folder: str | Path, *, images: int = 600, size: int = 128, seed: int = 0,
                 min_side: int | None = None, max_side: int | None = None) -> Path:
    """Write ``images`` seeded shape images of ``size``² and their COCO instances file; returns ``folder``.
    The folder appears whole or not at all (written beside it, then renamed)."""
    from PIL import Image

    folder = Path(folder)
    min_side = min_side or max(6, size // 10)
    max_side = max_side or size * 3 // 8
    rng = np.random.default_rng(seed)
    coco: dict = {"info": {"description": f"compress shapes, seed {seed}, {images} images of {size}x{size}"},
                  "categories": [{"id": i + 1, "name": name} for i, name in enumerate(CATEGORIES)],
                  "images": [], "annotations": []}
    with atomic_dir(folder) as tmp:
        (tmp / "images").mkdir()
        (tmp / "annotations").mkdir()
        for i in range(images):
            pixels, objects = render(rng, size, min_side, max_side)
            name = f"{i:06d}.png"
            Image.fromarray(pixels).save(tmp / "images" / name)
            coco["images"].append({"id": i + 1, "file_name": name, "width": size, "height": size})
            for obj in objects:
                x, y, w, h = obj["bbox"]
                coco["annotations"].append({"id": len(coco["annotations"]) + 1, "image_id": i + 1,
                                            "category_id": obj["category"] + 1, "bbox": [x, y, w, h],
                                            "area": w * h, "iscrowd": 0})
        (tmp / "annotations" / "instances.json").write_text(json.dumps(coco))
    return folder
