"""An independent check of the p99 the gate read under traffic: the released file under MLPerf LoadGen's server
scenario at the pipeline's rate, served by the plainest server there is (one thread, first come first served, the
runtime called once per query), none of the bench's serving loop, rounds or estimator. LoadGen's own p99 of one
long test is set beside the report's at-target p99 and its interval.

    python pipelines/loadgen_cross_check.py runs/resnet18                  # about a minute at 300/s
    python pipelines/loadgen_cross_check.py runs/resnet18 --artifact export.onnx --queries 40000

Run it on a quiet machine after the bench, as the bench ran (the same threads per copy: the cores but one).
LoadGen counts every query, the bench only those of complete busy periods; over a long test at a stable rate
the two agree to well within the bench's interval.
"""
from __future__ import annotations

import argparse
import json
import queue
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import yaml


def serve(runner, pool: np.ndarray, qps: float, queries: int, budget_ms: float, seed: int) -> dict:
    """One LoadGen server test of ``runner`` at ``qps`` with at least ``queries`` queries: LoadGen's figures."""
    import mlperf_loadgen as lg

    waiting: queue.Queue = queue.Queue()

    def work() -> None:
        while (item := waiting.get()) is not None:
            for sample in item:
                runner.infer(pool[sample.index % len(pool)][None])
                lg.QuerySamplesComplete([lg.QuerySampleResponse(sample.id, 0, 0)])

    server = threading.Thread(target=work, daemon=True)
    server.start()
    settings = lg.TestSettings()
    settings.scenario, settings.mode = lg.TestScenario.Server, lg.TestMode.PerformanceOnly
    settings.server_target_qps = qps
    settings.server_target_latency_ns = int(budget_ms * 1e6)
    settings.server_target_latency_percentile = 0.99
    settings.min_query_count, settings.min_duration_ms = queries, 10_000
    settings.qsl_rng_seed = settings.sample_index_rng_seed = settings.schedule_rng_seed = seed
    logs = lg.LogSettings()
    with tempfile.TemporaryDirectory(prefix="cross-check-") as folder:
        logs.log_output.outdir, logs.log_output.copy_summary_to_stdout = folder, False
        sut = lg.ConstructSUT(waiting.put, lambda: None)
        qsl = lg.ConstructQSL(len(pool), len(pool), lambda indices: None, lambda indices: None)
        started = time.perf_counter()
        lg.StartTestWithLogSettings(sut, qsl, settings, logs)
        wall = time.perf_counter() - started
        waiting.put(None)
        lg.DestroyQSL(qsl)
        lg.DestroySUT(sut)
        detail = {}
        for line in (Path(folder) / "mlperf_log_detail.txt").read_text().splitlines():
            if line.startswith(":::MLLOG "):
                record = json.loads(line[len(":::MLLOG "):])
                detail[record["key"]] = record["value"]
    return {"p50_ms": detail["result_50.00_percentile_latency_ns"] / 1e6,
            "p99_ms": detail["result_99.00_percentile_latency_ns"] / 1e6,
            "queries": int(detail.get("result_query_count") or queries), "valid": detail.get("result_validity"),
            "completed_qps": detail.get("result_completed_samples_per_sec"), "wall_s": round(wall, 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--artifact", help="the report entry to check (default: the gate's release)")
    parser.add_argument("--queries", type=int, default=30000, help="LoadGen's minimum query count")
    parser.add_argument("--seed", type=int, default=424242, help="LoadGen's schedule seed (not one the bench drew)")
    args = parser.parse_args(argv)

    from serve_bench.latency.worker import serving_threads
    from serve_bench.runners import make_runner

    report = json.loads((args.run_dir / "bench" / "report" / "report.json").read_text())
    name, entry, path = checked_file(args.run_dir, report, args.artifact)
    run = entry["traffic"]["at_target"]
    serving = run.get("serving") or {}
    data = yaml.safe_load((args.run_dir / "pipeline.resolved.yaml").read_text())["data"]
    size, channels = data["image_size"], data.get("channels", 3)
    pool = np.random.default_rng(0).standard_normal((64, channels, size, size)).astype(np.float32)
    runner = make_runner(entry["runtime"], path, threads=serving.get("threads") or serving_threads()).load()
    for _ in range(200):  # warm: first calls at a new shape are slow
        runner.infer(pool[:1])
    budget = report["gate"]["limits"].get("p99_budget_ms") or 1000.0
    measured = serve(runner, pool, run["offered_qps"], args.queries, budget, args.seed)
    print(f"{name} ({entry['runtime']}) at {run['offered_qps']:g}/s")
    print(f"  the bench's at-target p99: {run['latency_ms']['p99']:.3f} ms, 99% interval {_interval(run)} "
          f"({run['queries']:,} queries in {run['steady_state'].get('rounds', 1)} rounds)")
    print(f"  LoadGen alone, one thread FIFO: p99 {measured['p99_ms']:.3f} ms, p50 {measured['p50_ms']:.3f} ms "
          f"({measured['queries']:,} queries, {measured['wall_s']} s, {measured['valid']}): "
          f"{_verdict(run.get('p99_ci'), measured['p99_ms'])}")


def checked_file(run_dir: Path, report: dict, artifact: str | None) -> tuple[str, dict, Path]:
    """The report entry to check (the gate's release unless named) and its file: the report keeps paths relative
    to the run directory, so the check runs from any folder. Refuses a file served batched or in several copies at
    the target rate: this check's one-thread server would measure another server."""
    name = artifact or report["gate"]["release"]
    entry = next((e for e in report["artifacts"] if e["name"] == name), None)
    if entry is None or not (entry.get("traffic") or {}).get("at_target"):
        raise SystemExit(f"{run_dir}: no entry {name!r} measured at the target rate in bench/report/report.json "
                         f"(entries: {', '.join(e['name'] for e in report['artifacts'])})")
    serving = entry["traffic"]["at_target"].get("serving") or {}
    if serving.get("max_batch", 1) != 1 or serving.get("instances", 1) != 1:
        raise SystemExit(f"{name} was served with {serving} at the target rate; this check serves one copy, batch 1, "
                         "first come first served, so it would measure another server")
    path = Path(entry["path"])
    return name, entry, path if path.is_absolute() else run_dir / path


def _interval(run: dict) -> str:
    ci = run.get("p99_ci")
    return "none (not steady state)" if ci is None else f"[{ci[0]:.3f}, {ci[1]:.3f}]"


def _verdict(ci: list[float] | None, p99: float) -> str:
    if ci is None:
        return "no interval to compare with"
    return "inside the interval" if ci[0] <= p99 <= ci[1] else "OUTSIDE the interval"


if __name__ == "__main__":
    main()
