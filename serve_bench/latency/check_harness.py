"""Does the harness measure what a plain timing loop measures? A check of the measuring tool itself.

    python -m serve_bench.latency.check_harness MODEL.onnx [--rounds 20] [--block 200] [--threads N]

In one process, blocks of the harness's timed loop (through the onnxruntime runner) are
interleaved with blocks of the most minimal loop possible (``perf_counter_ns`` around a
bare ``session.run``), on the same inputs. Both loops drive the one session: a second
session's spinning worker threads would steal the cores and inflate both tails (a 2-core
machine showed p99 4.3 ms instead of 0.3 ms), which is why the benchmark itself gives every
artifact its own process. Reported: both p50/p99, their ratio, and the harness's per-call
overhead relative to the median.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from serve_bench.runners import OnnxRuntimeRunner
from serve_bench.stats.summary import percentile
from serve_bench.latency.worker import batches_of, timed_block


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("onnx")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--block", type=int, default=200)
    parser.add_argument("--threads", type=int)
    args = parser.parse_args(argv)

    runner = OnnxRuntimeRunner(args.onnx, threads=args.threads).load()
    session = runner.session
    first = session.get_inputs()[0]
    shape = [1 if not isinstance(d, int) else d for d in first.shape]
    pool = np.random.default_rng(0).standard_normal((64, *shape[1:])).astype(np.float32)
    batches = batches_of(pool, 1)
    feeds = [{first.name: b} for b in batches]

    harness, minimal = [], []
    for _ in range(3):  # warm-up both paths
        timed_block(runner, batches, None, args.block, 0, 1)
        for feed in feeds:
            session.run(None, feed)
    for r in range(args.rounds):
        harness.append(timed_block(runner, batches, None, args.block, r * args.block, 1)[0])
        block = np.empty(args.block, dtype=np.int64)
        for i in range(args.block):
            feed = feeds[(r * args.block + i) % len(feeds)]
            t0 = time.perf_counter_ns()
            session.run(None, feed)
            block[i] = time.perf_counter_ns() - t0
        minimal.append(block)
    h, m = np.concatenate(harness) / 1e6, np.concatenate(minimal) / 1e6
    result = {
        "onnx": args.onnx, "threads": runner.threads, "requests_each": len(h),
        "harness": {"p50": percentile(h, 50), "p99": percentile(h, 99)},
        "minimal": {"p50": percentile(m, 50), "p99": percentile(m, 99)},
    }
    result["p50_ratio"] = result["harness"]["p50"] / result["minimal"]["p50"]
    result["p99_ratio"] = result["harness"]["p99"] / result["minimal"]["p99"]
    result["overhead_pct_of_median"] = 100 * (result["harness"]["p50"] - result["minimal"]["p50"]) / result["minimal"]["p50"]
    print(f"harness p50 {result['harness']['p50']:.4f} ms p99 {result['harness']['p99']:.4f} ms | minimal loop p50 "
          f"{result['minimal']['p50']:.4f} ms p99 {result['minimal']['p99']:.4f} ms | ratios p50 "
          f"{result['p50_ratio']:.3f} p99 {result['p99_ratio']:.3f} | overhead {result['overhead_pct_of_median']:+.2f}% "
          f"of the median over {len(h)} requests each")
    print(json.dumps(result))
    runner.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
