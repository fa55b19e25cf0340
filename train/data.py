"""Data sets by name with seeded, fixed splits, and the batch iterator the loop consumes.

Splits are drawn once from a seeded permutation and hashed, so every stage of a run (and
every re-run) sees exactly the same train / val / calibration / test images. The test
split is held out of everything but final measurement; calibration images are a seeded
subset of the train split (they are only used to collect activation ranges).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Iterator

import torch
import torch.nn.functional as F

from train import datasets
from train.datasets import DataError, RawDataset

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
    calib_size: int = 256
    split_seed: int = 0
    synthetic_samples: int = 1024
    synthetic_classes: int = 10


@dataclass
class Split:
    images: torch.Tensor  # uint8 N×C×H×W
    labels: torch.Tensor

    def __len__(self) -> int:
        return len(self.labels)


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
        for split_name in ("train", "val", "calib", "test"):
            split: Split = getattr(self, split_name)
            h.update(split_name.encode())
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


def load_data(spec: DataSpec) -> DataBundle:
    raw = _load_raw(spec)
    images = _reshape(raw.images, spec.image_size, spec.channels)
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
    indices = {"train": train_idx, "val": val_idx, "calib": calib_idx, "test": test_idx}
    splits = {k: Split(images[v].contiguous(), raw.labels[v].contiguous()) for k, v in indices.items()}
    if spec.mean is not None and spec.std is not None:
        mean, std = list(spec.mean), list(spec.std)
    else:
        pixels = splits["train"].images.float().div(255.0)
        mean = pixels.mean(dim=(0, 2, 3)).tolist()
        std = pixels.std(dim=(0, 2, 3)).clamp_min(1e-3).tolist()
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

    def __call__(self, images: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        n, _, h, w = images.shape
        if self.pad > 0:
            padded = F.pad(images, (self.pad,) * 4)
            dy = torch.randint(0, 2 * self.pad + 1, (n,), generator=gen)
            dx = torch.randint(0, 2 * self.pad + 1, (n,), generator=gen)
            rows = (dy.view(n, 1) + torch.arange(h).view(1, h)).view(n, 1, h, 1)
            cols = (dx.view(n, 1) + torch.arange(w).view(1, w)).view(n, 1, 1, w)
            batch_idx = torch.arange(n).view(n, 1, 1, 1)
            chan_idx = torch.arange(images.shape[1]).view(1, -1, 1, 1)
            images = padded[batch_idx, chan_idx, rows, cols]
        if self.hflip:
            flip = torch.rand(n, generator=gen) < 0.5
            images = torch.where(flip.view(n, 1, 1, 1), images.flip(3), images)
        return images


class BatchStream:
    """Batches for one epoch, reproducible from (seed, epoch) alone.

    The order and the augmentation of every batch are derived from the seed, the epoch and
    the batch number, not from a running RNG, so a run resumed at batch k of epoch e sees
    exactly the batches an uninterrupted run would have seen.
    """

    def __init__(self, split: Split, bundle: DataBundle, batch_size: int, *, shuffle: bool, drop_last: bool,
                 augment: Augment | None = None, seed: int = 0, device: torch.device | str = "cpu",
                 channels_last: bool = False) -> None:
        self.split, self.bundle, self.batch_size = split, bundle, batch_size
        self.shuffle, self.drop_last, self.augment, self.seed = shuffle, drop_last, augment, seed
        self.device = torch.device(device)
        self.channels_last = channels_last
        self._mean = torch.tensor(bundle.mean, device=self.device).view(1, -1, 1, 1)
        self._std = torch.tensor(bundle.std, device=self.device).view(1, -1, 1, 1)

    def __len__(self) -> int:
        n = len(self.split)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        n = len(self.split)
        if self.shuffle:
            order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed * 100_003 + epoch))
        else:
            order = torch.arange(n)
        pin = self.device.type == "cuda"
        for b in range(start, len(self)):
            idx = order[b * self.batch_size:(b + 1) * self.batch_size]
            images, labels = self.split.images[idx], self.split.labels[idx]
            if self.augment is not None and self.augment.enabled:
                gen = torch.Generator().manual_seed((self.seed * 100_003 + epoch) * 1_000_003 + b)
                images = self.augment(images, gen)
            if pin:
                images, labels = images.pin_memory(), labels.pin_memory()
            images = images.to(self.device, non_blocking=True)
            labels = labels.to(self.device, non_blocking=True)
            x = (images.float().div_(255.0) - self._mean).div_(self._std)
            if self.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            yield x, labels
