"""The on-disk decode cache: same pixels as decoding into memory, reused without decoding, atomic."""
from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest
import torch
from PIL import Image

from train import decode_cache
from train.data import DataSpec, load_data
from train.generated_folder import write_folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("data") / "folder"
    write_folder(root, images=300, size=40, classes=3, workers=1)
    return root


def _spec(folder, cache_dir, **kw) -> DataSpec:
    return DataSpec(name="imagefolder", path=str(folder), image_size=24, cache_dir=str(cache_dir), **kw)


def test_cached_splits_hold_the_pixels_decoding_into_memory_gives(folder, tmp_path):
    memory = load_data(_spec(folder, tmp_path, decode_cache="off"))
    cached = load_data(_spec(folder, tmp_path, decode_cache="on", decode_workers=2))
    assert cached.source["decode_cache"]["reused"] is False
    for name in ("train", "val", "calib", "test"):
        mine, theirs = getattr(memory, name), getattr(cached, name)
        assert theirs.rows is not None  # a view on the cache file: nothing copied into memory
        assert torch.equal(theirs.take(torch.arange(len(theirs))), mine.images)
        assert torch.equal(theirs.labels, mine.labels)
    # mean/std of a disk-backed split come from its sample (here every image): the in-memory figures
    assert cached.mean == pytest.approx(memory.mean, abs=1e-5) and cached.std == pytest.approx(memory.std, abs=1e-4)
    info = cached.source["decode_cache"]
    assert info["shape"] == [300, 3, 24, 24] and info["bytes"] == 300 * 3 * 24 * 24
    assert info["decode_images_per_s"] > 0


def test_a_second_load_reuses_the_cache_without_reading_an_image(folder, tmp_path, monkeypatch, caplog):
    first = load_data(_spec(folder, tmp_path, decode_cache="on"))

    def no_decoding(*args, **kwargs):
        raise AssertionError("the cache was decoded again")

    monkeypatch.setattr(decode_cache, "_build", no_decoding)
    monkeypatch.setattr(decode_cache, "_file_facts", no_decoding)
    with caplog.at_level(logging.INFO, logger="train.decode_cache"):
        second = load_data(_spec(folder, tmp_path, decode_cache="on"))
    assert second.source["decode_cache"]["reused"] is True
    assert second.digest() == first.digest()
    assert "reusing" in caplog.text


def test_a_changed_image_is_hashed_again_and_decoded_into_a_new_cache(folder, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    first = load_data(_spec(copy, tmp_path / "cache", decode_cache="on"))
    victim = sorted((copy / "class_01").iterdir())[0]
    Image.fromarray(np.zeros((40, 40, 3), np.uint8)).save(victim)
    second = load_data(_spec(copy, tmp_path / "cache", decode_cache="on"))
    assert second.source["decode_cache"]["reused"] is False
    assert second.source["decode_cache"]["key"] != first.source["decode_cache"]["key"]
    assert second.digest() != first.digest()


def test_a_killed_decode_leaves_no_cache_under_its_final_name(folder, tmp_path, monkeypatch):
    def dies(args):
        raise KeyboardInterrupt  # as a kill mid-decode would leave it

    monkeypatch.setattr(decode_cache, "_decode_chunk", dies)
    monkeypatch.setattr(decode_cache, "ProcessPoolExecutor", _InlinePool)
    with pytest.raises(KeyboardInterrupt):
        load_data(_spec(folder, tmp_path, decode_cache="on"))
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "index"]
    assert leftovers == []  # neither a final folder nor a temporary one
    monkeypatch.undo()
    assert load_data(_spec(folder, tmp_path, decode_cache="on")).source["decode_cache"]["reused"] is False


class _InlinePool:
    def __init__(self, max_workers):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def map(self, fn, jobs):
        return map(fn, jobs)


def test_disk_images_hand_back_pages_so_resident_memory_stays_flat(tmp_path, monkeypatch):
    rows = np.arange(64 * 3 * 32 * 32, dtype=np.int64).astype(np.uint8).reshape(64, 3, 32, 32)
    path = tmp_path / "images.u8"
    rows.tofile(path)
    images = decode_cache.DiskImages(path, rows.shape)
    monkeypatch.setattr(decode_cache, "_DROP_EVERY_BYTES", rows[0].nbytes * 10)
    advised = []
    images._rows()
    real = images._map

    class Spy:
        def madvise(self, flag):
            advised.append(flag)
            real.madvise(flag)

    images._map = Spy()  # type: ignore[assignment]
    picked = torch.tensor([5, 3, 60, 3])
    assert torch.equal(images[picked], torch.from_numpy(rows[[5, 3, 60, 3]]))  # order as asked, repeats kept
    for start in range(0, 64, 8):
        images[torch.arange(start, start + 8)]
    assert advised and all(flag == __import__("mmap").MADV_DONTNEED for flag in advised)


def test_auto_uses_the_cache_only_above_the_size_limit(folder, tmp_path, monkeypatch):
    from train import data

    small = load_data(_spec(folder, tmp_path, decode_cache="auto"))
    assert "decode_cache" not in small.source and small.train.rows is None
    monkeypatch.setattr(data, "AUTO_CACHE_BYTES", 1000)
    big = load_data(_spec(folder, tmp_path, decode_cache="auto"))
    assert big.train.rows is not None


def test_too_little_disk_space_is_refused_before_decoding(folder, tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(OSError, match="needs .* GiB .* free space or set data.cache_dir"):
        load_data(_spec(folder, tmp_path, decode_cache="on"))
    assert not any(p.name != "index" for p in tmp_path.iterdir())


def test_the_cache_index_is_json_naming_the_content_key(folder, tmp_path):
    data = load_data(_spec(folder, tmp_path, decode_cache="on"))
    (index,) = (tmp_path / "index").iterdir()
    assert json.loads(index.read_text())["key"] == data.source["decode_cache"]["key"]
    assert os.path.isfile(tmp_path / data.source["decode_cache"]["key"] / "meta.json")
