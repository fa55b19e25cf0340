"""An image folder decoded once into an on-disk uint8 array that every later run and stage reuses.

An ImageNet-size folder at 224×224 is about 190 GB decoded: it cannot be one in-memory tensor,
and decoding it again for every run (or every process of a distributed run) costs more than the
training it feeds. So it is decoded once, by parallel worker processes, into one raw
``N×C×H×W`` uint8 file that batches are read from through a memory map.

The cache is keyed by what determines its pixels: the content of every file (sha256), its class,
and the decode settings. Hashing every file on every run would cost what the first run's digest
cost (``digest_s``), so a second run looks the folder up in a small index instead, keyed by a
cheaper listing of the files; when the listing differs, every file is hashed again and, where the
content differs, decoded again. What the listing holds is ``data.decode_cache_check`` (``CHECKS``):

- ``sample`` (default): per file its path, class, size, modification time (mtime), inode change
  time (ctime) and the sha256 of ``3 × SAMPLE_BLOCK`` bytes read at its head, middle and tail (the
  whole file when it is no larger). The kernel sets ctime on every write, rename and ``utime``, and
  no ordinary tool sets it back (``tar -x`` and ``rsync -a`` keep mtime, not ctime), so a replaced
  file is seen by its ctime on a local file system; the sample sees it where ctime tells nothing
  (mounts that report ctime = mtime) unless the change keeps size, mtime and ctime *and* lies
  wholly between the sampled blocks of a file larger than ``3 × SAMPLE_BLOCK`` (a retouched region
  of an uncompressed BMP/PPM/TIFF; a PNG keeps a checksum of all its pixels in its last bytes).
- ``stat``: size, mtime and ctime only; no file is opened (for mounts where every open is a
  network request). Misses a same-size change whose mtime and ctime are both kept.
- ``content``: no index: every file is read and hashed on every load; any byte change is seen.

The cache folder appears under its final name only when complete (written in a temporary folder,
renamed), so a killed decode leaves nothing a later run could mistake for a cache.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import mmap
import os
import shutil
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

logger = logging.getLogger(__name__)

CACHE_VERSION = 1  # bump when decoding changes: old caches are then never opened
_DROP_EVERY_BYTES = 256 * 2**20
_CHUNK = 512  # images per worker task
CHECKS = ("sample", "stat", "content")  # data.decode_cache_check: how a later run sees that a file changed
SAMPLE_BLOCK = 4096  # bytes read at the head, the middle and the tail of each file under check "sample"


def default_cache_dir() -> Path:
    """``$COMPRESS_CACHE_DIR``, else ``$XDG_CACHE_HOME/compress/decoded`` (``~/.cache/compress/decoded``)."""
    if os.environ.get("COMPRESS_CACHE_DIR"):
        return Path(os.environ["COMPRESS_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "compress" / "decoded"


class DiskImages:
    """The rows of a cache file, read on demand through a read-only memory map.

    Pages a batch touched are handed back to the kernel every few hundred MB read
    (``MADV_DONTNEED``): they stay in the page cache for the next epoch, but do not pile up in
    this process's resident memory, which would otherwise grow to the size of the data set.
    """

    def __init__(self, path: Path, shape: tuple[int, int, int, int]) -> None:
        self.path, self.shape = Path(path), tuple(shape)
        self._map: mmap.mmap | None = None
        self._array: np.ndarray | None = None
        self._read_since_drop = 0

    def __len__(self) -> int:
        return self.shape[0]

    def __getstate__(self) -> dict:  # a memory map does not travel to another process; it is reopened there
        return {"path": self.path, "shape": self.shape}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"], state["shape"])

    def _rows(self) -> np.ndarray:
        if self._array is None:
            with open(self.path, "rb") as fh:
                self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            self._array = np.frombuffer(self._map, dtype=np.uint8).reshape(self.shape)
        return self._array

    def __getitem__(self, index) -> torch.Tensor:
        rows = self._rows()
        if isinstance(index, slice):
            out = np.array(rows[index])
        else:
            idx = np.asarray(index.cpu() if isinstance(index, torch.Tensor) else index, dtype=np.int64)
            order = np.argsort(idx, kind="stable")  # read in file order, return in the order asked
            out = np.empty((len(idx), *self.shape[1:]), dtype=np.uint8)
            out[order] = rows[idx[order]]
        self._read_since_drop += out.nbytes
        if self._read_since_drop >= _DROP_EVERY_BYTES and self._map is not None:
            self._map.madvise(mmap.MADV_DONTNEED)
            self._read_since_drop = 0
        return torch.from_numpy(out)


@dataclass
class CachedFolder:
    images: DiskImages
    labels: torch.Tensor
    info: dict  # what the manifest records: key, size, decode throughput, whether it was reused


def _file_facts(args: tuple[list[str], bool]) -> list[tuple[str, bool]]:
    """sha256 of each file's bytes, and whether it is greyscale (read from the header, not decoded)."""
    from PIL import Image

    from train.datasets import is_grey

    paths, want_mode = args
    facts = []
    for path in paths:
        data = Path(path).read_bytes()
        grey = False
        if want_mode:
            with Image.open(io.BytesIO(data)) as img:
                grey = is_grey(img)
        facts.append((hashlib.sha256(data).hexdigest(), grey))
    return facts


def _decode_chunk(args: tuple[str, tuple, int, list[str], str, int]) -> int:
    from train.datasets import decode_image

    target, shape, start, paths, mode, size = args
    rows = np.memmap(target, dtype=np.uint8, mode="r+", shape=shape)
    for offset, path in enumerate(paths):
        pixels = decode_image(Path(path), size, mode)
        rows[start + offset] = pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)
    rows.flush()
    del rows
    return len(paths)


def _stat_facts(st: os.stat_result) -> str:
    """Size, mtime and ctime: the kernel moves ctime on every write, rename and utime of the file."""
    return f"{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}"


def _sampled_bytes(path: str, size: int) -> bytes:
    """The head, middle and tail blocks of a file (all of it when it is no larger than the three)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if size <= 3 * SAMPLE_BLOCK:
            return os.pread(fd, size + 1, 0)  # one byte more: a file that grew since its stat reads differently
        return b"".join(os.pread(fd, SAMPLE_BLOCK, offset)
                        for offset in (0, (size - SAMPLE_BLOCK) // 2, size - SAMPLE_BLOCK))
    finally:
        os.close(fd)


def _listing_marks(args: tuple[list[str], str]) -> list[str]:
    """What the index compares per file under ``check`` ("stat" or "sample")."""
    paths, check = args
    marks = []
    for path in paths:
        st = os.stat(path)
        mark = _stat_facts(st)
        if check == "sample":
            mark += "\0" + hashlib.sha256(_sampled_bytes(path, st.st_size)).hexdigest()
        marks.append(mark)
    return marks


def _listing_key(files: list[tuple[Path, int]], size: int, channels: int | None, check: str, workers: int) -> str:
    """The index key of the folder as it is now. Files are read by threads (stat, reads and sha256 release
    the GIL), more than ``workers`` since they mostly wait on the disk: Python's own default count."""
    chunks = [([str(p) for p, _ in part], check) for part in _chunks(files, _CHUNK)]
    if len(chunks) > 1:
        with ThreadPoolExecutor(max_workers=min(32, workers + 4)) as pool:
            marks = [m for part in pool.map(_listing_marks, chunks) for m in part]
    else:
        marks = [m for chunk in chunks for m in _listing_marks(chunk)]
    h = hashlib.sha256(f"v{CACHE_VERSION}:{check}:{size}:{channels}".encode())
    for (path, label), mark in zip(files, marks):
        h.update(f"{path}\0{label}\0{mark}\n".encode())
    return h.hexdigest()


def _chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_or_build(files: list[tuple[Path, int]], size: int, channels: int | None, cache_dir: Path,
                  workers: int, check: str = "sample") -> CachedFolder:
    """The decoded cache of ``files`` at ``size``×``size``; decoded here only when no complete one exists.
    ``check`` (one of ``CHECKS``) is how the index decides that the folder is unchanged."""
    if check not in CHECKS:
        raise ValueError(f"decode cache check {check!r} is not one of {', '.join(CHECKS)}")
    cache_dir = Path(cache_dir)
    (cache_dir / "index").mkdir(parents=True, exist_ok=True)
    index_file, check_s = None, None
    if check != "content":
        started = time.perf_counter()
        index_file = cache_dir / "index" / f"{_listing_key(files, size, channels, check, workers)}.json"
        check_s = round(time.perf_counter() - started, 3)
        if index_file.is_file():
            found = _open(cache_dir / json.loads(index_file.read_text())["key"], files, check=check)
            if found is not None:
                found.info["check_s"] = check_s
                return found
        logger.info(f"decode cache: no index entry for the folder as it is now (check: {check}); "
                    f"hashing its {len(files):,} files")
    else:
        logger.info(f"decode cache: hashing all {len(files):,} files (check: content)")

    started = time.perf_counter()
    paths = [str(p) for p, _ in files]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        facts = [f for part in pool.map(_file_facts, [(c, channels is None) for c in _chunks(paths, _CHUNK)])
                 for f in part]
    digest_s = time.perf_counter() - started
    chosen = channels or (1 if all(grey for _, grey in facts) else 3)
    h = hashlib.sha256(f"v{CACHE_VERSION}:{size}:{chosen}".encode())
    for (path, label), (sha, _) in zip(files, facts):
        h.update(f"{label}\0{sha}\n".encode())
    key = h.hexdigest()[:32]
    final = cache_dir / key
    found = _open(final, files, check=check)
    if found is None:
        _build(final, files, size, chosen, workers, digest_s)
        found = _open(final, files, log=False, check=check)
        assert found is not None, f"{final} was just built"
        found.info["reused"] = False
    else:
        found.info["digest_s"] = round(digest_s, 2)
    if index_file is not None:
        found.info["check_s"] = check_s
        tmp_index = index_file.with_name(f".{index_file.name}.{os.getpid()}")
        tmp_index.write_text(json.dumps({"key": key}))
        os.replace(tmp_index, index_file)
    return found


def _open(folder: Path, files: list[tuple[Path, int]], log: bool = True, check: str = "sample") -> CachedFolder | None:
    meta_file = folder / "meta.json"
    if not meta_file.is_file():
        return None
    meta = json.loads(meta_file.read_text())
    shape = tuple(meta["shape"])
    if meta.get("version") != CACHE_VERSION or shape[0] != len(files) or \
            (folder / "images.u8").stat().st_size != int(np.prod(shape)):
        return None
    labels = torch.from_numpy(np.load(folder / "labels.npy", allow_pickle=False))
    info = {**meta, "path": str(folder), "reused": True, "check": check}
    if log:
        logger.info(f"decode cache: reusing {folder} ({meta['bytes'] / 2**30:.2f} GiB, {shape[0]:,} images; "
                    f"check: {check})")
    return CachedFolder(DiskImages(folder / "images.u8", shape), labels, info)


def _build(final: Path, files: list[tuple[Path, int]], size: int, channels: int, workers: int,
           digest_s: float) -> None:
    shape = (len(files), channels, size, size)
    nbytes = int(np.prod(shape))
    free = shutil.disk_usage(final.parent).free
    if free < nbytes * 1.02:
        raise OSError(28, f"decoding {len(files):,} images needs {nbytes / 2**30:.1f} GiB in {final.parent} "
                          f"but {free / 2**30:.1f} GiB are free; free space or set data.cache_dir elsewhere",
                      str(final.parent))
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        target = tmp / "images.u8"
        with open(target, "wb") as fh:
            fh.truncate(nbytes)
        mode = "L" if channels == 1 else "RGB"
        logger.info(f"decode cache: decoding {len(files):,} images to {size}×{size}×{channels} "
                    f"({nbytes / 2**30:.2f} GiB) with {workers} worker processes into {final}")
        started = time.perf_counter()
        paths = [str(p) for p, _ in files]
        jobs = [(str(target), shape, start, chunk, mode, size)
                for start, chunk in zip(range(0, len(paths), _CHUNK), _chunks(paths, _CHUNK))]
        done, last_log = 0, started
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for count in pool.map(_decode_chunk, jobs):
                done += count
                if time.perf_counter() - last_log > 15:
                    last_log = time.perf_counter()
                    logger.info(f"decode cache: {done:,}/{len(files):,} images "
                                f"({done / (last_log - started):,.0f} images/s)")
        decode_s = time.perf_counter() - started
        np.save(tmp / "labels.npy", np.array([label for _, label in files], dtype=np.int64))
        meta = {"version": CACHE_VERSION, "shape": list(shape), "bytes": nbytes, "decode_s": round(decode_s, 2),
                "decode_images_per_s": round(len(files) / max(decode_s, 1e-9), 1), "digest_s": round(digest_s, 2),
                "workers": workers, "made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
        for name in ("images.u8", "labels.npy", "meta.json"):
            _fsync(tmp / name)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "meta.json").is_file():  # not another process's complete cache: a real failure
                raise
            logger.info(f"decode cache: another process finished {final} first; using it")
        logger.info(f"decode cache: {len(files):,} images in {decode_s:.1f} s "
                    f"({meta['decode_images_per_s']:,.0f} images/s), {nbytes / 2**30:.2f} GiB")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
