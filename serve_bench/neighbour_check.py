"""Does a busy neighbour move the interleaved latency ratio of two files? A benchmark of the machine, not a test.

    python -m serve_bench.neighbour_check REFERENCE.onnx CANDIDATE.onnx [--phases 4] [--threads 1] [--json OUT]

Quiet and busy phases alternate in one run (quiet, busy, quiet, busy, ...). In a busy phase another
process keeps ``--burners`` cores busy with a Python loop. Every phase is one interleaved measurement
of both files by the bench's own harness and workers, and gives the paired p50 and p99 ratios
(candidate over reference) with their block-paired intervals, each file's p50, and the share of all
cores other processes used.

Why a benchmark and not a test: interleaving makes a neighbour that comes and goes hit both files
alike (a simulation with a known answer tests that), but a neighbour that is there the whole time
can change the ratio itself: where two virtual cores are one physical core's two hardware threads,
the neighbour competes for the very execution units, and not equally for integer and float kernels.
A CI runner measured an INT8/fp32 p50 ratio 12% higher beside one; a 2-core EPYC with one thread per
core moved it under 1%. That is what a service would see beside such a neighbour, so it is reported,
with the quiet phases' own spread beside it to say how much of the shift is run-to-run noise.
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from serve_bench.harness import HarnessSettings, measure_interleaved
from serve_bench.latency_intervals import paired_ratio
from serve_bench.machine_load import load_summary
from serve_bench.stats import percentile
from serve_bench.worker import BenchWorker
from train.atomic_io import atomic_write_text

BURNER = "while True: pass"


def input_pool(path: str | Path, count: int = 64, seed: int = 0) -> np.ndarray:
    """Random inputs of the file's first input shape (a symbolic batch becomes 1)."""
    import onnx

    first = onnx.load(str(path), load_external_data=False).graph.input[0]
    dims = [d.dim_value if d.dim_value > 0 else 1 for d in first.type.tensor_type.shape.dim]
    return np.random.default_rng(seed).standard_normal((count, *dims[1:])).astype(np.float32)


def phase_kinds(phases: int) -> list[str]:
    """quiet, busy, quiet, busy, ...: alternating, so a slow drift of the machine does not line up with one kind."""
    if phases < 2:
        raise ValueError("--phases must be at least 2: one quiet and one busy phase")
    return ["quiet" if i % 2 == 0 else "busy" for i in range(phases)]


def _burners(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", BURNER]) for _ in range(count)]


def _stop(burners: list[subprocess.Popen]) -> None:
    for burner in burners:
        burner.kill()
        burner.wait()


def measure_phases(reference: str, candidate: str, kinds: list[str], settings: HarnessSettings, threads: int,
                   burners: int = 1, progress=None) -> list[dict]:
    """One interleaved measurement per phase; the workers live through all phases (loaded once, warm)."""
    pool = input_pool(reference)
    phases = []
    with ExitStack() as stack:
        workers = {name: stack.enter_context(BenchWorker(name, "onnxruntime", path, {"threads": threads}, pool, 1))
                   for name, path in (("reference", reference), ("candidate", candidate))}
        first_round = 0
        for index, kind in enumerate(kinds):
            running = _burners(burners) if kind == "busy" else []
            try:
                measured = measure_interleaved(workers, settings, first_round=first_round)
            finally:
                _stop(running)
            first_round = 1 + max(max(m.blocked.rounds) for m in measured.values())
            ref, cand = measured["reference"], measured["candidate"]
            phase = {"phase": index, "kind": kind,
                     "p50_ms": {name: round(percentile(m.latencies_ms, 50), 5) for name, m in measured.items()},
                     **{f"ratio_p{q}": paired_ratio(cand.blocked, ref.blocked, q).as_dict() for q in (50, 99)},
                     "machine_load": load_summary(ref.other_load + cand.other_load)}
            phases.append(phase)
            if progress is not None:
                progress(phase)
    return phases


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def summarize(phases: list[dict]) -> dict:
    """How far the busy phases moved each file's p50 and the p50 ratio from the quiet phases (geometric means
    over the phases of each kind), and the quiet phases' own spread of the ratio: the run-to-run noise."""
    by_kind = {kind: [p for p in phases if p["kind"] == kind] for kind in ("quiet", "busy")}
    ratio = {kind: _geomean([p["ratio_p50"]["ratio"] for p in group]) for kind, group in by_kind.items()}
    quiet_ratios = [p["ratio_p50"]["ratio"] for p in by_kind["quiet"]]
    return {
        "ratio_p50": {kind: round(value, 4) for kind, value in ratio.items()},
        "ratio_shift": round(ratio["busy"] / ratio["quiet"] - 1, 4),
        "p50_shift": {name: round(_geomean([p["p50_ms"][name] for p in by_kind["busy"]])
                                  / _geomean([p["p50_ms"][name] for p in by_kind["quiet"]]) - 1, 4)
                      for name in ("reference", "candidate")},
        "quiet_ratio_spread": round(max(quiet_ratios) / min(quiet_ratios) - 1, 4) if len(quiet_ratios) > 1 else None,
        "other_share_mean": {kind: _mean_share(group) for kind, group in by_kind.items()},
    }


def _mean_share(group: list[dict]) -> float | None:
    shares = [p["machine_load"]["other_share_mean"] for p in group if p["machine_load"]]
    return round(float(np.mean(shares)), 4) if shares else None


def _line(phase: dict) -> str:
    r = phase["ratio_p50"]
    share = (phase["machine_load"] or {}).get("other_share_mean")
    return (f"phase {phase['phase']} {phase['kind']:5s}: p50 ratio {r['ratio']:.4f} [{r['ci'][0]:.4f}, {r['ci'][1]:.4f}]"
            f" over {r['rounds']} rounds; p50 reference {phase['p50_ms']['reference']:.4f} ms, candidate "
            f"{phase['p50_ms']['candidate']:.4f} ms; other processes "
            f"{'?' if share is None else f'{100 * share:.0f}%'} of the cores")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reference", help="the file the ratio divides by (the fp32 file)")
    parser.add_argument("candidate", help="the file measured against it (the INT8 file)")
    parser.add_argument("--phases", type=int, default=4, help="alternating quiet and busy phases (at least 2)")
    parser.add_argument("--burners", type=int, default=1, help="cores the neighbour keeps busy in a busy phase")
    parser.add_argument("--threads", type=int, default=1, help="runtime threads per file")
    parser.add_argument("--min-duration", type=float, default=3.0, help="measured seconds per file per phase")
    parser.add_argument("--min-iters", type=int, default=1000, help="measured requests per file per phase")
    parser.add_argument("--json", type=Path, help="write the phases and the summary here")
    args = parser.parse_args(argv)
    for path in (args.reference, args.candidate):
        if not Path(path).is_file():
            print(f"error: {path}: no such file; give two ONNX files (reference, candidate)", file=sys.stderr)
            return 2
    try:
        kinds = phase_kinds(args.phases)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    settings = HarnessSettings(min_duration_s=args.min_duration, min_iters=args.min_iters)
    phases = measure_phases(args.reference, args.candidate, kinds, settings, args.threads, args.burners,
                            progress=lambda phase: print(_line(phase), flush=True))
    summary = summarize(phases)
    print(f"busy vs quiet: p50 ratio {summary['ratio_p50']['quiet']:.4f} -> {summary['ratio_p50']['busy']:.4f} "
          f"({100 * summary['ratio_shift']:+.1f}%); p50 reference {100 * summary['p50_shift']['reference']:+.1f}%, "
          f"candidate {100 * summary['p50_shift']['candidate']:+.1f}%"
          + ("" if summary["quiet_ratio_spread"] is None
             else f"; the quiet phases' ratios spread {100 * summary['quiet_ratio_spread']:.1f}%"))
    if args.json is not None:
        atomic_write_text(args.json, json.dumps({"reference": args.reference, "candidate": args.candidate,
                                         "threads": args.threads, "burners": args.burners,
                                         "phases": phases, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
