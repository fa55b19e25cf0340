"""A timm network at 224 px (stand-in weights) through its model server against itself in process: the bench's own
served phase (serve_bench.latency.served) on one fp32 ONNX file, without a pipeline, to see what the server adds
for a network of the size users deploy.

    python pipelines/served_vs_in_process.py mobilenetv3_large_100 --qps 10     # about 6 minutes on 2 cores
    python pipelines/served_vs_in_process.py resnet50 --qps 3 --json runs/served-resnet50.json

It exports the network, times it closed loop, then measures it at ``--qps`` Poisson arrivals in rounds that
alternate between Ray Serve on loopback (an HTTP client driven by MLPerf LoadGen) and the bench's in-process worker,
at the same arrivals. It prints both p99s, their ratio paired by round with its 99% interval, and where a served
query's time went. Pick a rate well under the file's closed-loop rate and under the server's own limit (about 115
requests a second for a tiny model on 2 cores).
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from serve_bench.latency.served import measure_served
from serve_bench.latency.worker import BenchWorker
from serve_bench.load.rounds import RoundsRule


def export(name: str, folder: Path, size: int) -> Path:
    import timm
    import torch

    path = folder / f"{name}.onnx"
    model = timm.create_model(name, pretrained=False).eval()
    torch.onnx.export(model, torch.randn(1, 3, size, size), str(path), input_names=["image"],
                      output_names=["logits"], dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}},
                      opset_version=18, dynamo=False)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("network", help="a timm model name, e.g. mobilenetv3_large_100, efficientnet_b0, resnet50")
    parser.add_argument("--qps", type=float, default=10.0, help="Poisson arrivals per second (default 10)")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--budget-ms", type=float, default=200.0, help="the p99 budget the rounds judge by")
    parser.add_argument("--rounds", type=int, default=5, help="rounds at least (default 5)")
    parser.add_argument("--max-queries", type=int, default=1500, help="queries per side at most (default 1500)")
    parser.add_argument("--json", help="write the served record here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="served-") as folder:
        path = export(args.network, Path(folder), args.size)
        pool = np.random.default_rng(0).normal(size=(32, 3, args.size, args.size)).astype(np.float32)
        scenario = {"scenario": "server", "target_qps": args.qps, "duration_s": 2.0, "min_queries": 200, "seed": 0,
                    "target_latency_ms": args.budget_ms, "warmup_s": 1.0, "min_tail_cycles": 20, "precision": 0.25,
                    "max_queries": args.max_queries, "expected_latency_ms": 1.0}
        rule = RoundsRule(min_rounds=args.rounds, max_queries=args.max_queries, budget_ms=args.budget_ms,
                          min_tail_cycles=20, precision=0.25)
        serving = {"max_batch": 1, "max_queue_delay_us": 0, "instances": 1, "threads": 1}
        with BenchWorker(args.network, "onnxruntime", str(path), {"threads": 1}, pool, 1) as worker:
            closed = worker.call("block", 50, 0, 1)[0] / 1e6
            p50 = float(np.percentile(closed, 50))
            print(f"{args.network}: closed loop p50 {p50:.2f} ms, p99 {np.percentile(closed, 99):.2f} ms", flush=True)
            record = measure_served({args.network: worker}, {args.network: {"runtime": "onnxruntime", "path": str(path)}},
                                    scenario=scenario, rule=rule, budget_ms=args.budget_ms,
                                    serving={args.network: serving}, service_ms={args.network: p50}, pool=pool,
                                    round_s=2.0, settle_s=0.2, say=lambda line: print(line, flush=True))[args.network]
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1, default=str))
    if "run" not in record:
        print(f"not measured: {record.get('failed')}")
        return
    run, inside, split = record["run"], record["in_process"], record["split"]
    ratio = (run.get("paired") or {}).get("in_process")
    print(f"served p50 {run['latency_ms']['p50']:.2f} ms, p99 {run['latency_ms']['p99']:.2f} ms {run['p99_ci']}; "
          f"in process p50 {inside['latency_ms']['p50']:.2f} ms, p99 {inside['latency_ms']['p99']:.2f} ms "
          f"{inside['p99_ci']}")
    print("served / in process: " + (f"×{ratio['ratio']:.2f} {ratio['ci']} at 99%, {ratio['rounds']} rounds paired"
                                     if ratio else "not paired (too few queries in complete busy periods)"))
    print(f"mean ms: server queue {split['queue_mean_ms']}, model {split['compute_mean_ms']}, the rest "
          f"{split['rest_mean_ms']}, client {split['client_mean_ms']}; refused {split['refused']}; "
          f"{run['sustainable_reason']}")


if __name__ == "__main__":
    main()
