"""Stage kinds by name: an explicit table of the built-in kinds, plus ``register`` for plug-ins.

The table names each kind's module as a string and imports it on first use, so `compress
--help` does not pay for torch and no stage module has to import the registry: nothing here
forms an import loop (the stage base class knows nothing of the registry).
"""
from __future__ import annotations

import contextlib
import importlib
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from compress.stages.base import Stage

BUILTIN: dict[str, str] = {
    "model": "compress.stages.model_stage:ModelStage",
    "train": "compress.stages.train_stage:TrainStage",
    "prune": "compress.stages.prune_stage:PruneStage",
    "distill": "compress.stages.distill_stage:DistillStage",
    "quantize": "compress.stages.quantize_stage:QuantizeStage",
    "export": "compress.stages.export_stage:ExportStage",
    "bench": "compress.stages.bench_stage:BenchStage",
    "nncf": "compress.stages.nncf_stage:NNCFStage",
}
_PLUGINS: dict[str, type["Stage"]] = {}


def register(cls: type["Stage"]) -> None:
    """Add a stage kind not in the built-in table (a plug-in); a kind may be taken only once."""
    if cls.kind in BUILTIN or (cls.kind in _PLUGINS and _PLUGINS[cls.kind] is not cls):
        taken = BUILTIN.get(cls.kind) or _PLUGINS[cls.kind].__module__
        raise ValueError(f"stage kind {cls.kind!r} is already taken ({taken}); "
                         f"choose another kind for {cls.__module__}")
    _PLUGINS[cls.kind] = cls


def unregister(kind: str) -> None:
    _PLUGINS.pop(kind, None)


@contextlib.contextmanager
def registered(cls: type["Stage"]) -> Iterator[type["Stage"]]:
    """A plug-in kind for the duration of a block (tests: nothing leaks into later ones)."""
    register(cls)
    try:
        yield cls
    finally:
        unregister(cls.kind)


def get(kind: str) -> type["Stage"] | None:
    if kind in _PLUGINS:
        return _PLUGINS[kind]
    target = BUILTIN.get(kind)
    if target is None:
        return None
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def kinds() -> list[str]:
    return sorted({*BUILTIN, *_PLUGINS})
