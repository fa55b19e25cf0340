"""Does a busy neighbour move the interleaved latency ratio of two files? A benchmark of the machine, not a test.

    python -m serve_bench.latency.neighbour_check REFERENCE.onnx CANDIDATE.onnx [--phases 8] [--threads 1] [--json OUT]

Quiet and busy phases come in the order quiet, busy, busy, quiet (repeated), so both kinds sit at the
same mean position in the run and a slow drift of the machine does not read as the neighbour's doing.
In a busy phase another process keeps ``--burners`` cores busy with a Python loop. Every phase is one
interleaved measurement of both files by the bench's own harness and workers, and gives the paired
p50 and p99 ratios (candidate over reference) with their block-paired intervals, each file's p50, and
the share of all cores other processes used.

The shift is judged across phases, not within one: each busy phase is paired with the quiet phase
beside it, and the mean of the log ratios of those pairs gets a t interval. A phase's own interval
rests on its rounds alone and says nothing of how much the ratio moves from one measurement to the
next, which on a shared machine can be far more (a quiet AVX2 EPYC: 12% between quiet phases). The
t interval covers the spread between phases of this one run, with the same two worker processes
throughout; another run (other processes, another placement on the machine) may differ by more, so
repeat the command to see that. With 8 phases it rests on 4 pairs (3 degrees of freedom).

Why a benchmark and not a test: interleaving makes a neighbour that slows the machine slow both
files alike (a simulation with a known answer tests that), but a neighbour that is there the whole
time may change the ratio itself, by how it competes for the core: a CI runner measured an INT8/fp32
p50 ratio 1.63 [1.55, 1.71] in one run and 1.83 [1.69, 1.96] beside a neighbour in the next (one
pair, so that is not told apart from run-to-run noise); why it moved there was not measured.
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
from scipy import stats

from serve_bench.latency.harness import HarnessSettings, measure_interleaved
from serve_bench.stats.latency_intervals import paired_ratio
from serve_bench.latency.machine_load import load_summary
from serve_bench.runners import RUNNER_OF_KIND
from serve_bench.stats.summary import percentile
from serve_bench.latency.worker import BenchWorker, all_ready
from train.atomic_io import atomic_write_text

BURNER = "while True: pass"


def input_pool(path: str | Path, count: int = 64, seed: int = 0) -> np.ndarray:
    """Random inputs of the file's first input shape (a symbolic batch becomes 1)."""
    import onnx

    first = onnx.load(str(path), load_external_data=False).graph.input[0]
    dims = [d.dim_value if d.dim_value > 0 else 1 for d in first.type.tensor_type.shape.dim]
    return np.random.default_rng(seed).standard_normal((count, *dims[1:])).astype(np.float32)


def phase_kinds(phases: int) -> list[str]:
    """quiet, busy, busy, quiet, repeated: in every group of four both kinds have the same mean position, so a
    drift that is linear in time cancels from the comparison. Other counts would leave a phase unpaired or
    the pairs' offsets unbalanced (2 phases: the whole drift of a phase reads as the neighbour's), so they are
    refused."""
    if phases < 4 or phases % 4:
        raise ValueError(f"--phases must be a multiple of 4 (quiet, busy, busy, quiet, repeated), got {phases}")
    return ["quiet" if i % 4 in (0, 3) else "busy" for i in range(phases)]


def adjacent_pairs(kinds: list[str]) -> list[tuple[int, int]]:
    """(busy, quiet) phase indices: each busy phase with the quiet phase beside it (the one after it when the
    one before is busy too, else the one before), so a pair is measured minutes apart at most."""
    pairs = []
    for i, kind in enumerate(kinds):
        if kind != "busy":
            continue
        before, after = i - 1, i + 1
        if before >= 0 and kinds[before] == "quiet":
            pairs.append((i, before))
        elif after < len(kinds) and kinds[after] == "quiet":
            pairs.append((i, after))
    return pairs


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
        workers = all_ready({name: stack.enter_context(BenchWorker(name, RUNNER_OF_KIND["onnx"], path, {"threads": threads}, pool,
                                                                   1, wait=False))
                             for name, path in (("reference", reference), ("candidate", candidate))})
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


def shift_interval(phases: list[dict], level: float = 0.95) -> dict:
    """The busy phases' p50 ratio over their adjacent quiet phases': the geometric mean over the pairs, with a
    t interval on the mean log ratio (none from a single pair: one pair has no spread to judge it by)."""
    kinds = [p["kind"] for p in phases]
    logs = np.array([math.log(phases[b]["ratio_p50"]["ratio"] / phases[q]["ratio_p50"]["ratio"])
                     for b, q in adjacent_pairs(kinds)])
    out = {"pairs": len(logs), "shift": round(math.expm1(float(logs.mean())), 4), "ci": None}
    if len(logs) >= 2:
        half = stats.t.ppf(0.5 + level / 2, len(logs) - 1) * float(logs.std(ddof=1)) / math.sqrt(len(logs))
        out["ci"] = [round(math.expm1(float(logs.mean()) - half), 4), round(math.expm1(float(logs.mean()) + half), 4)]
        out["level"] = level
    return out


def summarize(phases: list[dict]) -> dict:
    """The shift of the p50 ratio (paired busy-quiet phases, with its interval), how far the busy phases moved
    each file's own p50 (geometric means over the phases of each kind), and the quiet phases' spread."""
    by_kind = {kind: [p for p in phases if p["kind"] == kind] for kind in ("quiet", "busy")}
    quiet_ratios = [p["ratio_p50"]["ratio"] for p in by_kind["quiet"]]
    return {
        "ratio_p50": {kind: round(_geomean([p["ratio_p50"]["ratio"] for p in group]), 4)
                      for kind, group in by_kind.items()},
        "ratio_shift": shift_interval(phases),  # the figure to read: paired, with its interval
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
    parser.add_argument("--phases", type=int, default=8, help="quiet and busy phases, quiet-busy-busy-quiet "
                        "repeated (a multiple of 4)")
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
    shift = summary["ratio_shift"]
    print(f"busy vs quiet: p50 ratio {summary['ratio_p50']['quiet']:.4f} -> {summary['ratio_p50']['busy']:.4f}; "
          f"shift over {shift['pairs']} adjacent pair(s) {100 * shift['shift']:+.1f}%"
          + (" (one pair: no interval)" if shift["ci"] is None
             else f" [{100 * shift['ci'][0]:+.1f}%, {100 * shift['ci'][1]:+.1f}%]")
          + f"; p50 reference {100 * summary['p50_shift']['reference']:+.1f}%, "
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
