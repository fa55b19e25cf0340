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


# --- how a reused cache sees a changed file (data.decode_cache_check) ---------------------------------------

_SIDE = 80  # an 80×80 RGB BMP is 19,254 bytes: larger than the three sampled blocks, so some bytes go unsampled


def _bmp_folder(root, per_class: int = 8, classes: int = 3):
    rng = np.random.default_rng(0)
    for label in range(classes):
        (root / f"class_{label}").mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (_SIDE, _SIDE, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / f"class_{label}" / f"{i}.bmp")
    return root


def _bmp_spec(folder, cache_dir, **kw) -> DataSpec:
    return DataSpec(name="imagefolder", path=str(folder), image_size=_SIDE, cache_dir=str(cache_dir),
                    decode_cache="on", decode_workers=1, **kw)


def _row_of(bundle, folder, path) -> torch.Tensor:
    from train.datasets import imagefolder_files

    row = [p for p, _ in imagefolder_files(folder)[1]].index(path)
    return bundle.train.images[torch.tensor([row])][0]


def _rewrite_keeping_mtime(path, data: bytes) -> None:
    """Replace a file's bytes with others of the same length and put its old mtime back (as tar -x, rsync -a)."""
    before = os.stat(path)
    assert len(data) == before.st_size
    path.write_bytes(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == before.st_mtime_ns and os.stat(path).st_size == before.st_size


def _new_pixels(path, seed: int) -> np.ndarray:
    import io

    pixels = np.random.default_rng(seed).integers(0, 256, (_SIDE, _SIDE, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="BMP")
    _rewrite_keeping_mtime(path, out.getvalue())
    return pixels


def _ctime_follows_mtime(monkeypatch) -> None:
    """A mount that reports ctime = mtime (some network and object-store file systems): ctime tells nothing."""
    monkeypatch.setattr(decode_cache, "_stat_facts", lambda st: f"{st.st_size}\0{st.st_mtime_ns}")


def test_a_same_size_replacement_with_its_mtime_kept_is_decoded_again(tmp_path):
    folder = _bmp_folder(tmp_path / "bmp")
    first = load_data(_bmp_spec(folder, tmp_path / "cache"))
    victim = folder / "class_1" / "3.bmp"
    old = _row_of(first, folder, victim).clone()
    pixels = _new_pixels(victim, seed=99)
    second = load_data(_bmp_spec(folder, tmp_path / "cache"))
    assert second.source["decode_cache"]["reused"] is False  # not the stale cache
    assert torch.equal(_row_of(second, folder, victim), torch.from_numpy(pixels).permute(2, 0, 1))
    assert not torch.equal(_row_of(second, folder, victim), old)
    assert second.digest() != first.digest()  # every stage keyed on the split digest runs again
    third = load_data(_bmp_spec(folder, tmp_path / "cache"))  # unchanged since: reused, same digest
    assert third.source["decode_cache"]["reused"] is True and third.digest() == second.digest()


def test_where_ctime_tells_nothing_the_sampled_bytes_still_see_a_replaced_image(tmp_path, monkeypatch):
    _ctime_follows_mtime(monkeypatch)
    folder = _bmp_folder(tmp_path / "bmp")
    first = load_data(_bmp_spec(folder, tmp_path / "cache"))
    victim = folder / "class_0" / "5.bmp"
    pixels = _new_pixels(victim, seed=7)
    second = load_data(_bmp_spec(folder, tmp_path / "cache"))
    assert second.source["decode_cache"]["reused"] is False
    assert torch.equal(_row_of(second, folder, victim), torch.from_numpy(pixels).permute(2, 0, 1))
    assert second.digest() != first.digest()


def test_a_change_between_the_sampled_blocks_is_missed_by_sample_and_seen_by_content(tmp_path, monkeypatch):
    """The rule the README states, both sides of it: with ctime telling nothing, sample misses a change
    that lies wholly between its blocks; content sees any byte."""
    _ctime_follows_mtime(monkeypatch)
    folder = _bmp_folder(tmp_path / "bmp")
    first = load_data(_bmp_spec(folder, tmp_path / "cache"))
    victim = folder / "class_2" / "0.bmp"
    data = bytearray(victim.read_bytes())
    block = decode_cache.SAMPLE_BLOCK
    middle = (len(data) - block) // 2
    assert len(data) > 3 * block and block < middle
    offset = (block + middle) // 2  # between the head block and the middle one, inside the pixel rows
    data[offset] ^= 0xFF
    _rewrite_keeping_mtime(victim, bytes(data))

    stale = load_data(_bmp_spec(folder, tmp_path / "cache"))
    assert stale.source["decode_cache"]["reused"] is True and stale.digest() == first.digest()

    fresh = load_data(_bmp_spec(folder, tmp_path / "cache", decode_cache_check="content"))
    assert fresh.source["decode_cache"]["reused"] is False and fresh.source["decode_cache"]["check"] == "content"
    decoded = np.array(Image.open(victim).convert("RGB"))
    assert torch.equal(_row_of(fresh, folder, victim), torch.from_numpy(decoded).permute(2, 0, 1))
    assert not torch.equal(_row_of(fresh, folder, victim), _row_of(first, folder, victim))
    assert fresh.digest() != first.digest()


def test_the_stat_check_reuses_without_opening_a_file(tmp_path, monkeypatch):
    folder = _bmp_folder(tmp_path / "bmp")
    load_data(_bmp_spec(folder, tmp_path / "cache", decode_cache_check="stat"))

    def no_reading(*args, **kwargs):
        raise AssertionError("a file was read")

    for name in ("_sampled_bytes", "_file_facts", "_build"):
        monkeypatch.setattr(decode_cache, name, no_reading)
    again = load_data(_bmp_spec(folder, tmp_path / "cache", decode_cache_check="stat"))
    assert again.source["decode_cache"]["reused"] is True and again.source["decode_cache"]["check"] == "stat"
    assert again.source["decode_cache"]["check_s"] >= 0


def test_the_check_setting_is_validated_and_not_part_of_a_stage_key(tmp_path):
    from pydantic import ValidationError

    from compress.config import DataConfig
    from compress.pipeline.runner import _without_locations
    from train.datasets import DataError

    with pytest.raises(ValidationError, match="decode_cache_check"):
        DataConfig(name="imagefolder", path="x", decode_cache_check="full")
    assert DataConfig(name="imagefolder", path="x").decode_cache_check == "sample"
    folder = _bmp_folder(tmp_path / "bmp", per_class=2, classes=2)
    with pytest.raises(DataError, match="data.decode_cache_check .* sample, stat, content"):
        load_data(_bmp_spec(folder, tmp_path / "cache", decode_cache_check="full"))
    # how the cache is checked is not which pixels: the split digest, in every stage key, covers those
    keyed = _without_locations("data", {"name": "imagefolder", "decode_cache_check": "content"})
    assert "decode_cache_check" not in keyed
