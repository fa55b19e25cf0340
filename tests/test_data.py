"""Data sets by name: real loaders, fixed seeded splits, reproducible batches."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from train.data import Augment, BatchStream, DataSpec, load_data
from train.datasets import DataError, load_cifar10


def _disjoint(bundle) -> bool:
    idx = bundle.split_indices
    sets = [set(idx[k].tolist()) for k in ("train", "val", "test")]
    return not (sets[0] & sets[1] or sets[0] & sets[2] or sets[1] & sets[2])


def test_digits_splits_are_fixed_disjoint_and_calibration_stays_out_of_test():
    bundle = load_data(DataSpec(name="digits"))
    assert bundle.input_shape == (1, 8, 8) and bundle.num_classes == 10
    assert {k: len(getattr(bundle, k)) for k in ("train", "val", "calib", "test")} == \
        {"train": 1294, "val": 144, "calib": 256, "test": 359}
    assert _disjoint(bundle)
    calib = set(bundle.split_indices["calib"].tolist())
    assert calib <= set(bundle.split_indices["train"].tolist())
    assert bundle.digest() == load_data(DataSpec(name="digits")).digest()
    assert bundle.digest() != load_data(DataSpec(name="digits", split_seed=1)).digest()
    assert bundle.train.images.dtype == torch.uint8 and bundle.train.images.max() == 255


def test_mnist5k_loads_the_real_images_with_resize_and_channels():
    bundle = load_data(DataSpec(name="mnist5k", image_size=32, channels=3))
    assert bundle.input_shape == (3, 32, 32)
    assert sum(len(getattr(bundle, k)) for k in ("train", "val", "test")) == 5000
    assert torch.bincount(torch.cat([bundle.train.labels, bundle.val.labels, bundle.test.labels])).tolist() == [500] * 10
    assert 0.05 < bundle.mean[0] < 0.3  # mostly black background, measured on the train split
    assert bundle.preprocessing()["mean"] == bundle.mean


def test_imagefolder_reads_class_folders(tmp_path):
    rng = np.random.default_rng(0)
    for label in ("cat", "dog"):
        (tmp_path / label).mkdir()
        for i in range(10):
            Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(tmp_path / label / f"{i}.png")
    bundle = load_data(DataSpec(name="imagefolder", path=str(tmp_path), image_size=16))
    assert bundle.class_names == ["cat", "dog"] and bundle.input_shape == (3, 16, 16)
    assert len(bundle.train) + len(bundle.val) + len(bundle.test) == 20


def test_a_greyscale_image_folder_stays_one_channel_unless_asked(tmp_path):
    rng = np.random.default_rng(1)
    for label in ("a", "b"):
        (tmp_path / label).mkdir()
        for i in range(10):
            Image.fromarray(rng.integers(0, 255, (16, 16), dtype=np.uint8), mode="L").save(tmp_path / label / f"{i}.png")
    grey = load_data(DataSpec(name="imagefolder", path=str(tmp_path)))
    assert grey.input_shape == (1, 16, 16) and len(grey.mean) == 1
    assert load_data(DataSpec(name="imagefolder", path=str(tmp_path), channels=3)).input_shape == (3, 16, 16)
    Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(tmp_path / "a" / "colour.png")
    mixed = load_data(DataSpec(name="imagefolder", path=str(tmp_path)))  # one colour image: the set is RGB
    assert mixed.input_shape == (3, 16, 16)
    greys = mixed.train.images[(mixed.train.images[:, 0] == mixed.train.images[:, 1]).flatten(1).all(1)]
    assert len(greys) >= len(mixed.train) - 1  # the grey ones copied into all three channels, unchanged


def test_imagefolder_errors_name_the_folder(tmp_path):
    with pytest.raises(DataError, match=r"is not a folder"):
        load_data(DataSpec(name="imagefolder", path=str(tmp_path / "missing")))
    (tmp_path / "only").mkdir()
    with pytest.raises(DataError, match=r"has 1 class folder\(s\); it needs at least two"):
        load_data(DataSpec(name="imagefolder", path=str(tmp_path)))


def _cifar_python_batch(n: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    batch = {b"data": rng.integers(0, 255, (n, 3072), dtype=np.uint8), b"labels": rng.integers(0, 10, n).tolist()}
    return pickle.dumps(batch)


@pytest.mark.parametrize("layout", ["python", "binary"])
def test_cifar10_reads_local_batches_and_keeps_the_official_test_set(tmp_path, layout):
    rng = np.random.default_rng(0)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for i, name in enumerate(names):
        if layout == "python":
            (tmp_path / name).write_bytes(_cifar_python_batch(20, i))
        else:
            records = np.concatenate([rng.integers(0, 10, (20, 1)), rng.integers(0, 255, (20, 3072))], 1)
            records.astype(np.uint8).tofile(tmp_path / f"{name}.bin")
    bundle = load_data(DataSpec(name="cifar10", path=str(tmp_path)))
    assert bundle.input_shape == (3, 32, 32) and len(bundle.test) == 20 and len(bundle.train) + len(bundle.val) == 100


def test_cifar10_refuses_a_pickle_that_would_run_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("owned",))

    for i in range(1, 6):
        (tmp_path / f"data_batch_{i}").write_bytes(pickle.dumps({b"data": Evil(), b"labels": []}))
    (tmp_path / "test_batch").write_bytes(_cifar_python_batch(2, 0))
    with pytest.raises(DataError, match=r"refusing to load builtins\.print"):
        load_cifar10(tmp_path)


def test_cifar10_missing_says_nothing_is_downloaded(tmp_path):
    with pytest.raises(DataError, match=r"no CIFAR-10 batches under .*nothing is downloaded"):
        load_cifar10(tmp_path)


def test_synthetic_is_flagged_meaningless():
    bundle = load_data(DataSpec(name="synthetic", image_size=16, channels=3, synthetic_samples=200))
    assert bundle.input_shape == (3, 16, 16) and not bundle.meaningful_accuracy


def test_batches_are_reproducible_from_seed_epoch_and_position():
    bundle = load_data(DataSpec(name="digits"))
    stream = BatchStream(bundle.train, bundle, 64, shuffle=True, drop_last=True, augment=Augment(pad=1), seed=3)
    full = list(stream.epoch(2))
    resumed = list(stream.epoch(2, start=5))
    assert len(full) == len(stream) == 1294 // 64
    for (xa, ya), (xb, yb) in zip(full[5:], resumed):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    other_epoch = next(iter(stream.epoch(3)))
    assert not torch.equal(full[0][1], other_epoch[1])
    x, _ = full[0]
    assert x.dtype == torch.float32 and abs(float(x.mean())) < 1.0


def test_augment_shifts_keep_shape_and_content():
    images = torch.zeros(4, 1, 8, 8, dtype=torch.uint8)
    images[:, :, 3:5, 3:5] = 255
    out = Augment(pad=2, hflip=True)(images, torch.Generator().manual_seed(0))
    assert out.shape == images.shape and out.dtype == torch.uint8
    assert (out == 255).sum() == (images == 255).sum()  # a 2-px shift of a centred blob never crops it
