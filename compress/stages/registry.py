"""Stage kinds by name. A kind registers itself when its module is imported."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from compress.stages.base import Stage

_KINDS: dict[str, type["Stage"]] = {}


def register(cls: type["Stage"]) -> None:
    if cls.kind in _KINDS and _KINDS[cls.kind] is not cls:
        raise RuntimeError(f"stage kind {cls.kind!r} registered twice ({_KINDS[cls.kind].__module__} and {cls.__module__})")
    _KINDS[cls.kind] = cls


def get(kind: str) -> type["Stage"] | None:
    _load_builtin()
    return _KINDS.get(kind)


def kinds() -> list[str]:
    _load_builtin()
    return sorted(_KINDS)


def _load_builtin() -> None:
    # Imported here, not at module top, so `compress --help` does not pay for torch.
    import compress.stages.bench_stage  # noqa: F401
    import compress.stages.distill_stage  # noqa: F401
    import compress.stages.export_stage  # noqa: F401
    import compress.stages.prune_stage  # noqa: F401
    import compress.stages.quantize_stage  # noqa: F401
    import compress.stages.train_stage  # noqa: F401
