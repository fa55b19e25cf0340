"""Is the pruned model faster where it ships? Both models exported to ONNX and timed on the CPU runtimes.

Fewer MACs is not less time: a pruned width off the block a runtime's convolutions work in (9, 151, 433
channels) can make the file slower than the unpruned one on onnxruntime while torch eager, which the prune
stage used to time, says it is faster. So the prune stage and each step of ``target: {macs: auto}`` export
the pruned and the unpruned model and time them with the bench's own harness, threads and runtime settings: each
file in its own worker, interleaved in rounds, batch 1, the p50 ratio paired by round with its 95% interval, on
every ONNX runtime the bench measures on (``deployed_on`` narrows them). The timing is sized by rounds, not by
requests: a verdict rests on at least ``MIN_BLOCKS`` rounds, and a request count fixed for every model gave a
60-ms file 6 rounds and never a verdict. It decides whether pruning pays; the bench stage measures the files that
ship.
"""
from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from pydantic import Field
from torch import nn

from compress.config import Strict
from compress.quantization.measure import RoundPlan, p50_ratios_in_rounds
from compress.stages.runtime_choice import bench_plan
from export.onnx_export import export_onnx
from serve_bench.stats.latency_intervals import MIN_BLOCKS
from serve_bench.runners import RUNNER_OF_KIND, runtime_title, runtime_versions, usable_onnx_runtimes

log = logging.getLogger(__name__)


class DeployedLatencySettings(Strict):
    """How the prune stage times the pruned model against the unpruned one on the runtimes the file ships on."""

    enabled: bool = Field(True, description="time both models, exported, on the CPU runtimes (false: no latency "
                                            "figure, and target auto judges accuracy alone)")
    deployed_on: list[str] | None = Field(None, description="the runtimes to time on (default: those the bench "
                                                            "stage names in its runtimes, else every ONNX runtime "
                                                            "usable on this machine, as the bench runs them)")
    rounds: int = Field(12, ge=MIN_BLOCKS, description=f"interleaved rounds both files run in: the verdict's "
                                                       f"interval rests on them (at least {MIN_BLOCKS})")
    round_s: float = Field(0.15, gt=0, description="seconds of requests per file in a round (a block), at least "
                                                   "min_block requests: a slow file runs min_block, never fewer rounds")
    min_block: int = Field(5, ge=1, description="requests per file in a round, at least")
    budget_s: float = Field(120.0, gt=0, description="seconds one check (a step of target auto) may take on all its "
                                                     "runtimes; a check planned past it is said before it runs, and "
                                                     "still runs its rounds (the default holds a 100-ms file on two "
                                                     "runtimes)")
    min_iters: int | None = Field(None, ge=1, description="deprecated and ignored: the check is sized by rounds")
    seconds: float | None = Field(None, gt=0, description="deprecated and ignored: the check is sized by rounds "
                                                          "(round_s)")

    def plan(self, runtimes: int = 1) -> RoundPlan:
        """The rounds of one runtime's timing, with its share of the check's budget."""
        return RoundPlan(rounds=self.rounds, round_s=self.round_s, min_block=self.min_block,
                         budget_s=self.budget_s / max(runtimes, 1))


@dataclass
class Deployment:
    """Where and how a pruned file is timed: the runtimes, and the bench's threads and runner options on each
    (a check timed with other threads than the bench's can call a width fast that the bench then finds slow)."""

    runtimes: list[str]
    threads: int | None = None
    options: dict[str, dict] = field(default_factory=dict)

    def key(self) -> dict:
        """What the timing's verdict depends on besides the models: for the stage's cache key."""
        return {"deployed_on": self.runtimes, "versions": runtime_versions(self.runtimes), "threads": self.threads,
                "options": {r: self.options[r] for r in self.runtimes if r in self.options}}


def _named(stage, key: str):
    """A stage's setting, from its validated config or from the pipeline file's raw dict."""
    return stage.get(key) if isinstance(stage, dict) else getattr(stage, key, None)


def deployment_of(settings: DeployedLatencySettings, field: str, stages: list | None = None) -> Deployment:
    """The runtimes to time on (:func:`runtimes_of`), with the threads and runner options of the pipeline's last
    bench stage, as the bench will run the file."""
    runtimes = runtimes_of(settings, field, stages)
    benches = [s if isinstance(s, dict) else s.model_dump(mode="json", exclude_unset=True)
               for s in stages or [] if _named(s, "kind") == "bench"]
    plan = bench_plan(benches)
    options = {r: dict(plan[r]) for r in runtimes if plan.get(r)}
    onnx_home = RUNNER_OF_KIND["onnx"]  # the bench gives each ONNX file on its home runtime its inter-op threads
    if onnx_home in runtimes:
        inter_op = (benches[-1].get("inter_op_threads") if benches else None) or 1
        options[onnx_home] = {**options.get(onnx_home, {}), "inter_op_threads": inter_op}
    return Deployment(runtimes, plan["threads"], options)


def runtimes_of(settings: DeployedLatencySettings, field: str, stages: list | None = None) -> list[str]:
    """The runtimes to time on: ``deployed_on``, else those the pipeline's bench stages measure ONNX files on where
    they name them (``runtimes``), else every usable one; a named runtime not usable here is a ValueError."""
    usable = usable_onnx_runtimes("cpu")
    if settings.deployed_on is None:
        named = [rt for stage in stages or [] if _named(stage, "kind") == "bench"
                 for rt in (_named(stage, "runtimes") or [])]
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


def ratios(unpruned: nn.Module | Path, pruned: nn.Module, example: torch.Tensor, where: Deployment | list[str],
           settings: DeployedLatencySettings, folder: Path | None = None) -> dict[str, dict]:
    """Per runtime: the pruned file's p50 over the unpruned one's, paired by round, with its interval, verdict
    (``faster`` only where the whole interval is below 1), rounds and what the timing cost. ``unpruned`` may be a
    file already exported (a search in steps exports it once). Inputs are drawn at random: a CNN's time does not
    depend on the pixels."""
    where = where if isinstance(where, Deployment) else Deployment(list(where))
    if not where.runtimes:
        return {}
    try:
        return _ratios(unpruned, pruned, example, where, settings, folder)
    except Exception as exc:  # noqa: BLE001 - any exporter or runtime failure leaves the figure out, said
        raise NotTimed(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc


def _ratios(unpruned: nn.Module | Path, pruned: nn.Module, example: torch.Tensor, where: Deployment,
            settings: DeployedLatencySettings, folder: Path | None) -> dict[str, dict]:
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        work = Path(tmp)
        reference = unpruned if isinstance(unpruned, Path) else _export(unpruned, example, work / "unpruned.onnx")
        candidate = _export(pruned, example, work / "pruned.onnx")
        pool = np.random.default_rng(0).standard_normal((8, *example.shape[1:])).astype(np.float32)
        out = {}
        for runtime in where.runtimes:
            measured, cost = p50_ratios_in_rounds(reference, {"pruned": candidate}, pool,
                                                  settings.plan(len(where.runtimes)),
                                                  runtime=runtime, threads=where.threads,
                                                  options=where.options.get(runtime))
            ratio = measured["pruned"]
            out[runtime] = {"p50_ratio": ratio["ratio"], "ci": ratio["ci"], "verdict": ratio["verdict"],
                            "rounds": ratio["rounds"], "cost": cost}
        return out


def cost_words(measured: dict[str, dict]) -> str:
    """What the timing took, for the log: rounds, block, the unpruned file's time per request, seconds."""
    costs = {rt: r["cost"] for rt, r in measured.items() if r.get("cost")}
    if not costs:
        return ""
    total = sum(c["took_s"] for c in costs.values())
    return (f"timed in {total:.0f} s (" + "; ".join(
        f"{runtime_title(rt)}: {c['rounds']} rounds of {c['block']} requests a file, unpruned "
        f"{c['reference_ms']:g} ms a request, {c['took_s']:g} s" for rt, c in costs.items()) + ")")


def planned_seconds(settings: DeployedLatencySettings, per_request_s: float, runtimes: int) -> float:
    """What one check is planned to take for a file of ``per_request_s`` (both files at that time: an upper
    bound, the pruned file being the faster as a rule), on ``runtimes`` runtimes."""
    plan = settings.plan()
    return runtimes * plan.seconds([per_request_s] * 2, plan.block(per_request_s))


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
