"""The serving sweep run through the model server (serve_bench.latency.sweep on a server's own batcher): one
server per serving configuration, since a server's batcher and copies are fixed when it starts, each with the queue
limit a release of it would ship with, so the highest load within the budget is the load that server sustains."""
from __future__ import annotations

import time
from typing import Callable

import numpy as np

from serve_bench.errors import BenchError
from serve_bench.latency.served import CLIENTS, ServedWorker, served_name
from serve_bench.latency.sweep import summarized, sweep_config
from serve_bench.load.serving_loop import ServingSettings
from serve_bench.servers.deployment import ServedSettings, model_name, queue_limit
from serve_bench.servers.registry import DEFAULT_SERVER, make_server


def failed_probe(scenario: dict, serving: dict, exc: Exception) -> dict:
    """A server test that ended in an error (the server gone, the client's answer timed out), as a probe that
    failed: no latency, the reason kept; it never passes (serve_bench.load.capacity.passes)."""
    reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return {"scenario": "server", "offered_qps": scenario["target_qps"], "latency_ms": None, "errors": [reason],
            "sustainable": False, "sustainable_reason": f"the test failed: {reason}",
            "loadgen": {"valid": False, "target_latency_ms": scenario.get("target_latency_ms")}, "serving": serving}


def sweep_served(files: dict[str, dict], configs: list[ServingSettings], *, budget_ms: float | None,
                 service_ms: dict[str, float], pool: np.ndarray, settle_s: float, say: Callable[[str], None],
                 plan: dict, server: str = DEFAULT_SERVER) -> dict[str, dict]:
    """Per file in ``files`` its served sweep: the serving sweep (serve_bench.latency.sweep) run on the model
    server's own batcher and copies. A server's batching and copies are fixed when it starts, so each
    configuration of ``configs`` gets a server of its own, with the queue limit a release of it would ship with;
    its highest load within the budget is the load that server sustains (a probe the server refused queries in
    is not sustainable). Threads a configuration leaves open are resolved as the in-process worker resolves them
    (serve_bench.latency.worker.serving_threads), so each row compares with the same configuration in process.
    The client holds twice as many requests in flight as the server's copies batch at once (16 at least), so
    a configuration's ceiling is the server's, not the client's. ``plan`` holds the rest of
    :func:`~serve_bench.latency.sweep.sweep_config`'s keywords, its ``service_ms`` (sizing the offline test)
    keyed by the files' names. A probe whose server stops answering is a failed probe (its reason kept): the
    capacity then rests on the probes before it, and the grid stops after two. A configuration whose server
    cannot start, or whose offline test fails, is recorded with the reason and no capacity; the others stand."""
    from serve_bench.latency.worker import serving_threads

    plan = {**plan, "service_ms": {served_name(n): ms for n, ms in plan.get("service_ms", {}).items()}}
    out: dict[str, dict] = {}
    for name, file in files.items():
        records = []
        for config in configs:
            config = config.model_copy(update={"threads": config.threads or serving_threads()})
            settings = ServedSettings(**config.model_dump(), measured=f"the served sweep's {config.label()}")
            settings = settings.model_copy(update={"max_queue": queue_limit(
                budget_ms, service_ms.get(name), settings.max_batch, settings.instances)})
            say(f"{name}: served sweep on {server} [{settings.label()}, queue limit {settings.max_queue or 'none'}]")
            try:
                with make_server(file["path"], file["runtime"], settings, server=server, model=model_name(name),
                                 runner_options=file.get("options") or {}) as started:
                    clients = max(CLIENTS, 2 * config.max_batch * config.instances)
                    with ServedWorker(served_name(name), started.host, started.http_port, started.model, pool,
                                      clients=clients) as client:
                        def turns(_who: str, command: str, serving: dict, scenario: dict, tests: int = 1) -> dict:
                            time.sleep(settle_s)
                            try:
                                return client.call(command, serving, scenario)
                            except (BenchError, OSError, EOFError) as exc:
                                if scenario["scenario"] != "server":
                                    raise
                                return failed_probe(scenario, serving, exc)

                        record = sweep_config(turns, [served_name(name)], config, **plan)[served_name(name)]
                        record["limits"] = started.limits()
            except (BenchError, OSError, EOFError) as exc:
                reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                record = {"label": config.label(), "serving": config.model_dump(), "capacity": None,
                          "curve": [], "failed": reason}
                say(f"{name}: served sweep of {config.label()} stopped: {reason}")
            records.append({**record, "max_queue": settings.max_queue})
        out[name] = summarized(records)
    return out
