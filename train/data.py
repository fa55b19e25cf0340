"""Data sets by name with seeded, fixed splits, and the batch iterator the loop consumes.

Splits are drawn once from a seeded permutation and hashed, so every stage of a run (and
every re-run) sees exactly the same train / val / calibration / test images. The test
split is held out of everything but final measurement; calibration images are a seeded
subset of the train split (they are only used to collect activation ranges).
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import torch
import torch.nn.functional as F

from train import datasets
from train.datasets import DataError, RawDataset
from train.decode_cache import CHECKS, DiskImages, default_cache_dir, open_or_build

DATASETS = ("digits", "mnist5k", "imagefolder", "cifar10", "synthetic")


@dataclass
class DataSpec:
    name: str
    path: str | None = None
    image_size: int | None = None
    channels: int | None = None
    mean: list[float] | None = None  # None: computed per channel on the train split
    std: list[float] | None = None
    val_fraction: float = 0.1
    test_fraction: float = 0.2
    test_path: str | None = None  # imagefolder: a folder of the user's own that is the whole test split
    calib_size: int = 256
    split_seed: int = 0
    synthetic_samples: int = 1024
    synthetic_classes: int = 10
    decode_cache: str = "auto"  # auto | on | off: an image folder decoded to disk (train.decode_cache)
    decode_cache_check: str = "sample"  # sample | stat | content: how a reused cache is checked (train.decode_cache)
    cache_dir: str | None = None
    decode_workers: int | None = None
    annotations: str | None = None  # coco: the instances JSON (default: the one under path)
    resize: str = "letterbox"  # coco, shapes and the segmentation sets: letterbox | stretch
    ignore_index: int = 255  # segmentation: the mask value that is never scored
    class_names: list[str] | None = None  # segmentation: the classes in index order (default: classes.txt or counted)
    palette: list[list[int]] | None = None  # segmentation: RGB masks' colour per class, in class order


# An image folder larger than this decoded goes through the on-disk cache under decode_cache: auto.
AUTO_CACHE_BYTES = 2 * 2**30
# Mean and std of a disk-backed train split are measured on this many of its images (seeded).
STATS_SAMPLE = 10_000


@dataclass
class Split:
    """Images and labels of one split. ``rows`` set: the split is a view on the rows of a larger
    (disk-backed) source, so nothing is copied into memory until a batch asks for it."""

    images: "torch.Tensor | DiskImages"  # uint8 N×C×H×W (all rows of the source when `rows` is set)
    labels: torch.Tensor
    rows: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def take(self, idx: torch.Tensor) -> torch.Tensor:
        return self.images[self.rows[idx] if self.rows is not None else idx]

    def head(self, n: int) -> "Split":
        if self.rows is not None:
            return Split(self.images, self.labels[:n], self.rows[:n])
        return Split(self.images[:n], self.labels[:n])


@dataclass
class DataBundle:
    name: str
    train: Split
    val: Split
    calib: Split
    test: Split
    num_classes: int
    class_names: list[str]
    mean: list[float]
    std: list[float]
    meaningful_accuracy: bool
    source: dict = field(default_factory=dict)
    split_indices: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return tuple(self.train.images.shape[1:])  # type: ignore[return-value]

    def preprocessing(self) -> dict:
        c, h, w = self.input_shape
        return {"channels": c, "height": h, "width": w, "scale": 1 / 255, "mean": self.mean, "std": self.std}

    def digest(self) -> str:
        """sha256 over the split membership and the pixels and labels of every split (computed once)."""
        cached = self.__dict__.get("_digest")
        if cached is not None:
            return cached
        h = hashlib.sha256()
        cache = self.source.get("decode_cache")
        if cache:  # the cache key covers every file's content and the decoding: rows name pixels exactly
            h.update(f"decode-cache:{cache['key']}".encode())
        for split_name in ("train", "val", "calib", "test"):
            split: Split = getattr(self, split_name)
            h.update(split_name.encode())
            if split.rows is not None:
                h.update(split.rows.contiguous().numpy().tobytes())
            else:
                h.update(split.images.contiguous().numpy().tobytes())
            h.update(split.labels.contiguous().numpy().tobytes())
        self.__dict__["_digest"] = h.hexdigest()
        return self.__dict__["_digest"]

    def identity(self) -> dict:
        """What a model or ONNX file records about the data it was trained, calibrated or judged on:
        a later stage compares it with its own data before measuring anything."""
        return {"name": self.name, "split_digest": self.digest(),
                "sizes": {s: len(getattr(self, s)) for s in ("train", "val", "calib", "test")},
                "preprocessing": self.preprocessing()}

    def judging_facts(self, split: str) -> dict:
        """What a bench needs beside a split's images and labels to judge answers on it (TestSet's fields): a
        classifier's labels say it all."""
        return {}

    def summary(self) -> dict:
        return {
            "name": self.name,
            "sizes": {s: len(getattr(self, s)) for s in ("train", "val", "calib", "test")},
            "input_shape": list(self.input_shape),
            "num_classes": self.num_classes,
            "class_names": self.class_names,
            "mean": self.mean,
            "std": self.std,
            "meaningful_accuracy": self.meaningful_accuracy,
            "source": self.source,
        }


def _load_raw(spec: DataSpec) -> RawDataset:
    if spec.name == "digits":
        return datasets.load_digits()
    if spec.name == "mnist5k":
        return datasets.load_mnist5k()
    if spec.name == "imagefolder":
        if not spec.path:
            raise DataError("data.path is required for imagefolder: the folder with one sub-folder per class")
        if spec.test_path:
            return datasets.load_imagefolder_with_test(spec.path, spec.test_path, spec.image_size, spec.channels)
        return datasets.load_imagefolder(spec.path, spec.image_size, spec.channels)
    if spec.name == "cifar10":
        if not spec.path:
            raise DataError("data.path is required for cifar10: the folder holding the CIFAR-10 batches")
        return datasets.load_cifar10(spec.path)
    if spec.name == "synthetic":
        return datasets.load_synthetic(
            spec.synthetic_samples, spec.synthetic_classes, spec.image_size or 32, spec.channels or 3, spec.split_seed
        )
    raise DataError(f"unknown data set {spec.name!r}; known: {', '.join(DATASETS)}")


def _reshape(images: torch.Tensor, size: int | None, channels: int | None) -> torch.Tensor:
    if channels is not None and images.shape[1] != channels:
        if channels == 3 and images.shape[1] == 1:
            images = images.expand(-1, 3, -1, -1).contiguous()
        elif channels == 1 and images.shape[1] == 3:
            weights = torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)
            images = (images.float() * weights).sum(1, keepdim=True).round().clamp(0, 255).to(torch.uint8)
        else:
            raise DataError(f"cannot convert {images.shape[1]}-channel images to {channels} channels")
    if size is not None and tuple(images.shape[2:]) != (size, size):
        chunks = []
        for chunk in images.split(1024):
            resized = F.interpolate(chunk.float(), size=(size, size), mode="bilinear", antialias=True, align_corners=False)
            chunks.append(resized.round().clamp(0, 255).to(torch.uint8))
        images = torch.cat(chunks)
    return images


def _cached_folder(spec: DataSpec) -> RawDataset | None:
    """An image folder through the on-disk decode cache (the images stay on disk, ``DiskImages``), or
    None where ``decode_cache`` says to decode into memory. The folder is listed once for both."""
    if spec.decode_cache_check not in CHECKS:
        raise DataError(f"data.decode_cache_check is {spec.decode_cache_check!r}; use one of {', '.join(CHECKS)}")
    if spec.name != "imagefolder" or spec.decode_cache == "off":
        return None
    if spec.test_path:  # the two folders are decoded into memory together
        if spec.decode_cache == "on":
            raise DataError("data.test_path is decoded into memory with data.path: set decode_cache: auto or off")
        return None
    classes, files = datasets.imagefolder_files(spec.path or "")
    size = spec.image_size or datasets.first_image_size(files)
    if spec.decode_cache == "auto" and len(files) * (spec.channels or 3) * size * size <= AUTO_CACHE_BYTES:
        return None
    cache_dir = Path(spec.cache_dir) if spec.cache_dir else default_cache_dir()
    workers = spec.decode_workers or max(1, os.cpu_count() or 1)
    cached = open_or_build(files, size, spec.channels, cache_dir, workers, spec.decode_cache_check)
    key = Path(cached.info["path"]).name
    return RawDataset(images=cached.images, labels=cached.labels, num_classes=len(classes), class_names=classes,  # type: ignore[arg-type]
                      source={"path": str(spec.path), "files": len(files),
                              "decode_cache": {**{k: v for k, v in cached.info.items() if k != "version"}, "key": key}})


def _split_indices(spec: DataSpec, raw: RawDataset) -> dict[str, torch.Tensor]:
    n = len(raw.labels)
    gen = torch.Generator().manual_seed(spec.split_seed)
    if raw.official_test is not None:
        test_idx = raw.official_test
        pool = torch.tensor(sorted(set(range(n)) - set(test_idx.tolist())))
        pool = pool[torch.randperm(len(pool), generator=gen)]
    else:
        perm = torch.randperm(n, generator=gen)
        n_test = int(round(n * spec.test_fraction))
        test_idx, pool = perm[:n_test], perm[n_test:]
    n_val = int(round(len(pool) * spec.val_fraction))
    val_idx, train_idx = pool[:n_val], pool[n_val:]
    if len(train_idx) == 0 or len(val_idx) == 0 or len(test_idx) == 0:
        raise DataError(
            f"{spec.name}: {n} images are too few for train/val/test splits "
            f"(val_fraction={spec.val_fraction}, test_fraction={spec.test_fraction})"
        )
    calib_idx = train_idx[torch.randperm(len(train_idx), generator=gen)[: min(spec.calib_size, len(train_idx))]]
    return {"train": train_idx, "val": val_idx, "calib": calib_idx, "test": test_idx}


def _train_stats(train: Split, seed: int) -> tuple[list[float], list[float]]:
    """Per-channel mean and std of the train split; of a seeded sample of it where it is on disk."""
    if train.rows is None:
        pixels = train.images.float().div(255.0)
        return pixels.mean(dim=(0, 2, 3)).tolist(), pixels.std(dim=(0, 2, 3)).clamp_min(1e-3).tolist()
    n = min(len(train), STATS_SAMPLE)
    # sorted: read in file order; chunks of 128 keep the float64 copies small (~150 MB at 224×224)
    pick = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed))[:n].sort().values
    total = total_sq = None
    count = 0
    for chunk in pick.split(128):
        x = train.take(chunk).double().div(255.0)
        sums, sq = x.sum(dim=(0, 2, 3)), x.pow(2).sum(dim=(0, 2, 3))
        total = sums if total is None else total + sums
        total_sq = sq if total_sq is None else total_sq + sq
        count += x.shape[0] * x.shape[2] * x.shape[3]
    mean = total / count
    std = ((total_sq / count - mean.pow(2)) * count / max(count - 1, 1)).clamp_min(0).sqrt().clamp_min(1e-3)
    return mean.tolist(), std.tolist()


def load_data(spec: DataSpec) -> DataBundle:
    cached = _cached_folder(spec)
    if cached is not None:
        raw = cached
        images = raw.images
    else:
        raw = _load_raw(spec)
        images = _reshape(raw.images, spec.image_size, spec.channels)
    indices = _split_indices(spec, raw)
    if isinstance(images, DiskImages):
        splits = {k: Split(images, raw.labels[v].contiguous(), v.contiguous()) for k, v in indices.items()}
    else:
        splits = {k: Split(images[v].contiguous(), raw.labels[v].contiguous()) for k, v in indices.items()}
    if spec.mean is not None and spec.std is not None:
        mean, std = list(spec.mean), list(spec.std)
    else:
        mean, std = _train_stats(splits["train"], spec.split_seed)
    if len(mean) != images.shape[1] or len(std) != images.shape[1]:
        raise DataError(f"data.mean/std have {len(mean)}/{len(std)} values but the images have {images.shape[1]} channels")
    return DataBundle(
        name=spec.name,
        num_classes=raw.num_classes,
        class_names=raw.class_names,
        mean=[round(m, 6) for m in mean],
        std=[round(s, 6) for s in std],
        meaningful_accuracy=raw.meaningful_accuracy,
        source=raw.source,
        split_indices=indices,
        **splits,
    )


@dataclass
class Augment:
    """Cheap, batch-level augmentation on uint8 tensors: random shifts (pad + crop) and flips."""

    pad: int = 0
    hflip: bool = False

    @property
    def enabled(self) -> bool:
        return self.pad > 0 or self.hflip

    def __call__(self, images: torch.Tensor, gen: torch.Generator, offset: int = 0, total: int | None = None) -> torch.Tensor:
        """Augment ``images``, which are rows ``offset…`` of a batch of ``total``: the random draws are made
        for the whole batch, so a process holding one shard of it applies exactly what one process
        holding all of it would."""
        n, _, h, w = images.shape
        total = n if total is None else total
        picked = slice(offset, offset + n)
        if self.pad > 0:
            padded = F.pad(images, (self.pad,) * 4)
            dy = torch.randint(0, 2 * self.pad + 1, (total,), generator=gen)[picked]
            dx = torch.randint(0, 2 * self.pad + 1, (total,), generator=gen)[picked]
            rows = (dy.view(n, 1) + torch.arange(h).view(1, h)).view(n, 1, h, 1)
            cols = (dx.view(n, 1) + torch.arange(w).view(1, w)).view(n, 1, 1, w)
            batch_idx = torch.arange(n).view(n, 1, 1, 1)
            chan_idx = torch.arange(images.shape[1]).view(1, -1, 1, 1)
            images = padded[batch_idx, chan_idx, rows, cols]
        if self.hflip:
            flip = (torch.rand(total, generator=gen) < 0.5)[picked]
            images = torch.where(flip.view(n, 1, 1, 1), images.flip(3), images)
        return images


class BatchStream:
    """Batches for one epoch, reproducible from (seed, epoch) alone.

    The order and the augmentation of every batch are derived from the seed, the epoch and
    the batch number, not from a running RNG, so a run resumed at batch k of epoch e sees
    exactly the batches an uninterrupted run would have seen.

    ``shard=(rank, world)``: one of ``world`` processes. A shuffled (training) stream draws
    global batches of ``batch_size × world`` images from the one seeded order and gives each
    rank its contiguous slice, so the images of every optimizer step, and their augmentation,
    are those of a single process with the global batch. An ordered (evaluation) stream gives
    rank r every world-th image, so the ranks together see each image once.
    """

    def __init__(self, split: Split, bundle: DataBundle, batch_size: int, *, shuffle: bool, drop_last: bool,
                 augment: Augment | None = None, seed: int = 0, device: torch.device | str = "cpu",
                 channels_last: bool = False, shard: tuple[int, int] = (0, 1)) -> None:
        self.split, self.bundle, self.batch_size = split, bundle, batch_size
        self.shuffle, self.drop_last, self.augment, self.seed = shuffle, drop_last, augment, seed
        self.rank, self.world = shard
        self.device = torch.device(device)
        self.channels_last = channels_last
        self._mean = torch.tensor(bundle.mean, device=self.device).view(1, -1, 1, 1)
        self._std = torch.tensor(bundle.std, device=self.device).view(1, -1, 1, 1)

    def _layout(self) -> tuple[int, int]:
        """(images this stream draws batches from, images per drawn batch)."""
        if self.shuffle:
            return len(self.split), self.batch_size * self.world
        return len(range(self.rank, len(self.split), self.world)), self.batch_size

    def __len__(self) -> int:
        n, per = self._layout()
        return n // per if self.drop_last else -(-n // per)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        n = len(self.split)
        if self.shuffle:
            order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed * 100_003 + epoch))
            offset = self.rank * self.batch_size
        else:
            order = torch.arange(self.rank, n, self.world)
            offset = 0
        per = self._layout()[1]
        pin = self.device.type == "cuda"
        for b in range(start, len(self)):
            drawn = order[b * per:(b + 1) * per]
            idx = drawn[offset:offset + self.batch_size]
            images, labels = self.split.take(idx), self.split.labels[idx]
            if self.augment is not None and self.augment.enabled:
                gen = torch.Generator().manual_seed((self.seed * 100_003 + epoch) * 1_000_003 + b)
                images = self.augment(images, gen, offset, len(drawn))
            if pin:
                images, labels = images.pin_memory(), labels.pin_memory()
            images = images.to(self.device, non_blocking=True)
            labels = labels.to(self.device, non_blocking=True)
            x = (images.float().div_(255.0) - self._mean).div_(self._std)
            if self.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            yield x, labels
