"""Train-step throughput: bf16 autocast vs fp32, and the loop's overhead against a bare loop.

    python -m train.benchmark [--model resnet20] [--model-args '{"width": 32}'] [--data mnist5k]
                              [--batch-size 128] [--steps 15]

The default is the quickstart's ResNet-20 at twice its width: at width 16 the
convolutions are so small that memory traffic, not arithmetic, bounds a step and bf16
gains less (pass --model-args '{}' to measure the quickstart model itself).

All variants run in one process on the same model architecture and the same batches,
interleaved over several rounds so machine noise hits them alike; the median round is
reported. Peak memory is measured per precision in a fresh child process each, because
a process's resident high-water mark never goes down.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time

import torch
from torch import nn
from torch.nn import functional as F

from train.data import BatchStream, DataSpec, load_data
from train.loop import FitResult, LoopSettings, fit
from train.models import build_model
from train.optim import lr_factor, make_optimizer, make_scheduler
from train.precision import make_precision


def _setup(args: argparse.Namespace, steps: int):
    data = load_data(DataSpec(name=args.data, image_size=args.image_size, channels=args.channels))
    torch.manual_seed(0)
    model = build_model(args.model, data.num_classes, data.input_shape[0], json.loads(args.model_args))
    stream = BatchStream(data.train, data, args.batch_size, shuffle=True, drop_last=True)
    stream_len = len(stream)
    if stream_len < steps:
        raise SystemExit(f"--steps {steps} exceeds the {stream_len} batches of one epoch; lower it")
    return data, model, stream


def _bare_loop(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """The reference: the plainest correct fp32 loop over already-normalised batches."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()


def _our_loop(model: nn.Module, stream: BatchStream, steps: int, amp: str, channels_last: bool = False) -> FitResult:
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        stream = BatchStream(stream.split, stream.bundle, stream.batch_size, shuffle=True, drop_last=True,
                             channels_last=True)
    precision = make_precision(amp, torch.device("cpu"))
    optimizer = make_optimizer(model, "adamw", 1e-3, 0.0)
    scheduler = make_scheduler(optimizer, lr_factor("constant", steps))
    settings = LoopSettings(epochs=1, label="bench", heartbeat_s=1e9)
    return fit(model, stream, None, optimizer, scheduler, precision, settings)


def _timed(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def _truncated(stream: BatchStream, steps: int) -> BatchStream:
    n = steps * stream.batch_size  # one epoch of exactly `steps` batches
    split = stream.split.head(n)
    return BatchStream(split, stream.bundle, stream.batch_size, shuffle=True, drop_last=True)


def _memory_child(args: argparse.Namespace, amp: str) -> float:
    cmd = [sys.executable, "-m", "train.benchmark", "--child-memory", amp, "--model", args.model,
           "--model-args", args.model_args,
           "--batch-size", str(args.batch_size), "--steps", str(args.steps), "--data", args.data]
    for flag, value in (("--image-size", args.image_size), ("--channels", args.channels)):
        if value is not None:
            cmd += [flag, str(value)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["peak_mb"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--model-args", default='{"width": 32}', help="builder arguments as JSON")
    parser.add_argument("--data", default="mnist5k")
    parser.add_argument("--image-size", type=int, help="default: the data set's own size")
    parser.add_argument("--channels", type=int, choices=[1, 3], help="default: the data set's own channels")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--child-memory", choices=["off", "bf16"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    data, model, stream = _setup(args, args.steps)
    stream = _truncated(stream, args.steps)
    if args.child_memory:
        result = _our_loop(model, stream, args.steps, args.child_memory)
        print(json.dumps({"peak_mb": result.peak_memory_bytes / 2**20, "kind": result.peak_memory_kind}))
        return 0

    batches = list(stream.epoch(0))
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    variants = {
        "bare fp32": lambda: _bare_loop(model, batches),
        "loop fp32": lambda: _our_loop(model, stream, args.steps, "off"),
        "loop bf16": lambda: _our_loop(model, stream, args.steps, "bf16"),
        "loop fp32 channels_last": lambda: _our_loop(model, stream, args.steps, "off", channels_last=True),
        "loop bf16 channels_last": lambda: _our_loop(model, stream, args.steps, "bf16", channels_last=True),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    with open(os.devnull, "w") as quiet, contextlib.redirect_stderr(quiet):
        for name, run in variants.items():  # warm-up: oneDNN primitive creation, allocator growth
            model.to(memory_format=torch.contiguous_format).load_state_dict(initial)
            _timed(run)
        for _ in range(args.rounds):
            for name, run in variants.items():
                model.to(memory_format=torch.contiguous_format).load_state_dict(initial)
                times[name].append(_timed(run))
    images = args.steps * args.batch_size
    throughput = {name: images / statistics.median(t) for name, t in times.items()}
    memory = {"fp32": _memory_child(args, "off"), "bf16": _memory_child(args, "bf16")}
    result = {
        "model": args.model, "model_args": json.loads(args.model_args), "data": args.data,
        "input": list(data.input_shape), "batch_size": args.batch_size, "steps": args.steps, "rounds": args.rounds, "threads": torch.get_num_threads(),
        "images_per_s": {k: round(v, 1) for k, v in throughput.items()},
        "amp_speedup": round(throughput["loop bf16"] / throughput["loop fp32"], 3),
        "amp_speedup_channels_last": round(throughput["loop bf16 channels_last"] / throughput["loop fp32 channels_last"], 3),
        "bf16_channels_last_over_fp32": round(throughput["loop bf16 channels_last"] / throughput["loop fp32"], 3),
        "loop_overhead_pct": round(100 * (throughput["bare fp32"] / throughput["loop fp32"] - 1), 2),
        "peak_memory_mb": {k: round(v, 1) for k, v in memory.items()},
    }

    from rich.console import Console
    from rich.table import Table

    c, h, w = data.input_shape
    table = Table(title=f"train step throughput: {args.model} {args.model_args} on {args.data} {c}×{h}×{w}, "
                        f"batch {args.batch_size}")
    table.add_column("variant")
    table.add_column("images/s", justify="right")
    table.add_column("median s / round", justify="right")
    for name, t in times.items():
        table.add_row(name, f"{throughput[name]:,.0f}", f"{statistics.median(t):.3f}")
    console = Console()
    console.print(table)
    console.print(f"AMP bf16 speed-up over fp32: {result['amp_speedup']:.2f}× (both channels_last: "
                  f"{result['amp_speedup_channels_last']:.2f}×; bf16+channels_last over plain fp32: "
                  f"{result['bf16_channels_last_over_fp32']:.2f}×)   "
                  f"loop overhead vs bare loop: {result['loop_overhead_pct']:+.1f}%   "
                  f"peak training memory (RSS growth) fp32 {memory['fp32']:.0f} MB, bf16 {memory['bf16']:.0f} MB")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
