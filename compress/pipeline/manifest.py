"""The run's memory: every artifact with its digest and lineage, every stage with its cache key.

The manifest is what lets a stage be skipped safely (same cache key, outputs still match
their digests), lets a later stage find its inputs, and lets a reader trace any shipped
file back to the data and settings that made it.
"""
from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator

from compress.errors import ArtifactError
from train.atomic_io import atomic_write_text
from train.file_digest import file_sha256

MANIFEST_FILE = "manifest.json"
FORMAT = "compress-manifest/1"


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def content_digest(content: dict) -> str:
    """sha256 of a manifest's content in canonical JSON (its own digest field left out)."""
    body = {k: v for k, v in content.items() if k != "content_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def digest_path(path: Path) -> tuple[str, int]:
    """sha256 and size of a file, or of a folder (its relative file names and their digests)."""
    if path.is_file():
        return file_sha256(path), path.stat().st_size
    if path.is_dir():
        h, size = hashlib.sha256(), 0
        for child in sorted(p for p in path.rglob("*") if p.is_file()):
            h.update(child.relative_to(path).as_posix().encode() + b"\0" + file_sha256(child).encode() + b"\n")
            size += child.stat().st_size
        return h.hexdigest(), size
    raise FileNotFoundError(path)


class ArtifactRecord(BaseModel):
    name: str
    kind: str
    path: str  # relative to the run directory (absolute for external inputs)
    sha256: str
    size_bytes: int
    stage: str
    made_from: list[str] = Field(default_factory=list)
    meta: dict[str, Any] = Field(default_factory=dict)
    created: str = Field(default_factory=now)

    @field_validator("kind")
    @classmethod
    def _current_kind(cls, value: str, info) -> str:
        from serve_bench.runners import current_kind  # the runner registry imports torch: not at this module's import

        return current_kind(value, f"manifest artifact {info.data.get('name', '?')}")


class StageRecord(BaseModel):
    name: str
    kind: str
    status: Literal["running", "completed", "failed"]
    config_hash: str
    cache_key: str
    input_digests: dict[str, str] = Field(default_factory=dict)
    package_version: str
    started: str
    ended: str | None = None
    duration_s: float | None = None
    outputs: list[str] = Field(default_factory=list)
    metrics: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None
    # A later attempt that has not completed (running, killed or failed). The completed
    # record and its artifacts stay valid meanwhile: outputs are only replaced on success.
    last_attempt: dict[str, Any] | None = None
    # Key into Manifest.environments: the machine and software this record's results came from.
    environment: str | None = None
    # What the cache key was made of (settings, pipeline sections, input digests...), so a re-run can say why.
    key_material: dict[str, Any] | None = None
    # The resolved pipeline configuration this record was made with (a file under configs/).
    resolved_config: str | None = None


class Manifest(BaseModel):
    format: str = FORMAT
    pipeline: str
    created: str = Field(default_factory=now)
    updated: str = Field(default_factory=now)
    environment: dict[str, Any] = Field(default_factory=dict)  # of the latest invocation
    environments: dict[str, dict[str, Any]] = Field(default_factory=dict)  # every one a stage ran on, by digest
    data: dict[str, Any] = Field(default_factory=dict)
    artifacts: dict[str, ArtifactRecord] = Field(default_factory=dict)
    stages: dict[str, StageRecord] = Field(default_factory=dict)
    # Every resolved configuration a stage of this run directory started with, oldest first; none is replaced.
    resolved_configs: list[dict[str, str]] = Field(default_factory=list)

    @classmethod
    def load(cls, run_dir: Path) -> "Manifest | None":
        """The run's manifest, or None where there is none; a truncated, hand-edited or otherwise
        inconsistent one is refused, never repaired by guessing."""
        path = run_dir / MANIFEST_FILE
        if not path.exists():
            return None
        recover = (f"nothing is guessed: move it away (mv {path} {path.with_suffix('.broken.json')}) to run every "
                   "stage again into this folder, or pass a new --run-dir")
        try:
            raw = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ArtifactError(f"{path} is not readable JSON, so it was truncated or written partly ({exc}); "
                                f"{recover}") from exc
        recorded = raw.pop("content_sha256", None) if isinstance(raw, dict) else None
        if recorded is not None and recorded != content_digest(raw):
            raise ArtifactError(f"{path} does not match the digest of its own content: it was edited by hand or "
                                f"written partly; {recover}")
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            raise ArtifactError(f"{path} is not a compress manifest ({exc.error_count()} schema problems, e.g. "
                                f"{exc.errors()[0]['msg']} at {'.'.join(map(str, exc.errors()[0]['loc']))}); "
                                f"{recover}") from exc

    def save(self, run_dir: Path) -> None:
        """Written atomically, with the digest of its own content so a later edit or a torn write is seen."""
        self.updated = now()
        content = self.model_dump(mode="json")
        content["content_sha256"] = content_digest(content)
        atomic_write_text(run_dir / MANIFEST_FILE, json.dumps(content, indent=2) + "\n")

    def resolve_path(self, run_dir: Path, record: ArtifactRecord) -> Path:
        path = Path(record.path)
        return path if path.is_absolute() else run_dir / path

    def verify(self, run_dir: Path, name: str) -> str | None:
        """None when the artifact still matches its digest, else what is wrong with it."""
        record = self.artifacts.get(name)
        if record is None:
            return "it is not in the manifest"
        path = self.resolve_path(run_dir, record)
        try:
            digest, _ = digest_path(path)
        except FileNotFoundError:
            return f"{path} is missing"
        if digest != record.sha256:
            return f"{path} changed since it was recorded (sha256 {digest[:12]}… ≠ {record.sha256[:12]}…)"
        return None
