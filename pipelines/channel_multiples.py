"""What channel counts the CPU runtimes want: the time per MAC of a convolution at widths that are multiples of
1, 2, 4, 8, 16 or 32 channels, on onnxruntime and OpenVINO, in one interleaved run per kernel and runtime.

    python pipelines/channel_multiples.py                         # about 4 minutes on 2 cores
    ONEDNN_MAX_CPU_ISA=AVX2 python pipelines/channel_multiples.py --runtimes openvino --out runs/channel-multiples-avx2

Pruning leaves whatever widths the ranking gives (9, 15, 151, 433 …) unless ``round_to`` rounds them, and the
x86 kernels of both runtimes work on channel blocks (8 floats an AVX2 register, 16 an AVX-512 one, 4 int8 a VNNI
lane): a width off the block pays for the padding or falls to a slower path. This measures how much, on the
machine it runs on, for the three convolutions a pruned CNN is made of: a 3×3 dense convolution, a 1×1
(pointwise) one, and an inverted-residual block (1×1 expansion to the width, 3×3 depthwise at it, 1×1 back),
each three layers deep at batch 1. The widths are near one base (96 channels at 28×28, a mid stage of a
MobileNet at 224 px) so their work differs by a few percent, and each width's p50 is divided by its MACs: the
figure is the time per MAC against the width that is a multiple of 32, paired by round with its 95% interval.
``ONEDNN_MAX_CPU_ISA`` caps OpenVINO's oneDNN kernels (AVX2 on an AVX-512 CPU: the AVX2 kernels' block sizes,
not an AVX2 CPU's speed); onnxruntime picks its kernels from the CPU and has no such cap.
Writes ``multiples.json`` and ``multiples.md`` under ``--out``; the prune stage's ``round_to: auto`` reads the
multiples these tables led to from each runner's ``channel_blocks``.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

WIDTHS = {1: 97, 2: 98, 4: 100, 8: 104, 16: 112, 32: 96}  # channels, by the largest power of two dividing them
KINDS = ("dense3x3", "pointwise", "inverted_residual")
SIDE = 28
BLOCK_IN = 32  # an inverted residual block's input and output width (a multiple of 32 in every block)


def block(kind: str, width: int) -> nn.Module:
    """The model of one kind at one width: every kind takes ``BLOCK_IN`` channels, so one input serves all."""
    if kind == "inverted_residual":
        return nn.Sequential(*[m for _ in range(3) for m in (
            nn.Conv2d(BLOCK_IN, width, 1), nn.ReLU6(), nn.Conv2d(width, width, 3, padding=1, groups=width), nn.ReLU6(),
            nn.Conv2d(width, BLOCK_IN, 1))])
    side = 3 if kind == "dense3x3" else 1
    return nn.Sequential(nn.Conv2d(BLOCK_IN, width, 1), nn.ReLU(),
                         *[m for _ in range(3) for m in (nn.Conv2d(width, width, side, padding=side // 2), nn.ReLU())])


def macs(model: nn.Module) -> int:
    """Multiply-accumulates of one image (every convolution keeps the side)."""
    return sum(m.weight.numel() * SIDE * SIDE for m in model.modules() if isinstance(m, nn.Conv2d))


def export(model: nn.Module, path: Path) -> None:
    from export.onnx_export import export_onnx

    torch.manual_seed(0)
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_uniform_(m.weight)
    export_onnx(model.eval(), torch.zeros(1, BLOCK_IN, SIDE, SIDE), path)


def measure(kind: str, runtime: str, folder: Path, seconds: float, options: dict | None = None) -> dict[int, dict]:
    """Every width of one kind on one runtime, interleaved: p50, and the per-MAC cost against the 32-multiple."""
    from compress.quantization.measure import interleaved
    from serve_bench.latency.harness import HarnessSettings
    from serve_bench.stats.latency_intervals import paired_ratio
    from serve_bench.stats.summary import percentile

    paths, work = {}, {}
    for multiple, width in WIDTHS.items():
        model = block(kind, width)
        paths[str(multiple)] = folder / f"{kind}-{width}.onnx"
        if not paths[str(multiple)].exists():
            export(model, paths[str(multiple)])
        work[multiple] = macs(model)
    pool = np.random.default_rng(0).standard_normal((8, BLOCK_IN, SIDE, SIDE)).astype(np.float32)
    measured = interleaved(paths, pool, HarnessSettings(min_iters=300, min_duration_s=seconds), runtime=runtime,
                           options=options)
    out = {}
    for multiple in WIDTHS:
        m, ref = measured[str(multiple)], measured["32"]
        ratio = paired_ratio(m.blocked, ref.blocked, 50)
        scale = work[32] / work[multiple]  # time per MAC: the p50 ratio times the reference's work over this one's
        out[multiple] = {"width": WIDTHS[multiple], "macs": work[multiple],
                         "p50_ms": round(percentile(m.latencies_ms, 50), 4),
                         "per_mac_vs_32": round(ratio.ratio * scale, 3),
                         "per_mac_vs_32_ci": [round(ratio.ci[0] * scale, 3), round(ratio.ci[1] * scale, 3)]}
    return out


def machine() -> str:
    from train.hardware import machine_words

    return machine_words()


def table(results: dict[str, dict[str, dict]]) -> str:
    head = "| runtime | kernel | " + " | ".join(f"×{m} ({w} ch)" for m, w in sorted(WIDTHS.items())) + " |"
    lines = [head, "|---|---|" + "---|" * len(WIDTHS)]
    for runtime, kinds in results.items():
        for kind, rows in kinds.items():
            cells = [f"{rows[str(m)]['p50_ms']:.3f} ms, {rows[str(m)]['per_mac_vs_32']:.2f} "
                     f"[{rows[str(m)]['per_mac_vs_32_ci'][0]:.2f}, {rows[str(m)]['per_mac_vs_32_ci'][1]:.2f}]"
                     for m in sorted(WIDTHS)]
            lines.append(f"| {runtime} | {kind} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from serve_bench.runners import ONNX_RUNTIMES, usable_onnx_runtimes

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtimes", nargs="+", default=list(ONNX_RUNTIMES), choices=list(ONNX_RUNTIMES))
    parser.add_argument("--openvino-precision", nargs="+", default=["auto", "f32"], choices=["auto", "f32", "bf16"],
                        help="OpenVINO's inference precisions to measure (auto: bf16 where the CPU has it natively; "
                             "f32 under ONEDNN_MAX_CPU_ISA=AVX2, which has no bf16)")
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per file (interleaved)")
    parser.add_argument("--out", type=Path, default=Path("runs/channel-multiples"))
    args = parser.parse_args(argv)
    usable = usable_onnx_runtimes("cpu")
    missing = [r for r in args.runtimes if r not in usable]
    if missing:
        print(f"not installed or not usable here: {', '.join(missing)}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        setups = [(runtime, {}) if runtime != "openvino" else (f"{runtime} {p}", {"inference_precision": p})
                  for runtime in args.runtimes for p in (args.openvino_precision if runtime == "openvino" else [""])]
        for label, options in setups:
            runtime = label.split()[0]
            for kind in args.kinds:
                print(f"{label}: {kind} at {len(WIDTHS)} widths, interleaved", flush=True)
                rows = measure(kind, runtime, Path(tmp), args.seconds, options)
                results.setdefault(label, {})[kind] = {str(m): r for m, r in rows.items()}
                (args.out / "multiples.json").write_text(json.dumps({"machine": machine(), "results": results},
                                                                    indent=2))
    text = (f"Machine: {machine()}\n\nEach cell: p50, and the time per MAC over the 32-multiple width's "
            f"(paired by round, 95% CI)\n\n{table(results)}\n")
    (args.out / "multiples.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
