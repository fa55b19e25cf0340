"""A timm network at 224 px (stand-in weights) through its model server against itself in process: the bench's own
served phase (serve_bench.latency.served) on one fp32 ONNX file, without a pipeline, to see what the server adds
for a network of the size users deploy.

    python pipelines/served_vs_in_process.py mobilenetv3_large_100 --qps 10     # about 6 minutes on 2 cores
    python pipelines/served_vs_in_process.py resnet50 --qps 3 --json runs/served-resnet50.json
    python pipelines/served_vs_in_process.py --file runs/quickstart/export/model.onnx --qps 20 --sweep

It exports the network, times it closed loop, then measures it at ``--qps`` Poisson arrivals in rounds that
alternate between Ray Serve on loopback (an HTTP client driven by MLPerf LoadGen) and the bench's in-process worker,
at the same arrivals. It prints both p99s, their ratio paired by round with its 99% interval, and where a served
query's time went. With ``--sweep`` it then sweeps the file's serving configurations (batch 1; batches of up to
8 within 2 ms) in process and through the server, one server per configuration, and prints the highest load
within the budget on each side. Pick a rate well under the file's closed-loop rate and under the server's own limit (about 115
requests a second for a tiny model on 2 cores).
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from serve_bench.latency.served import measure_served
from serve_bench.latency.served_sweep import sweep_served
from serve_bench.latency.sweep import sweep
from serve_bench.latency.traffic import TrafficSettings, sweep_plan
from serve_bench.latency.worker import BenchWorker
from serve_bench.load.rounds import RoundsRule
from serve_bench.load.serving_loop import ServingSettings
from serve_bench.servers.tensors import onnx_tensors

CONFIGS = [ServingSettings(threads=1), ServingSettings(max_batch=8, max_queue_delay_us=2000, threads=1)]


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
    parser.add_argument("network", nargs="?", help="a timm model name, e.g. mobilenetv3_large_100, efficientnet_b0, "
                                                   "resnet50 (or --file)")
    parser.add_argument("--file", help="an ONNX file to measure instead (one float input, batch first)")
    parser.add_argument("--sweep", action="store_true", help="then sweep the serving configurations in process "
                                                             "and through the server")
    parser.add_argument("--qps", type=float, default=10.0, help="Poisson arrivals per second (default 10)")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--budget-ms", type=float, default=200.0, help="the p99 budget the rounds judge by")
    parser.add_argument("--rounds", type=int, default=5, help="rounds at least (default 5)")
    parser.add_argument("--max-queries", type=int, default=1500, help="queries per side at most (default 1500)")
    parser.add_argument("--json", help="write the served record here")
    args = parser.parse_args()
    if bool(args.network) == bool(args.file):
        parser.error("name a timm network or give --file, one of the two")

    with tempfile.TemporaryDirectory(prefix="served-") as folder:
        path = Path(args.file) if args.file else export(args.network, Path(folder), args.size)
        name = path.name if args.file else args.network
        shape = [max(d, 1) for d in onnx_tensors(path)[0][0].shape[1:]]
        pool = np.random.default_rng(0).normal(size=(32, *shape)).astype(np.float32)
        scenario = {"scenario": "server", "target_qps": args.qps, "duration_s": 2.0, "min_queries": 200, "seed": 0,
                    "target_latency_ms": args.budget_ms, "warmup_s": 1.0, "min_tail_cycles": 20, "precision": 0.25,
                    "max_queries": args.max_queries, "expected_latency_ms": 1.0}
        rule = RoundsRule(min_rounds=args.rounds, max_queries=args.max_queries, budget_ms=args.budget_ms,
                          min_tail_cycles=20, precision=0.25)
        serving = {"max_batch": 1, "max_queue_delay_us": 0, "instances": 1, "threads": 1}
        with BenchWorker(name, "onnxruntime", str(path), {"threads": 1}, pool, 1) as worker:
            closed = worker.call("block", 50, 0, 1)[0] / 1e6
            p50 = float(np.percentile(closed, 50))
            print(f"{name}: closed loop p50 {p50:.2f} ms, p99 {np.percentile(closed, 99):.2f} ms", flush=True)
            record = measure_served({name: worker}, {name: {"runtime": "onnxruntime", "path": str(path)}},
                                    scenario=scenario, rule=rule, budget_ms=args.budget_ms,
                                    serving={name: serving}, service_ms={name: p50}, pool=pool,
                                    round_s=2.0, settle_s=0.2, say=lambda line: print(line, flush=True))[name]
            if args.sweep and "run" in record:
                record["sweeps"] = sweeps(worker, name, path, pool, p50, record, args)
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
    for side, found in (record.get("sweeps") or {}).items():
        for config in found["configs"]:
            cap = config.get("capacity") or {}
            print(f"{side}: {config['label']}: highest load within {args.budget_ms:g} ms: "
                  f"{cap.get('qps') or 0:,.1f}/s {cap.get('ci')}, confirmed {cap.get('confirmed')}"
                  + (f" ({config['failed']})" if config.get("failed") else ""))
    print(f"mean ms: server queue {split['queue_mean_ms']}, model {split['compute_mean_ms']}, the rest "
          f"{split['rest_mean_ms']}, client {split['client_mean_ms']}; refused {split['refused']}; "
          f"{run['sustainable_reason']}")


def sweeps(worker: BenchWorker, name: str, path: Path, pool: np.ndarray, p50: float, record: dict, args) -> dict:
    """The bench's serving sweep of the file in process (its worker), then through the server on the server's own
    batcher (one server per configuration), with the same configurations, rates and rules."""
    settings = TrafficSettings(sweep=True, configs=CONFIGS, refine=1, sweep_max_queries=args.max_queries,
                               max_queries=args.max_queries, duration_s=2.0, warmup_s=1.0)  # confirmations too
    say = lambda line: print(line, flush=True)  # noqa: E731
    inside = sweep(lambda _n, *command, tests=1: worker.call(*command), [name], CONFIGS,
                   **sweep_plan(settings, args.budget_ms, "point", say, {name: p50}))[name]
    through = max(p50, record["run"]["latency_ms"]["p50"])  # the offline test sized by a served request's time
    served = sweep_served({name: {"runtime": "onnxruntime", "path": str(path)}}, CONFIGS,
                          budget_ms=args.budget_ms, service_ms={name: p50},
                          pool=pool, settle_s=0.2, say=say,
                          plan=sweep_plan(settings, args.budget_ms, "point", say, {name: through}))[name]
    return {"in process": inside, "served": served}


if __name__ == "__main__":
    main()
