"""``SHA256SUMS`` in the format of coreutils' ``sha256sum``: a deployer checks a bundle with
``sha256sum -c SHA256SUMS`` and no tool of ours; ``compress verify`` reads the same file."""
from __future__ import annotations

from pathlib import Path

from train.file_digest import file_sha256

SUMS_FILE = "SHA256SUMS"


def bundle_files(folder: Path) -> list[str]:
    """Every file under ``folder`` but the sums themselves, as sorted POSIX paths relative to it."""
    names = (p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    return sorted(name for name in names if name != SUMS_FILE)


def write_sums(folder: Path) -> str:
    text = "".join(f"{file_sha256(folder / name)}  {name}\n" for name in bundle_files(folder))
    (folder / SUMS_FILE).write_text(text)
    return text


def check_sums(folder: Path) -> tuple[int, list[str]]:
    """(files checked, problems): a listed file missing or changed, a line that is not ``<sha256>  <path>``,
    a path leaving the folder, a file the list does not name."""
    sums = folder / SUMS_FILE
    if not sums.is_file():
        return 0, [f"{sums} is missing: this is not a release bundle (compress release writes it)"]
    problems, listed = [], set()
    root = folder.resolve()
    for number, line in enumerate(sums.read_text().splitlines(), 1):
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64 or not name:
            problems.append(f"{SUMS_FILE} line {number} is not '<sha256>  <path>': {line[:80]!r}")
            continue
        path = (folder / name).resolve()
        if not path.is_relative_to(root):
            problems.append(f"{SUMS_FILE} line {number} names {name}, outside the bundle")
            continue
        listed.add(name)
        if not path.is_file():
            problems.append(f"{name} is listed in {SUMS_FILE} but missing")
        elif file_sha256(path) != digest:
            problems.append(f"{name} has changed: its sha256 is not the one {SUMS_FILE} lists")
    problems += [f"{name} is in the bundle but not listed in {SUMS_FILE}" for name in bundle_files(folder)
                 if name not in listed]
    return len(listed), problems
