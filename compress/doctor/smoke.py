"""A seconds-long smoke run of every runtime on a tiny convolutional model.

A runtime that imports can still fail on the first real file (a kernel missing for this CPU, a
plugin that does not load, an engine that does not build), and the bench would only say so after
training and quantizing. Here the same path a pipeline takes is walked on a tiny model: exported
with the export stage's ``export_onnx``, loaded through the bench's own runners
(``serve_bench.runners.make_runner``; torch from a saved model artifact like a trained model), run
up to 50 times; each runtime's p50 and its largest logit difference from torch are reported, and a
failing runtime is one row with its error, not the end of the command.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

SHAPE = (1, 3, 32, 32)
SEED = 0
# Each runtime's largest |Δlogit| accepted (as a share of the largest |logit|, at least 1) and the options that keep
# it in fp32 are on its runner (``smoke_tolerance``, ``smoke_options``): fp32 runtimes agree to ~1e-6 on this model.
PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
# Timed runs per runtime: up to ``iters``, but a runtime slowed by a busy machine stops after MAX_SECONDS
# (and MIN_ITERS runs), so the whole smoke run stays within seconds.
MIN_ITERS, MAX_SECONDS = 10, 1.5


def tiny_convnet(num_classes: int = 10, in_channels: int = 3):
    """Conv-BN-ReLU ×3 and a linear head: the callable a model artifact names, so torch's runner rebuilds it."""
    from torch import nn

    def block(cin: int, cout: int, stride: int = 1) -> list:
        return [nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    return nn.Sequential(*block(in_channels, 8), *block(8, 16, 2), *block(16, 32, 2), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(32, num_classes))


@dataclass
class SmokeModel:
    model_dir: Path  # a model artifact (safetensors + JSON) for torch's runner
    onnx_path: Path
    sample: np.ndarray
    reference: np.ndarray  # torch's logits for ``sample``
    export_s: float


def prepare(folder: Path) -> SmokeModel:
    """Build the tiny model (fixed seed, BN statistics set so folding them is exercised), save it, export it."""
    import torch

    from export.onnx_export import export_onnx
    from train.model_io import describe, save_model

    with torch.random.fork_rng(devices=[]), torch.no_grad():  # the same model every time; the caller's RNG untouched
        torch.manual_seed(SEED)
        model = tiny_convnet()
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)
    model.eval()
    sample = torch.randn(*SHAPE, generator=torch.Generator().manual_seed(SEED))
    model_dir = folder / "model"
    save_model(model, model_dir, describe(f"{__name__}:tiny_convnet", 10, SHAPE[1], {},
                                          {"mean": [0.0] * SHAPE[1], "std": [1.0] * SHAPE[1]}))
    start = time.perf_counter()
    info = export_onnx(model, sample, folder / "model.onnx")
    export_s = time.perf_counter() - start
    with torch.inference_mode():
        reference = model(sample).numpy()
    logger.info("smoke model exported to %s in %.1f s", info.path, export_s)
    return SmokeModel(model_dir, info.path, sample.numpy(), reference, export_s)


@dataclass
class SmokeResult:
    runtime: str
    status: str  # PASS | FAIL | SKIP
    p50_ms: float | None = None
    max_abs_diff: float | None = None
    detail: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def run_one(runtime: str, smoke: SmokeModel, folder: Path, threads: int, iters: int) -> SmokeResult:
    """Load ``runtime`` through the bench's runner, run up to ``iters`` times (at most ``MAX_SECONDS``), compare
    with torch; any error becomes this runtime's FAIL."""
    try:
        from serve_bench.runners import RUNNERS, make_runner

        runner_class = RUNNERS[runtime]
        path, device = runner_class.smoke_file(smoke.model_dir, smoke.onnx_path, folder)
        options = dict(runner_class.smoke_options)
        with make_runner(runtime, path, threads=threads, device=device, **options) as runner:
            for _ in range(3):  # warm-up: first-call allocations and kernel choices
                out = runner.infer(smoke.sample)
            times, deadline = [], time.perf_counter() + MAX_SECONDS
            while len(times) < iters and (len(times) < MIN_ITERS or time.perf_counter() < deadline):
                start = time.perf_counter()
                out = runner.infer(smoke.sample)
                times.append(time.perf_counter() - start)
    except Exception as exc:  # any runtime error (RunnerError, RuntimeError, OSError...) is this row's FAIL
        logger.info("smoke run of %s failed", runtime, exc_info=True)
        text = str(exc).strip()
        return SmokeResult(runtime, FAIL, detail=f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}")
    diff = float(np.max(np.abs(np.asarray(out, dtype=np.float32) - smoke.reference)))
    limit = runner_class.smoke_tolerance * max(1.0, float(np.max(np.abs(smoke.reference))))
    p50 = float(np.median(times) * 1e3)
    detail = f"{len(times)} runs on {device}, {threads} threads" + "".join(f", {k} {v}" for k, v in options.items())
    if not np.isfinite(diff) or diff > limit:
        return SmokeResult(runtime, FAIL, p50, diff, f"{detail}; answers differ from torch by more than {limit:.1e}")
    return SmokeResult(runtime, PASS, p50, diff, detail)


def run_smoke(runtimes: list[str], skipped: dict[str, str], folder: Path, threads: int, iters: int = 50) -> dict:
    """The smoke section: the export, then one result per runtime (``skipped``: runtime → why it is not run)."""
    start = time.perf_counter()
    try:
        smoke = prepare(folder)
    except Exception as exc:  # the exporter raises many types; the runtimes cannot be tried without its file
        logger.info("smoke model could not be prepared", exc_info=True)
        return {"export": f"FAIL {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}",
                "results": [SmokeResult(r, FAIL, detail="the smoke model did not export").as_dict() for r in runtimes]
                + [SmokeResult(r, SKIP, detail=why).as_dict() for r, why in skipped.items()],
                "seconds": round(time.perf_counter() - start, 2)}
    from serve_bench.latency.machine_load import BUSY_SHARE, LoadSampler

    sampler = LoadSampler([os.getpid()])  # over all runtimes together: one runtime's few ms are too short to tell
    before = sampler.snapshot()
    results = [run_one(runtime, smoke, folder, threads, iters) for runtime in runtimes]
    other = sampler.other_share(before)
    results += [SmokeResult(runtime, SKIP, detail=why) for runtime, why in skipped.items()]
    return {"export": f"ok ({smoke.export_s:.1f} s, {smoke.onnx_path.name})", "model": "tiny_convnet 1×3×32×32",
            "results": [r.as_dict() for r in results], "seconds": round(time.perf_counter() - start, 2),
            "other_processes_share": None if other is None else round(other, 3),
            "busy": other is not None and other > BUSY_SHARE}
