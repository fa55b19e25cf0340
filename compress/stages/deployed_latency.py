"""Is the pruned model faster where it ships? Both models exported to ONNX and timed on the CPU runtimes.

Fewer MACs is not less time: a pruned width off the block a runtime's convolutions work in (9, 151, 433
channels) can make the file slower than the unpruned one on onnxruntime while torch eager, which the prune
stage used to time, says it is faster. So the prune stage and each step of ``target: {macs: auto}`` export
the pruned and the unpruned model and time them with the bench's own harness: each file in its own worker,
interleaved in rounds, batch 1, the p50 ratio paired by round with its 95% interval, on every ONNX runtime
usable on this machine (``deployed_on`` narrows them). A short run (about 3 s a runtime): it decides
whether pruning pays, the bench stage measures the files that ship.
"""
from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import numpy as np
import torch
from pydantic import Field
from torch import nn

from compress.config import Strict
from compress.quantization.measure import p50_ratios
from export.onnx_export import export_onnx
from serve_bench.stats.latency_intervals import MIN_BLOCKS
from serve_bench.runners import runtime_title, usable_onnx_runtimes

log = logging.getLogger(__name__)


class DeployedLatencySettings(Strict):
    """How the prune stage times the pruned model against the unpruned one on the runtimes the file ships on."""

    enabled: bool = Field(True, description="time both models, exported, on the CPU runtimes (false: no latency "
                                            "figure, and target auto judges accuracy alone)")
    deployed_on: list[str] | None = Field(None, description="the runtimes to time on (default: those the bench "
                                                            "stage names in its runtimes, else every ONNX runtime "
                                                            "usable on this machine, as the bench runs them)")
    min_iters: int = Field(300, ge=50, description="requests per file at least")
    seconds: float = Field(2.0, gt=0, description="measured seconds per file at least: about 10 interleaved rounds "
                                                  "for a 4-ms file, the fewest a ratio's interval rests on")


def runtimes_of(settings: DeployedLatencySettings, field: str, stages: list | None = None) -> list[str]:
    """The runtimes to time on: ``deployed_on``, else those the pipeline's bench stages measure ONNX files on where
    they name them (``runtimes``), else every usable one; a named runtime not usable here is a ValueError."""
    usable = usable_onnx_runtimes("cpu")
    if settings.deployed_on is None:
        named = [rt for stage in stages or [] if getattr(stage, "kind", None) == "bench"
                 for rt in (getattr(stage, "runtimes", None) or [])]
        return [rt for rt in usable if rt in named] if named else usable
    missing = [r for r in settings.deployed_on if r not in usable]
    if missing:
        raise ValueError(f"{field}.deployed_on: {', '.join(missing)} cannot run here (usable: "
                         f"{', '.join(usable) or 'none'}); install it or leave it out")
    return list(settings.deployed_on)


def _export(model: nn.Module, example: torch.Tensor, path: Path) -> Path:
    """The model as the export stage writes it (batch dimension dynamic: torch.export needs a sample of two)."""
    return export_onnx(model, torch.zeros(2, *example.shape[1:], dtype=example.dtype), path).path


class NotTimed(Exception):
    """The models could not be exported or timed (a model the ONNX exporter or a runtime refuses): the stage goes on
    without a latency figure and says why."""


def ratios(unpruned: nn.Module | Path, pruned: nn.Module, example: torch.Tensor, runtimes: list[str],
           settings: DeployedLatencySettings, folder: Path | None = None) -> dict[str, dict]:
    """Per runtime: the pruned file's p50 over the unpruned one's, paired by round, with its interval and verdict
    (``faster`` only where the whole interval is below 1). ``unpruned`` may be a file already exported (a search
    in steps exports it once). Inputs are drawn at random: a CNN's time does not depend on the pixels."""
    if not runtimes:
        return {}
    try:
        return _ratios(unpruned, pruned, example, runtimes, settings, folder)
    except Exception as exc:  # noqa: BLE001 - any exporter or runtime failure leaves the figure out, said
        raise NotTimed(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc


def _ratios(unpruned: nn.Module | Path, pruned: nn.Module, example: torch.Tensor, runtimes: list[str],
            settings: DeployedLatencySettings, folder: Path | None) -> dict[str, dict]:
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        work = Path(tmp)
        reference = unpruned if isinstance(unpruned, Path) else _export(unpruned, example, work / "unpruned.onnx")
        candidate = _export(pruned, example, work / "pruned.onnx")
        pool = np.random.default_rng(0).standard_normal((8, *example.shape[1:])).astype(np.float32)
        out = {}
        for runtime in runtimes:
            ratio = p50_ratios(reference, {"pruned": candidate}, pool, runtime=runtime,
                               min_iters=settings.min_iters, seconds=settings.seconds)["pruned"]
            out[runtime] = {"p50_ratio": ratio["ratio"], "ci": ratio["ci"], "verdict": ratio["verdict"],
                            "rounds": ratio["rounds"]}
        return out


def pays(measured: dict[str, dict]) -> bool:
    """Pruning pays where the pruned file is shown faster on every runtime timed (true where none was timed), each
    verdict resting on at least ``MIN_BLOCKS`` rounds (fewer: the interval is not trusted, nothing is shown)."""
    return all(r["verdict"] == "faster" and r["rounds"] >= MIN_BLOCKS for r in measured.values())


def words(measured: dict[str, dict]) -> str:
    """One clause per runtime for the log: 'onnxruntime ×0.62 [0.60, 0.64] faster'."""
    return "; ".join(f"{runtime_title(rt)} ×{r['p50_ratio']:.2f} [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}] {r['verdict']}"
                     + (f" (only {r['rounds']} rounds: not trusted)" if r["rounds"] < MIN_BLOCKS else "")
                     for rt, r in measured.items()) or "not timed"


class UnprunedFile:
    """The unpruned model exported once, for a search that times many steps against it."""

    def __init__(self, model: nn.Module, example: torch.Tensor, folder: Path | None = None) -> None:
        self._tmp = tempfile.TemporaryDirectory(dir=folder)
        self.path = _export(model, example, Path(self._tmp.name) / "unpruned.onnx")

    def close(self) -> None:
        self._tmp.cleanup()

    def __enter__(self) -> "UnprunedFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
