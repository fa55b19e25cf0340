"""The closed-loop measurement of every candidate and the figures of speed drawn from it (see the package's doc)."""
from __future__ import annotations

import numpy as np

from serve_bench.bench.specs import BenchSettings, TestSet
from serve_bench.latency.harness import measure_interleaved
from serve_bench.latency.worker import BenchWorker, WorkerError
from serve_bench.stats.latency_intervals import BlockedSamples, Ratio, block_bootstrap_ci, paired_ratio
from serve_bench.stats.summary import PERCENTILES, bootstrap_ci, summarize
from train.progress import LiveBar


def pool_of(test: TestSet, batch_size: int) -> np.ndarray:
    return test.images[: max(batch_size * 64, 256)]


def measure_rounds(workers: dict[str, BenchWorker], settings: BenchSettings, progress) -> tuple[dict, list[dict]]:
    """Every repeat's samples pooled per artifact (rounds kept distinct) and each repeat's percentiles."""
    pooled: dict[str, BlockedSamples] = {}
    walls = {name: [0.0, 0] for name in workers}
    short: set[str] = set()
    loads: dict[str, list] = {name: [] for name in workers}
    per_repeat: list[dict] = []
    next_round = 0
    # A bar with an ETA on a terminal (nothing in a log or CI) unless the caller follows the progress itself.
    with LiveBar(f"measuring {len(workers)} files", 100.0, live=None if progress is None else False) as bar:
        for repeat in range(settings.repeats):
            def step(done: float, repeat: int = repeat) -> None:  # the whole measurement's share done, 0 to 1
                share = (repeat + done) / settings.repeats
                progress(share) if progress is not None else bar.update(100.0 * share)

            measured = measure_interleaved(workers, settings.harness, step, first_round=next_round)
            next_round = 1 + max(max(m.blocked.rounds) for m in measured.values())
            per_repeat.append({name: {k: float(np.percentile(m.latencies_ms, q)) for k, q in PERCENTILES.items()}
                               for name, m in measured.items()})
            for name, m in measured.items():
                old = pooled.get(name)
                pooled[name] = m.blocked if old is None else BlockedSamples(old.blocks + m.blocked.blocks,
                                                                            old.rounds + m.blocked.rounds)
                walls[name][0] += m.wall_s
                walls[name][1] += m.requests
                loads[name] += m.other_load
                if m.short_of_floors:
                    short.add(name)
    return {"blocked": pooled, "walls": walls, "loads": loads, "short": short}, per_repeat


def latency_of(blocked: BlockedSamples, settings: BenchSettings) -> dict:
    flat = blocked.flat
    summary = summarize(flat, settings.batch_size, settings.min_samples)
    out = summary.as_dict()
    out["p50_ci"] = [round(v, 6) for v in bootstrap_ci(flat, 50.0)]
    out["p50_ci_blocks"] = [round(v, 6) for v in block_bootstrap_ci(blocked, 50.0)]
    out["p99_ci_blocks"] = [round(v, 6) for v in block_bootstrap_ci(blocked, 99.0)]
    out["blocks"] = len(blocked.blocks)
    return out


def paired_ratios(a: BlockedSamples, b: BlockedSamples) -> dict[str, Ratio]:
    """``a``'s p50 and p99 over ``b``'s, round-paired (below 1: ``a`` is faster)."""
    return {key: paired_ratio(a, b, PERCENTILES[key]) for key in ("p50", "p99")}


def speed_figures(name: str, baseline: str, blocked: dict[str, BlockedSamples], wall_s: float, requests: int,
                  batch_size: int) -> dict:
    """The report keys of an artifact's speed besides its service time (``latency_ms``):

    - ``throughput``: items per measured wall-clock second;
    - ``latency_ratio``: its p50 and p99 over the baseline's, with round-paired (expanded percentile) intervals;
    - ``speedup_p99``: the baseline's p99 over its own, i.e. 1 / ``latency_ratio.p99.ratio`` from the same
      rounds, and ``speedup_p99_ci`` that ratio's interval inverted (a speed-up's low end is the ratio's high).
    """
    out = {"throughput": round(batch_size * requests / wall_s, 2)}
    if name == baseline:
        return {**out, "speedup_p99": 1.0, "speedup_p99_ci": [1.0, 1.0], "latency_ratio": None}
    ratios = paired_ratios(blocked[name], blocked[baseline])
    p99 = ratios["p99"]
    return {**out, "speedup_p99": round(1 / p99.ratio, 4),
            "speedup_p99_ci": [round(1 / p99.ci[1], 4), round(1 / p99.ci[0], 4)],
            "latency_ratio": {key: r.as_dict() for key, r in ratios.items()}}


def operator_profile(worker: BenchWorker, settings: BenchSettings) -> dict | None:
    """Where the time goes in one artifact, or why it was not profiled (a runtime without a profiler here)."""
    if settings.profile_iters <= 0:
        return None
    try:
        return worker.call("profile", settings.profile_iters, settings.threads)
    except WorkerError as exc:
        return {"error": str(exc).splitlines()[0]}
