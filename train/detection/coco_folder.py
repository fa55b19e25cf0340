"""Read a COCO-format detection folder (``images/`` plus an instances JSON) into letterboxed tensors.

This is the format users' detection data is in. Every image is decoded once, resized to one square
size the way it is declared in ``preprocessing`` (``letterbox``: the longest side to the size, aspect
kept, centred on grey 114 as YOLO deployments pad; ``stretch``: both sides to the size), and its boxes
are moved into that same frame, so training, evaluation and a deployer feeding the ONNX file all see
the geometry the metadata names. Bad files fail with the file, the field and the fix.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from train.datasets import DataError

PAD_VALUE = 114
RESIZE_MODES = ("letterbox", "stretch")
STRIDE_MULTIPLE = 32  # the default size is the largest image side rounded up to this (every detector stride fits)


@dataclass
class DetectionRaw:
    images: torch.Tensor  # uint8 N×3×S×S, already in the model's frame
    targets: list[dict]  # per image: boxes float32 k×4 (x1, y1, x2, y2 in the model's frame), classes int64 k, crowd bool k
    class_names: list[str]
    category_ids: list[int]  # class index → the file's category id
    image_ids: list[int]
    file_names: list[str]
    frames: list[dict]  # per image: original width/height, scale and padding (to map boxes back)
    source: dict = field(default_factory=dict)


def find_annotations(folder: Path, annotations: str | None) -> Path:
    if annotations:
        path = Path(annotations)
        path = path if path.is_absolute() else folder / path
        if not path.is_file():
            raise DataError(f"data.annotations: {path} does not exist; give the instances JSON (relative to data.path "
                            "or absolute)")
        return path
    found = sorted(folder.glob("annotations/*.json")) + sorted(folder.glob("*.json"))
    if len(found) != 1:
        what = "no instances JSON" if not found else f"{len(found)} JSON files ({', '.join(p.name for p in found)})"
        raise DataError(f"data.path: {folder} has {what} in annotations/ or beside images/; name the one to use "
                        "with data.annotations")
    return found[0]


def _load_json(path: Path) -> dict:
    try:
        coco = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{path}: not a readable JSON file ({exc}); give a COCO instances file") from exc
    missing = [k for k in ("images", "annotations", "categories") if not isinstance(coco.get(k), list)]
    if not isinstance(coco, dict) or missing:
        raise DataError(f"{path}: a COCO instances file needs the lists images, annotations and categories; "
                        f"missing or not a list: {', '.join(missing)}")
    return coco


def _bbox(ann: dict, path: Path, width: int, height: int) -> tuple[float, float, float, float]:
    box = ann.get("bbox")
    where = f"{path}: annotations[id={ann.get('id')}].bbox"
    if not (isinstance(box, list) and len(box) == 4 and all(isinstance(v, (int, float)) for v in box)):
        raise DataError(f"{where} is {box!r}; it must be [x, y, width, height] in pixels")
    x, y, w, h = (float(v) for v in box)
    x1, y1, x2, y2 = max(0.0, x), max(0.0, y), min(float(width), x + w), min(float(height), y + h)
    if x2 - x1 <= 0 or y2 - y1 <= 0:
        raise DataError(f"{where} is {box!r}: empty inside the {width}×{height} image; fix or drop the annotation")
    return x1, y1, x2, y2


def frame_of(width: int, height: int, size: int, mode: str) -> dict:
    if mode == "stretch":
        return {"width": width, "height": height, "scale_x": size / width, "scale_y": size / height,
                "pad_x": 0, "pad_y": 0, "new_width": size, "new_height": size}
    scale = size / max(width, height)
    nw, nh = max(1, round(width * scale)), max(1, round(height * scale))
    return {"width": width, "height": height, "scale_x": nw / width, "scale_y": nh / height,
            "pad_x": (size - nw) // 2, "pad_y": (size - nh) // 2, "new_width": nw, "new_height": nh}


def _decode(path: Path, frame: dict, size: int) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(path) as img:
            rgb = img.convert("RGB")
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: cannot be read as an image ({exc}); replace the file or drop it from the JSON") from exc
    if rgb.size != (frame["width"], frame["height"]):
        raise DataError(f"{path}: is {rgb.size[0]}×{rgb.size[1]} but the JSON says {frame['width']}×{frame['height']}; "
                        "its boxes would be in another frame: fix the image's width/height in the JSON")
    resized = np.asarray(rgb.resize((frame["new_width"], frame["new_height"]), Image.BILINEAR), dtype=np.uint8)
    canvas = np.full((size, size, 3), PAD_VALUE, dtype=np.uint8)
    canvas[frame["pad_y"]:frame["pad_y"] + frame["new_height"], frame["pad_x"]:frame["pad_x"] + frame["new_width"]] = resized
    return canvas.transpose(2, 0, 1)


def _image_path(folder: Path, name: str, json_path: Path) -> Path:
    for candidate in (folder / "images" / name, folder / name):
        if candidate.is_file():
            return candidate
    raise DataError(f"{json_path}: image {name!r} is in neither {folder / 'images'} nor {folder}; add the file or "
                    "drop its entry from images")


def load_coco_folder(path: str | Path, size: int | None = None, mode: str = "letterbox",
                     annotations: str | None = None) -> DetectionRaw:
    folder = Path(path)
    if not folder.is_dir():
        raise DataError(f"data.path: {folder} is not a folder; give the folder holding images/ and the instances JSON")
    if mode not in RESIZE_MODES:
        raise DataError(f"data.resize is {mode!r}; use one of {', '.join(RESIZE_MODES)}")
    json_path = find_annotations(folder, annotations)
    coco = _load_json(json_path)
    categories = sorted(coco["categories"], key=lambda c: c.get("id", 0))
    if not categories:
        raise DataError(f"{json_path}: categories is empty; a detection set needs at least one category")
    class_of = {c["id"]: i for i, c in enumerate(categories)}
    images = sorted(coco["images"], key=lambda im: im["id"])
    if not images:
        raise DataError(f"{json_path}: images is empty")
    for im in images:
        if not all(isinstance(im.get(k), int) and im.get(k) > 0 for k in ("width", "height")) or "file_name" not in im:
            raise DataError(f"{json_path}: images[id={im.get('id')}] needs file_name and positive integer width and "
                            "height")
    if size is None:
        side = max(max(im["width"], im["height"]) for im in images)
        size = int(math.ceil(side / STRIDE_MULTIPLE) * STRIDE_MULTIPLE)
    by_image: dict[int, list[dict]] = {im["id"]: [] for im in images}
    for ann in coco["annotations"]:
        if ann.get("image_id") not in by_image:
            raise DataError(f"{json_path}: annotations[id={ann.get('id')}].image_id {ann.get('image_id')!r} names no "
                            "image in images; fix the id or drop the annotation")
        if ann.get("category_id") not in class_of:
            raise DataError(f"{json_path}: annotations[id={ann.get('id')}].category_id {ann.get('category_id')!r} is "
                            f"not in categories (ids {sorted(class_of)}); add the category or fix the id")
        by_image[ann["image_id"]].append(ann)
    pixels, targets, frames = [], [], []
    for im in images:
        frame = frame_of(im["width"], im["height"], size, mode)
        pixels.append(_decode(_image_path(folder, im["file_name"], json_path), frame, size))
        anns = by_image[im["id"]]
        boxes = np.array([_bbox(a, json_path, im["width"], im["height"]) for a in anns], dtype=np.float32).reshape(-1, 4)
        boxes[:, 0::2] = boxes[:, 0::2] * frame["scale_x"] + frame["pad_x"]
        boxes[:, 1::2] = boxes[:, 1::2] * frame["scale_y"] + frame["pad_y"]
        targets.append({"boxes": torch.from_numpy(boxes),
                        "classes": torch.tensor([class_of[a["category_id"]] for a in anns], dtype=torch.int64),
                        "crowd": torch.tensor([bool(a.get("iscrowd", 0)) for a in anns], dtype=torch.bool)})
        frames.append(frame)
    return DetectionRaw(
        images=torch.from_numpy(np.stack(pixels)), targets=targets,
        class_names=[str(c.get("name", c["id"])) for c in categories], category_ids=[c["id"] for c in categories],
        image_ids=[im["id"] for im in images], file_names=[im["file_name"] for im in images], frames=frames,
        source={"path": str(folder), "annotations": str(json_path), "images": len(images),
                "boxes": sum(len(t["classes"]) for t in targets)})
