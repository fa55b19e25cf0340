"""Detection data in the splits, digests and batches classification uses.

A detection split is an ordinary ``Split`` whose labels are row numbers into the bundle's
``targets`` (boxes and classes per image): the batch stream, the seeded split permutation, the
calibration subset and the split digest (which here also hashes every box) are shared with
classification rather than copied.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import torch

from train.data import DataBundle, DataSpec, Split, _split_indices, _train_stats
from train.datasets import DataError, RawDataset
from train.decode_cache import default_cache_dir
from train.detection.coco_folder import load_coco_folder
from train.detection.postprocess import NmsSettings
from train.detection.shapes import GENERATOR_VERSION, write_shapes

DETECTION_DATASETS = ("coco", "shapes")


@dataclass
class DetectionBundle(DataBundle):
    targets: list[dict] = field(default_factory=list, repr=False)  # per source row (labels index into it)
    category_ids: list[int] = field(default_factory=list)
    resize: str = "letterbox"
    task: str = "detection"
    # How this run measures mAP (the pipeline's nms section, set by the runner): not data, and not in the digest,
    # but it travels with the boxes so every stage that scores them scores alike.
    nms: NmsSettings = field(default_factory=NmsSettings)

    def boxes_of(self, rows: torch.Tensor) -> list[dict]:
        return [self.targets[int(r)] for r in rows.tolist()]

    def split_targets(self, split: str) -> list[dict]:
        return self.boxes_of(getattr(self, split).labels)

    def judging_facts(self, split: str) -> dict:
        """The boxes of the split's images; the digest covers them too (the bundle's split digest does)."""
        return {"digest": f"detection:{self.digest()}", "targets": self.split_targets(split),
                "num_classes": self.num_classes}

    def preprocessing(self) -> dict:
        return {**super().preprocessing(), "resize": self.resize, "pad_value": 114 if self.resize == "letterbox" else None,
                "pad_rule": ("new = round(side × image_size / longest side); pad before = (image_size − new) // 2"
                             if self.resize == "letterbox" else None),
                "box_format": "xyxy pixels of the resized input", "classes": self.class_names}

    def digest(self) -> str:
        cached = self.__dict__.get("_digest")
        if cached is not None:
            return cached
        h = hashlib.sha256(super().digest().encode())
        for t in self.targets:
            h.update(t["boxes"].numpy().tobytes())
            h.update(t["classes"].numpy().tobytes())
            h.update(t["crowd"].numpy().tobytes())
        self.__dict__["_digest"] = h.hexdigest()
        return self.__dict__["_digest"]

    def summary(self) -> dict:
        return {**super().summary(), "task": "detection", "boxes": {s: sum(len(t["classes"]) for t in
                                                                         self.split_targets(s))
                                                                    for s in ("train", "val", "calib", "test")}}


def shapes_folder(spec: DataSpec) -> Path:
    """The generated shapes set for ``spec`` (written once into the cache folder, then read like a user's)."""
    size = spec.image_size or 128
    root = Path(spec.cache_dir) if spec.cache_dir else default_cache_dir()
    folder = root / f"shapes-v{GENERATOR_VERSION}-n{spec.synthetic_samples}-s{size}-seed{spec.split_seed}"
    if not (folder / "annotations" / "instances.json").is_file():
        root.mkdir(parents=True, exist_ok=True)
        write_shapes(folder, images=spec.synthetic_samples, size=size, seed=spec.split_seed)
    return folder


def load_detection(spec: DataSpec) -> DetectionBundle:
    if spec.name == "shapes":
        path, size = shapes_folder(spec), spec.image_size or 128
    elif spec.name == "coco":
        if not spec.path:
            raise DataError("data.path is required for coco: the folder holding images/ and the instances JSON")
        path, size = Path(spec.path), spec.image_size
    else:
        raise DataError(f"{spec.name!r} is not a detection data set; use one of {', '.join(DETECTION_DATASETS)}")
    if spec.channels not in (None, 3):
        raise DataError("data.channels: detection reads RGB images; drop channels or set it to 3")
    raw = load_coco_folder(path, size, spec.resize, spec.annotations)
    rows = torch.arange(len(raw.targets), dtype=torch.int64)
    if not any(len(t["classes"]) for t in raw.targets):
        raise DataError(f"{path}: no annotation in the whole set; a detection set needs boxes")
    indices = _split_indices(spec, RawDataset(images=raw.images, labels=rows, num_classes=len(raw.class_names),
                                              class_names=raw.class_names))
    splits = {k: Split(raw.images[v].contiguous(), rows[v].contiguous()) for k, v in indices.items()}
    for name in ("val", "test"):  # mAP of a split without a box is undefined: say so instead of recording NaN
        if not any((~raw.targets[int(r)]["crowd"]).any() for r in indices[name]):
            raise DataError(f"{path}: the {name} split ({len(indices[name])} images) holds no box; raise "
                            f"data.{name}_fraction or annotate more images")
    if spec.mean is not None and spec.std is not None:
        mean, std = list(spec.mean), list(spec.std)
    else:
        mean, std = _train_stats(splits["train"], spec.split_seed)
    if len(mean) != 3 or len(std) != 3:
        raise DataError(f"data.mean/std have {len(mean)}/{len(std)} values; detection images have 3 channels")
    source = {**raw.source, **({"generator": "shapes", "seed": spec.split_seed} if spec.name == "shapes" else {})}
    return DetectionBundle(
        name=spec.name, num_classes=len(raw.class_names), class_names=raw.class_names,
        mean=[round(m, 6) for m in mean], std=[round(s, 6) for s in std], meaningful_accuracy=True,
        source=source, split_indices=indices, targets=raw.targets, category_ids=raw.category_ids,
        resize=spec.resize, **splits)
