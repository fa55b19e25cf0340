"""Training checkpoints: everything needed to continue a run as if it had never stopped.

Model, optimizer, scheduler, scaler and RNG state go into one file written atomically,
so a kill during the write leaves the previous checkpoint intact. They are read back
with ``weights_only=True``: a checkpoint file is data, never code.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from train.atomic_io import atomic_path

CHECKPOINT_FILE = "last.pt"


def save_checkpoint(directory: Path, state: dict[str, Any]) -> Path:
    path = Path(directory) / CHECKPOINT_FILE
    with atomic_path(path) as tmp:
        torch.save(state, tmp)
    return path


def load_checkpoint(directory: Path) -> dict[str, Any] | None:
    path = Path(directory) / CHECKPOINT_FILE
    if not path.is_file():
        return None
    return torch.load(path, map_location="cpu", weights_only=True)


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
