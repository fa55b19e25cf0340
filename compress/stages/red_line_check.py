"""The chain goes on from the last model within the red line.

A stage that trains or rewrites a model (prune with a fixed target, distill, a plug-in stage) can hand on a model
past the red line. Every file made from it after that inherits the loss: pruned at a fixed 60% of its MACs, an
EfficientNet-Lite0 lost 2.4 points past a 1-point line, its INT8 and exported files 2.4 to 3.5, and the gate could
release only the torch model in eager mode (8× slower at p99 than the same weights exported). So each model a stage
makes is judged on the validation split against the red line's baseline, as the gate will judge it on test, and a
stage that makes deployable files from a model (quantize, export, nncf) makes them from the last model within the
line where the one wired to it is past it. The validation split is the one stages judge on; the test split is read
by the bench alone.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from compress.stages.base import InputArtifact
from compress.stages.model_source import model_from_artifact
from compress.stages.training_run import TrainingSettings, val_score

logger = logging.getLogger(__name__)

RECORD_KEY = "red_line"  # where a model artifact's verdict is kept in its manifest record


def judged(model: InputArtifact, baseline: InputArtifact, data, max_drop: float,
           cache: dict[str, float] | None = None) -> dict:
    """``model``'s validation figure against ``baseline``'s, and whether it is within ``max_drop`` points of it.
    ``cache``: validation figures by artifact digest, so the baseline is evaluated once a run."""
    cache = {} if cache is None else cache
    settings = TrainingSettings(device="cpu")
    device = torch.device("cpu")

    def figure(artifact: InputArtifact) -> tuple[str, float]:
        key = artifact.sha256 or artifact.name
        if key not in cache:
            net, _ = model_from_artifact(artifact, data)
            cache[key] = val_score(net.eval(), data, settings, device)
        return cache[key]

    metric, base = figure(baseline)
    _, value = figure(model)
    drop = base - value
    return {"metric": f"val_{metric}", "baseline": baseline.name, "baseline_val": round(base, 3),
            "val": round(value, 3), "drop": round(drop, 3), "max_drop": max_drop, "within": drop <= max_drop}


@dataclass
class Fallback:
    """The model a file-making stage uses instead of the one wired to it, and why."""

    wired: str
    used: str
    why: str
    macs_ratio: float | None  # the used model's MACs over the wired one's: what the stage's time grows by

    def record(self) -> dict:
        return {"wired": self.wired, "used": self.used, "why": self.why, "macs_ratio": self.macs_ratio}

    def words(self, stage: str) -> str:
        cost = (f"; {self.used} has ×{self.macs_ratio:.2f} the MACs of {self.wired}, so this stage's time grows about "
                "as much" if self.macs_ratio and self.macs_ratio > 1.05 else "")
        return (f"{self.wired} is past the red line on validation ({self.why}): this stage makes its files from "
                f"{self.used}, the last model within it, instead{cost} (red_line.fall_back: false keeps {self.wired})")


def past(meta: dict) -> dict | None:
    """The verdict of a model past the red line (None where it is within, or was never judged)."""
    verdict = meta.get(RECORD_KEY)
    return verdict if isinstance(verdict, dict) and verdict.get("within") is False else None


def verdict_words(verdict: dict) -> str:
    return (f"{verdict['metric']} {verdict['val']:g} against {verdict['baseline']}'s {verdict['baseline_val']:g}, "
            f"{verdict['drop']:.2f} points down, red line {verdict['max_drop']:g}")


def fallback_for(model: InputArtifact, source_of) -> tuple[InputArtifact, Fallback] | None:
    """The last model within the red line behind ``model``, where ``model`` is past it: its own input model, and
    that one's, until one is within (the baseline always is). ``source_of(artifact)`` gives the model input an
    artifact was made from (None where it has none)."""
    verdict = past(model.meta)
    if verdict is None:
        return None
    current = model
    while past(current.meta) is not None:
        previous = source_of(current)
        if previous is None:
            return None  # nothing within behind it: the stage uses what it was given
        current = previous
    macs = (model.meta.get("macs"), current.meta.get("macs"))
    ratio = round(macs[1] / macs[0], 3) if all(macs) else None
    return current, Fallback(model.name, current.name, verdict_words(verdict), ratio)
