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

# where a model artifact's verdict is kept in its manifest record (``red_line`` is the quantize stage's own record)
RECORD_KEY = "validation_red_line"


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
    return {"metric": f"val_{metric}", "baseline": baseline.name, "baseline_sha256": baseline.sha256,
            "baseline_val": round(base, 3), "val": round(value, 3), "drop": round(drop, 3), "max_drop": max_drop,
            "within": drop <= max_drop}


def current(verdict: object, baseline: InputArtifact, max_drop: float) -> dict | None:
    """A recorded verdict read against today's red line: None where it was judged against another baseline (or by
    an older version), so it must be judged again; ``within`` re-decided from its drop where ``max_drop`` changed
    since (a stage whose key holds no red line keeps its record)."""
    if not isinstance(verdict, dict) or "drop" not in verdict or verdict.get("baseline_sha256") != baseline.sha256:
        return None
    return {**verdict, "max_drop": max_drop, "within": verdict["drop"] <= max_drop}


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


def verdict_words(verdict: dict) -> str:
    return (f"{verdict['metric']} {verdict['val']:g} against {verdict['baseline']}'s {verdict['baseline_val']:g}, "
            f"{verdict['drop']:.2f} points down, red line {verdict['max_drop']:g}")


def fallback_for(model: InputArtifact, source_of, verdict_of) -> tuple[InputArtifact, Fallback] | None:
    """The last model within the red line behind ``model``, where ``model`` is past it: its own input model, and
    that one's, until one is within (the baseline always is). ``source_of(artifact)`` gives the model input an
    artifact was made from (None where it has none); ``verdict_of(artifact)`` its verdict against today's line
    (None where it cannot be judged: never taken as within)."""
    verdict = verdict_of(model)
    if verdict is None or verdict["within"]:
        return None
    current_model = source_of(model)
    while current_model is not None:
        found = verdict_of(current_model)
        if found is not None and found["within"]:
            macs = (model.meta.get("macs"), current_model.meta.get("macs"))
            ratio = round(macs[1] / macs[0], 3) if all(macs) else None
            return current_model, Fallback(model.name, current_model.name, verdict_words(verdict), ratio)
        current_model = source_of(current_model)
    return None  # nothing within behind it: the stage uses what it was given
