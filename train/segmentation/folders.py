"""Read segmentation data as users have it into one square frame, image and mask moved together.

Three layouts: an image folder with index masks of the same stem (``images/`` and ``masks/``), the
Pascal VOC layout (``JPEGImages/``, ``SegmentationClass/``, ``ImageSets/Segmentation/*.txt``), and a
COCO folder whose instance or stuff annotations (polygons or RLE) are painted into class masks with
pycocotools. Every image is resized once the way ``preprocessing`` declares it (``letterbox``: the
longest side to the size, aspect kept, centred; ``stretch``: both sides), the image bilinearly and
its mask by nearest neighbour, so no class id is ever blended into another; letterbox padding is
``ignore_index`` in the mask, so the border is never scored. A mask of another size than its image,
a class id past the classes, or a missing mask stops with the file named and the fix.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from train.datasets import DataError
from train.detection.coco_folder import PAD_VALUE, RESIZE_MODES, STRIDE_MULTIPLE, frame_of

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp")
# The 21 classes of Pascal VOC 2012 segmentation, index order (0 is background, 255 the void border).
VOC_CLASSES = ("background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
               "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train",
               "tvmonitor")


@dataclass
class MaskRaw:
    """Images and masks already in the model's frame, and where each came from."""

    images: torch.Tensor  # uint8 N×3×S×S
    masks: torch.Tensor  # uint8 N×S×S: class index per pixel, ignore_index where unscored
    class_names: list[str]
    files: list[str]
    lists: dict[str, list[int]] = field(default_factory=dict)  # a named split (VOC's train/val) → row numbers
    source: dict = field(default_factory=dict)


@dataclass
class MaskReading:
    """How masks are read: the classes, the unscored value, and an RGB palette where masks are in colour."""

    size: int | None = None
    mode: str = "letterbox"
    ignore_index: int = 255
    class_names: list[str] | None = None
    palette: list[list[int]] | None = None


def _open_rgb(path: Path) -> "Image.Image":  # noqa: F821
    from PIL import Image

    try:
        with Image.open(path) as img:
            return img.convert("RGB")
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: cannot be read as an image ({exc}); replace the file or remove it") from exc


def _mask_indices(path: Path, reading: MaskReading) -> np.ndarray:
    """A mask file's class index per pixel: a palette (P) or grey (L) PNG holds the indices themselves; an RGB
    mask is mapped through ``palette`` (colour i is class i), any other colour is refused."""
    from PIL import Image

    try:
        with Image.open(path) as img:
            mode = img.mode
            if mode in ("P", "L", "I;16", "I"):
                return np.asarray(img if mode in ("P", "L") else img.convert("I")).astype(np.int64)
            rgb = np.asarray(img.convert("RGB"))
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: cannot be read as a mask ({exc}); replace the file") from exc
    if reading.palette is None:
        raise DataError(f"{path}: an RGB mask; give data.palette (one [r, g, b] per class, in class order) or save "
                        "the masks as index PNGs (mode P or L, one class id per pixel)")
    out = np.full(rgb.shape[:2], -1, dtype=np.int64)
    for index, colour in enumerate(reading.palette):
        out[np.all(rgb == np.asarray(colour, dtype=np.uint8), axis=-1)] = index
    unknown = out < 0
    if unknown.any():
        y, x = (int(v[0]) for v in np.nonzero(unknown))
        raise DataError(f"{path}: pixel ({x}, {y}) has colour {tuple(int(c) for c in rgb[y, x])}, which is not in "
                        "data.palette; add it (its place is its class id) or fix the mask")
    return out


def place(image: "Image.Image", mask: np.ndarray, size: int, mode: str, ignore_index: int,  # noqa: F821
          ) -> tuple[np.ndarray, np.ndarray]:
    """Image (H×W×3) and mask (H×W) in the model's square frame: bilinear for the image, nearest for the
    mask; the letterbox border grey 114 in the image and ``ignore_index`` in the mask."""
    from PIL import Image

    width, height = image.size
    frame = frame_of(width, height, size, mode)
    new = (frame["new_width"], frame["new_height"])
    pixels = np.asarray(image.resize(new, Image.BILINEAR), dtype=np.uint8)
    labels = np.asarray(Image.fromarray(mask.astype(np.int32)).resize(new, Image.NEAREST)).astype(np.int64)
    canvas = np.full((size, size, 3), PAD_VALUE, dtype=np.uint8)
    target = np.full((size, size), ignore_index, dtype=np.int64)
    ys, xs = slice(frame["pad_y"], frame["pad_y"] + new[1]), slice(frame["pad_x"], frame["pad_x"] + new[0])
    canvas[ys, xs], target[ys, xs] = pixels, labels
    return canvas, target


def _default_size(sizes: list[tuple[int, int]]) -> int:
    return int(math.ceil(max(max(s) for s in sizes) / STRIDE_MULTIPLE) * STRIDE_MULTIPLE)


def _known_classes(reading: MaskReading, folder: Path, default: tuple[str, ...] | None) -> list[str] | None:
    """The class names where they are given (data.class_names, classes.txt, the layout's own); None: counted from
    the masks."""
    if reading.class_names:
        return list(reading.class_names)
    listed = folder / "classes.txt"
    if listed.is_file():
        names = [line.strip() for line in listed.read_text().splitlines() if line.strip()]
        if names:
            return names
    return list(default) if default is not None else None


def _image_size(path: Path) -> tuple[int, int]:
    from PIL import Image

    try:
        with Image.open(path) as img:
            return img.size
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: cannot be read as an image ({exc}); replace the file or remove it") from exc


def _out_of_range(values: np.ndarray, classes: int, where: Path, ignore_index: int) -> DataError | None:
    bad = values[(values < 0) | (values >= classes)]
    if not bad.size:
        return None
    return DataError(f"{where}: class id {int(bad[0])} is out of range: there are {classes} classes (0…{classes - 1}) "
                     f"and {ignore_index} is ignored; fix the mask, or name every class in data.class_names (or "
                     "classes.txt)")


def _assemble(pairs: list[tuple[Path, Path | None, np.ndarray | None]], reading: MaskReading, folder: Path,
              default_classes: tuple[str, ...] | None, source: dict) -> MaskRaw:
    """Decode every (image, mask file or painted mask) pair into the frame one at a time (the originals are never
    all in memory), checking each mask against its image and the classes."""
    if not pairs:
        raise DataError(f"data.path: {folder} holds no image with a mask")
    if reading.mode not in RESIZE_MODES:
        raise DataError(f"data.resize is {reading.mode!r}; use one of {', '.join(RESIZE_MODES)}")
    if not 0 <= reading.ignore_index <= 255:
        raise DataError(f"data.ignore_index is {reading.ignore_index}; masks are stored as bytes: use 0…255 (255 is "
                        "the usual void value)")
    known = _known_classes(reading, folder, default_classes)
    if known is not None and len(known) > reading.ignore_index:
        raise DataError(f"{folder}: {len(known)} classes reach data.ignore_index {reading.ignore_index}; set "
                        "ignore_index above the last class id")
    size = reading.size or _default_size([_image_size(image) for image, _, _ in pairs])
    images = torch.empty((len(pairs), 3, size, size), dtype=torch.uint8)
    masks = torch.empty((len(pairs), size, size), dtype=torch.uint8)
    found_max = 0
    for row, (image_path, mask_path, painted) in enumerate(pairs):
        image = _open_rgb(image_path)
        mask = painted if painted is not None else _mask_indices(mask_path, reading)  # type: ignore[arg-type]
        where = mask_path or image_path
        if mask.shape != (image.size[1], image.size[0]):
            raise DataError(f"{where}: the mask is {mask.shape[1]}×{mask.shape[0]} but its image {image_path.name} is "
                            f"{image.size[0]}×{image.size[1]}; a mask must cover its image pixel for pixel: re-export "
                            "it at the image's size")
        scored = mask[mask != reading.ignore_index]
        problem = _out_of_range(scored, len(known) if known is not None else reading.ignore_index, where,
                                reading.ignore_index)
        if problem is not None:
            raise problem
        found_max = max(found_max, int(scored.max()) if scored.size else 0)
        pixels, labels = place(image, mask, size, reading.mode, reading.ignore_index)
        images[row] = torch.from_numpy(pixels).permute(2, 0, 1)
        masks[row] = torch.from_numpy(labels.astype(np.uint8))
    class_names = known if known is not None else [f"class_{i}" for i in range(found_max + 1)]
    if len(class_names) < 2:
        raise DataError(f"{folder}: {len(class_names)} class; segmentation needs at least two (background and one)")
    _check_not_binary_void(masks, class_names, reading.ignore_index, folder)
    return MaskRaw(images=images, masks=masks, class_names=class_names, files=[str(p[0]) for p in pairs],
                   source={**source, "images": len(pairs), "size": size})


def _check_not_binary_void(masks: torch.Tensor, class_names: list[str], ignore_index: int, folder: Path) -> None:
    """Refuse 0/255 object masks read with 255 as the unscored value: every object pixel would be ignored and a
    model answering background everywhere would score a perfect mIoU."""
    seen = torch.bincount(masks.reshape(-1).long(), minlength=256)
    ignored = float(seen[ignore_index]) / max(int(seen.sum()), 1)
    missing = [name for i, name in enumerate(class_names) if i > 0 and seen[i] == 0]
    if missing and ignored > 0.2:
        raise DataError(f"{folder}: {ignored:.0%} of mask pixels are ignore_index {ignore_index} and no mask holds "
                        f"{', '.join(missing)}: object masks saved as 0/{ignore_index}? Save the object as class 1, "
                        f"or set data.ignore_index to a value the masks never use")


def _require(folder: Path, subfolders: tuple[str, ...], layout: str) -> list[Path]:
    """The layout's sub-folders of ``folder``; a DataError naming the first one missing and what the layout holds."""
    for name in subfolders:
        if not (folder / name).is_dir():
            raise DataError(f"data.path: {folder} has no {name}/ folder; {layout}")
    return [folder / name for name in subfolders]


def _images_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())


def load_mask_folder(path: str | Path, reading: MaskReading) -> MaskRaw:
    """``images/`` and ``masks/``: each image's mask is the PNG of the same stem in ``masks/``."""
    folder = Path(path)
    images_dir, masks_dir = _require(folder, ("images", "masks"), "a mask folder holds images/ and masks/ (an index "
                                     "PNG of the same stem per image)")
    masks = {p.stem: p for p in masks_dir.iterdir() if p.suffix.lower() == ".png"}
    pairs = []
    for image in _images_in(images_dir):
        if image.stem not in masks:
            raise DataError(f"{image}: no mask {masks_dir / (image.stem + '.png')}; add it, or move the image out "
                            "of images/")
        pairs.append((image, masks[image.stem], None))
    return _assemble(pairs, reading, folder, None, {"path": str(folder), "layout": "masks"})


def load_voc(path: str | Path, reading: MaskReading) -> MaskRaw:
    """Pascal VOC: the images listed in ``ImageSets/Segmentation/*.txt`` (every image with a mask where there is
    no list), ``JPEGImages/<id>.jpg`` and ``SegmentationClass/<id>.png``; the lists come back as named splits."""
    folder = Path(path)
    jpegs, classes_dir = _require(folder, ("JPEGImages", "SegmentationClass"), "give the VOC folder (VOC2012 itself, "
                                  "holding JPEGImages/, SegmentationClass/ and ImageSets/Segmentation/)")
    list_dir = folder / "ImageSets" / "Segmentation"
    lists = {p.stem: [line.split()[0] for line in p.read_text().splitlines() if line.strip()]
             for p in sorted(list_dir.glob("*.txt"))} if list_dir.is_dir() else {}
    lists.pop("trainval", None)  # the union of train and val, not a split of its own
    ids = list(dict.fromkeys(i for names in lists.values() for i in names)) if lists else \
        sorted(p.stem for p in classes_dir.glob("*.png"))
    pairs = []
    for image_id in ids:
        mask = classes_dir / f"{image_id}.png"
        if not mask.is_file():
            raise DataError(f"{mask}: missing; {image_id} is listed in ImageSets/Segmentation but has no mask")
        image = next((jpegs / f"{image_id}{s}" for s in (".jpg", ".jpeg", ".png") if (jpegs / f"{image_id}{s}").is_file()),
                     None)
        if image is None:
            raise DataError(f"{jpegs / (image_id + '.jpg')}: missing; its mask {mask.name} has no image")
        pairs.append((image, mask, None))
    raw = _assemble(pairs, reading, folder, VOC_CLASSES, {"path": str(folder), "layout": "voc"})
    row = {image_id: i for i, image_id in enumerate(ids)}
    raw.lists = {name: [row[i] for i in names] for name, names in lists.items()}
    return raw


def load_coco_masks(path: str | Path, reading: MaskReading, annotations: str | None = None) -> MaskRaw:
    """A COCO folder's instance or stuff annotations painted into class masks: class 0 is background (pixels no
    annotation covers), category k the (k+1)-th by id; larger objects first so a smaller one on top stays seen;
    crowd regions ``ignore_index``."""
    from pycocotools import mask as coco_mask

    from train.detection.coco_folder import _image_path, _load_json, find_annotations

    folder = Path(path)
    json_path = find_annotations(folder, annotations)
    coco = _load_json(json_path)
    categories = sorted(coco["categories"], key=lambda c: c.get("id", 0))
    class_of = {c["id"]: i + 1 for i, c in enumerate(categories)}
    by_image: dict[int, list[dict]] = {im["id"]: [] for im in coco["images"]}
    for ann in coco["annotations"]:
        if ann.get("image_id") not in by_image or ann.get("category_id") not in class_of:
            raise DataError(f"{json_path}: annotations[id={ann.get('id')}] names image {ann.get('image_id')!r} or "
                            f"category {ann.get('category_id')!r}, which the file does not hold; fix the ids")
        if "segmentation" not in ann:
            raise DataError(f"{json_path}: annotations[id={ann.get('id')}] has no segmentation (polygons or RLE); "
                            "semantic masks need them")
        by_image[ann["image_id"]].append(ann)
    pairs = []
    for im in sorted(coco["images"], key=lambda im: im["id"]):
        height, width = im["height"], im["width"]
        painted = np.zeros((height, width), dtype=np.int64)
        for ann in sorted(by_image[im["id"]], key=lambda a: -float(a.get("area", 0))):
            seg = ann["segmentation"]
            if isinstance(seg, list):
                rle = coco_mask.merge(coco_mask.frPyObjects(seg, height, width))
            elif isinstance(seg.get("counts"), list):
                rle = coco_mask.frPyObjects(seg, height, width)
            else:
                rle = seg
            covered = coco_mask.decode(rle).astype(bool)
            painted[covered] = reading.ignore_index if ann.get("iscrowd", 0) else class_of[ann["category_id"]]
        pairs.append((_image_path(folder, im["file_name"], json_path), None, painted))
    names = ["background", *(str(c.get("name", c["id"])) for c in categories)]
    return _assemble(pairs, MaskReading(**{**reading.__dict__, "class_names": reading.class_names or names}),
                     folder, None, {"path": str(folder), "layout": "coco", "annotations": str(json_path)})
