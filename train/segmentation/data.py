"""Segmentation data in the splits, digests and batches classification uses.

A segmentation split is an ordinary ``Split`` whose labels are the masks themselves (uint8 N×H×W, one
class id per pixel, ``ignore_index`` where unscored): the batch stream, the seeded split permutation,
the calibration subset and the split digest (which hashes every mask pixel) are shared, not copied.
"""
from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from train.data import DataBundle, DataSpec, Split, _split_indices, _train_stats
from train.datasets import DataError, RawDataset
from train.decode_cache import default_cache_dir
from train.segmentation.folders import MaskRaw, MaskReading, load_coco_masks, load_mask_folder, load_voc
from train.detection.shapes import GENERATOR_VERSION as SHAPES_VERSION
from train.segmentation.scenes import GENERATOR_VERSION, write_scenes

SEGMENTATION_DATASETS = ("masks", "voc", "coco_masks", "scenes")
logger = logging.getLogger(__name__)


@dataclass
class SegmentationBundle(DataBundle):
    ignore_index: int = 255
    resize: str = "letterbox"
    task: str = "segmentation"

    def preprocessing(self) -> dict:
        return {**super().preprocessing(), "resize": self.resize, "pad_value": 114 if self.resize == "letterbox" else None,
                "classes": self.class_names, "ignore_index": self.ignore_index,
                "output": "logits N×classes×H×W at the input's resolution; argmax over classes is the mask"}

    def digest(self) -> str:
        """The split digest, which covers every mask pixel, and what the masks mean: the class names, the unscored
        value and the resize (a model made under other names or another void value is not this data's)."""
        cached = self.__dict__.get("_digest")
        if cached is not None:
            return cached
        h = hashlib.sha256(super().digest().encode())
        h.update(json.dumps({"classes": self.class_names, "ignore_index": self.ignore_index,
                             "resize": self.resize}, sort_keys=True).encode())
        self.__dict__["_digest"] = h.hexdigest()
        return self.__dict__["_digest"]

    def judging_facts(self, split: str) -> dict:
        """The masks are the labels; the classes and the unscored value say how to read them."""
        return {"num_classes": self.num_classes, "ignore_index": self.ignore_index, "class_names": self.class_names}

    def summary(self) -> dict:
        scored = {s: int((getattr(self, s).labels != self.ignore_index).sum()) for s in ("train", "val", "calib", "test")}
        return {**super().summary(), "task": "segmentation", "ignore_index": self.ignore_index, "scored_pixels": scored}


def scenes_folder(spec: DataSpec) -> Path:
    """The generated scenes for ``spec`` (written once into the cache folder, then read like a user's)."""
    size = spec.image_size or 96
    root = Path(spec.cache_dir) if spec.cache_dir else default_cache_dir()
    # the scenes paint the shapes generator's backgrounds and masks: a change to either names another folder
    folder = root / (f"scenes-v{GENERATOR_VERSION}.{SHAPES_VERSION}-n{spec.synthetic_samples}-s{size}-"
                     f"seed{spec.split_seed}")
    if not (folder / "classes.txt").is_file():
        root.mkdir(parents=True, exist_ok=True)
        write_scenes(folder, images=spec.synthetic_samples, size=size, seed=spec.split_seed)
    return folder


def _read(spec: DataSpec) -> MaskRaw:
    reading = MaskReading(size=spec.image_size, mode=spec.resize, ignore_index=spec.ignore_index,
                          class_names=spec.class_names, palette=spec.palette)
    if spec.name == "scenes":
        return load_mask_folder(scenes_folder(spec), MaskReading(**{**reading.__dict__, "size": spec.image_size or 96}))
    if not spec.path:
        raise DataError(f"data.path is required for {spec.name}: the folder holding the images and masks")
    if spec.name == "masks":
        return load_mask_folder(spec.path, reading)
    if spec.name == "voc":
        return load_voc(spec.path, reading)
    if spec.name == "coco_masks":
        return load_coco_masks(spec.path, reading, spec.annotations)
    raise DataError(f"{spec.name!r} is not a segmentation data set; use one of {', '.join(SEGMENTATION_DATASETS)}")


def _named_splits(raw: MaskRaw, spec: DataSpec) -> dict[str, torch.Tensor] | None:
    """VOC's lists as the splits, where it names them: ``test`` (else ``val``) is the test split, ``val`` (where a
    test list exists) the validation split, and validation is otherwise carved from ``train`` by val_fraction."""
    lists = raw.lists
    train_list = next((name for name in ("train", "trainaug") if name in lists), None)  # trainaug: SBD's larger list
    if train_list is None or not ({"val", "test"} & set(lists)):
        if lists:
            logger.info("%s: the lists %s do not name a train and a val (or test) split: the project splits the "
                        "images", spec.path, ", ".join(sorted(lists)))
        return None  # one list or none: split by the project, as the other tasks are
    held = set(lists.get("test", [])) | set(lists.get("val", []))
    shared = held & set(lists[train_list])
    if shared:
        raise DataError(f"{spec.path}: {len(shared)} images are in the {train_list} list and in a held-out list (val or "
                        "test): a model would be judged on images it trained on; remove them from one list")
    logger.info("%s: splits from ImageSets/Segmentation: %s for training, %s for test", spec.path, train_list,
                "test" if "test" in lists else "val")
    gen = torch.Generator().manual_seed(spec.split_seed)
    train = torch.tensor(lists[train_list], dtype=torch.int64)
    test = torch.tensor(lists["test"] if "test" in lists else lists["val"], dtype=torch.int64)
    if "test" in lists and "val" in lists:
        val = torch.tensor(lists["val"], dtype=torch.int64)
    else:
        train = train[torch.randperm(len(train), generator=gen)]
        n_val = max(1, int(round(len(train) * spec.val_fraction)))
        val, train = train[:n_val], train[n_val:]
    if len(train) == 0:
        raise DataError(f"{spec.path}: the train list leaves no training image after validation; lower "
                        "data.val_fraction")
    calib = train[torch.randperm(len(train), generator=gen)[: min(spec.calib_size, len(train))]]
    return {"train": train, "val": val, "calib": calib, "test": test}


def load_segmentation(spec: DataSpec) -> SegmentationBundle:
    if spec.channels not in (None, 3):
        raise DataError("data.channels: segmentation reads RGB images; drop channels or set it to 3")
    raw = _read(spec)
    indices = _named_splits(raw, spec) or _split_indices(spec, RawDataset(
        images=raw.images, labels=torch.arange(len(raw.masks)), num_classes=len(raw.class_names),
        class_names=raw.class_names))
    splits = {k: Split(raw.images[v].contiguous(), raw.masks[v].contiguous()) for k, v in indices.items()}
    for name in ("val", "test"):  # mIoU of a split with no scored pixel is undefined: say so instead of NaN
        if not bool((splits[name].labels != spec.ignore_index).any()):
            raise DataError(f"{spec.path or spec.name}: the {name} split ({len(indices[name])} images) has no scored "
                            f"pixel (every mask pixel is ignore_index {spec.ignore_index}); raise "
                            f"data.{name}_fraction or check the masks")
    if spec.mean is not None and spec.std is not None:
        mean, std = list(spec.mean), list(spec.std)
    else:
        mean, std = _train_stats(splits["train"], spec.split_seed)
    if len(mean) != 3 or len(std) != 3:
        raise DataError(f"data.mean/std have {len(mean)}/{len(std)} values; segmentation images have 3 channels")
    source = {**raw.source, **({"generator": "scenes", "seed": spec.split_seed} if spec.name == "scenes" else {})}
    return SegmentationBundle(
        name=spec.name, num_classes=len(raw.class_names), class_names=raw.class_names,
        mean=[round(m, 6) for m in mean], std=[round(s, 6) for s in std], meaningful_accuracy=True,
        source=source, split_indices=indices, ignore_index=spec.ignore_index, resize=spec.resize, **splits)
