"""The served scenario: a file measured through the model server it ships on, beside itself in process.

Per file, one at a time: its server is started with the serving settings the bench measured (the at-target
configuration, a queue limit from the budget), then LoadGen's server scenario drives a client process that sends
each query over HTTP at its scheduled time, in rounds alternating with the same file's in-process worker at the
same rate and arrivals (serve_bench.latency.traffic_rounds). Both take the same rounds, steady-state p99, interval
and drift test; their ratio is paired round by round, so what the server adds comes with its own interval. The
server's own statistics (its queue and model time) are read around every served test, so the report splits the
client's latency into the server's queue, its model and the rest (HTTP, the proxy, the hop between processes).

Only one server runs at a time: a Ray Serve instance holds about 1.4 GB and a dozen processes, and the other
files' closed-loop and traffic figures are measured before any server starts. A server that dies or stops
answering ends that file's served measurement with the reason, within the client's timeout; what was measured
before stays.
"""
from __future__ import annotations

import logging
import os
import threading
import time
import traceback
from contextlib import ExitStack
from pathlib import Path
from typing import Callable

import numpy as np

from serve_bench.latency.traffic_rounds import measure_in_rounds, pair_runs
from serve_bench.errors import BenchError
from serve_bench.latency.machine_load import LoadSampler, load_summary
from serve_bench.latency.worker import BenchWorker
from serve_bench.load.capacity import within_budget
from serve_bench.load.rounds import RoundsRule
from serve_bench.servers.base import ServedModel, ServerError, ServerStatistics
from serve_bench.servers.deployment import ServedSettings, model_name, queue_limit
from serve_bench.servers.http_client import HttpClient, Refused
from serve_bench.servers.registry import DEFAULT_SERVER, make_server

log = logging.getLogger(__name__)

SERVED = "@served"  # a served file's name in the rounds: the file's own name and this
CLIENTS = 16  # client threads, each one request in flight: more than the server's batcher and copies take at once
CLIENT_TIMEOUT_S = 10.0  # a request the server has not answered by then fails the test: a hung server, not a slow one


def served_worker_main(conn, host: str, port: int, model: str, pool: np.ndarray, clients: int,
                       timeout_s: float) -> None:
    """The client side of the served scenario, in its own process as a file's worker is: LoadGen's server scenario
    hands each query to one of ``clients`` threads, which sends it over HTTP (raw bytes, one keep-alive connection
    per thread) and completes it when the answer is back. The first failure other than a refusal marks the server
    gone, and every query after it fails at once instead of waiting out its timeout."""
    from serve_bench.load.loadgen_scenarios import ScenarioSettings, one_turn, warm_up
    from serve_bench.load.serving_loop import ServingLoop, ServingSettings
    from serve_bench.servers.http_client import get_json

    client = HttpClient(host, port, model, timeout_s=timeout_s)
    gone: list[str] = []
    refused = [0]
    lock = threading.Lock()

    def forward(batch: np.ndarray) -> None:
        if gone:
            raise ServerError(f"the server is gone: {gone[0]}")
        try:
            client.infer(batch[0])
        except Refused:
            with lock:
                refused[0] += 1
        except ServerError as exc:
            gone.append(str(exc))
            raise

    def statistics() -> ServerStatistics:
        totals = get_json(f"http://{host}:{port}/{model}/stats", timeout_s)
        return ServerStatistics(**{k: int(totals[k]) for k in ("success", "failed", "queue_ns", "compute_ns",
                                                                "batches")})

    def settled(before: ServerStatistics, answered: int, tries: int = 20) -> ServerStatistics:
        """The server's count since ``before``, read again (50 ms apart, a second at most) until it holds the
        ``answered`` requests: the replica records each batch with a message that may land after its answer."""
        counted = statistics().since(before)
        for _ in range(tries):
            if counted.success + counted.failed >= answered:
                break
            time.sleep(0.05)
            counted = statistics().since(before)
        return counted

    try:
        client.metadata()
        conn.send(("ready", {"served_at": f"http://{host}:{port}/{model}", "clients": clients}))
    except Exception as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    while True:
        command, *args = conn.recv()
        try:
            if command == "turn":
                _, scenarios = args  # the server's own settings serve: the in-process ones do not apply
                loop = ServingLoop([forward] * clients, pool, ServingSettings(max_batch=1, instances=clients),
                                   done=lambda tags: None)
                tests = [ScenarioSettings(**s) for s in scenarios]
                if tests and tests[0].warmup_s > 0:  # warmed apart, so the server's count is the tests' alone
                    warm_up(loop, len(pool), tests[0])
                before, refused[0] = statistics(), 0
                answer = one_turn(loop, len(pool), [t.model_copy(update={"warmup_s": 0.0}) for t in tests])
                if gone:
                    raise ServerError(f"the server stopped answering mid-test: {gone[0]}")
                issued = sum(len(t.latencies_ms) for t in answer["tests"])
                answer["server"] = {**settled(before, issued - refused[0]).__dict__, "refused": refused[0]}
                conn.send(("ok", answer))
            elif command == "serve":  # one test of the served sweep: LoadGen's own loop, refusals counted
                from serve_bench.load.loadgen_scenarios import run_scenario

                serving, scenario = args
                loop = ServingLoop([forward] * clients, pool, ServingSettings(max_batch=1, instances=clients),
                                   done=lambda tags: None)
                test = ScenarioSettings(**scenario)
                warmed = 0.0
                if test.scenario == "server" and test.warmup_s > 0:  # warmed apart: its refusals are not the test's
                    warmed = warm_up(loop, len(pool), test)
                refused[0] = 0
                result = run_scenario(loop, len(pool), test.model_copy(update={"warmup_s": 0.0}))
                if gone:
                    raise ServerError(f"the server stopped answering mid-test: {gone[0]}")
                if "steady_state" in result:  # the warm-up that ran, apart: the record says so, not 0
                    result["steady_state"]["warmup_s"] = warmed
                conn.send(("ok", refusals_counted({**result, "serving": serving}, refused[0])))
            elif command == "close":
                client.close()
                conn.send(("ok", None))
                return
            else:
                conn.send(("error", f"unknown command {command!r}"))
        except Exception as exc:
            conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=2)}"))


def refusals_counted(result: dict, refused: int) -> dict:
    """One served test's result with the server's refusals (HTTP 503 past its queue limit) counted against it:
    LoadGen took each refusal as a quick answer, so a server test that had any is not sustainable (its p99 is of
    the answered queries and too low), and an offline test's throughput counts the answered queries only."""
    if not refused:
        return result
    result = {**result, "refused": refused}
    queries = result.get("queries") or 0
    if result.get("scenario") == "offline":
        issued = max(queries, refused)
        if result.get("completed_qps") and issued:
            result["completed_qps"] = result["completed_qps"] * (issued - refused) / issued
        return result
    result["sustainable"] = False
    result["sustainable_reason"] = (f"the server refused {refused} of {queries or 'its'} queries (HTTP 503: its "
                                    "queue limit): a refused query is a failed one, and LoadGen counted each as a "
                                    "quick answer")
    return result


class ServedWorker(BenchWorker):
    """Parent-side handle of the served scenario's client process: the same calls as a file's worker."""

    def __init__(self, name: str, host: str, port: int, model: str, pool: np.ndarray, clients: int = CLIENTS,
                 timeout_s: float = CLIENT_TIMEOUT_S, answer_timeout_s: float = 600.0) -> None:
        self._spawn(name, answer_timeout_s, served_worker_main, (host, port, model, pool, clients, timeout_s))
        self.ready()


def served_name(name: str) -> str:
    return name + SERVED


def served_server_settings(serving: dict, budget_ms: float | None, service_ms: float | None) -> ServedSettings:
    """The settings a file is served with in the bench: the at-target test's configuration (its threads as the
    worker resolved them) and the queue limit a release would ship with."""
    values = {k: serving[k] for k in ("max_batch", "max_queue_delay_us", "instances", "threads") if k in serving}
    settings = ServedSettings(**values, measured="the configuration of the test at the pipeline's traffic")
    return settings.model_copy(update={"max_queue": queue_limit(budget_ms, service_ms, settings.max_batch,
                                                                settings.instances)})


def server_split(tests_stats: list[dict], client_ms: np.ndarray, client_wait_ms: float | None) -> dict:
    """Where a served query's time went, per request in ms, over the same queries on both sides (every query of
    the tests pooled, not only the complete busy periods the p99 rests on): the server's queue (from the request
    reaching its replica to its batch's start) and model, by its own statistics; the client's mean (LoadGen's
    latencies ``client_ms``) and its wait for a free client thread; and the rest (Ray's router queue, HTTP, the
    proxy, the hops between processes). Also how many queries the server refused past its queue limit."""
    totals = {k: sum(s[k] for s in tests_stats) for k in ("success", "failed", "queue_ns", "compute_ns", "batches",
                                                          "refused")}
    stats = ServerStatistics(*(totals[k] for k in ("success", "failed", "queue_ns", "compute_ns", "batches")))
    split = stats.per_request_ms()
    client_mean = round(float(client_ms.mean()), 6) if len(client_ms) else None
    known = [split["queue_mean_ms"], split["compute_mean_ms"], client_mean]
    rest = (None if None in known else
            round(client_mean - split["queue_mean_ms"] - split["compute_mean_ms"] - (client_wait_ms or 0.0), 6))
    return {**totals, **split, "client_mean_ms": client_mean, "rest_mean_ms": rest,
            "mean_batch": round(totals["success"] / totals["batches"], 4) if totals["batches"] else None,
            "refused_share": round(totals["refused"] / max(1, len(client_ms)), 6)}


def served_groups(names: list[str], pairs: dict[str, dict[str, str]]) -> list[list[str]]:
    """The files served and measured together, in ``names``' order: each fp32 file with the INT8 files paired with
    it (``pairs[int8]["fp32"]``, both served), so the INT8 file's served p99 over its fp32 file's comes paired
    round by round, as in process; every other file alone. A group's first is its fp32 file."""
    fp32_of = {n: roles["fp32"] for n, roles in pairs.items()
               if n in names and (roles or {}).get("fp32") in names and roles["fp32"] != n}
    chained = sorted(set(fp32_of) & set(fp32_of.values()))
    if chained:  # an fp32 file is never itself paired with another: traffic_pairs pairs INT8 files only
        raise ValueError(f"{', '.join(chained)}: both paired with an fp32 file and the fp32 file of another")
    groups: dict[str, list[str]] = {}
    for name in names:
        head = fp32_of.get(name, name)
        groups.setdefault(head, [head])
        if name != head:
            groups[head].append(name)
    return list(groups.values())


def route_names(group: list[str]) -> dict[str, str]:
    """Each file's name on its server (serve_bench.servers.deployment.model_name), made unique within the group:
    two files whose names differ only in characters a route cannot hold get a number."""
    out: dict[str, str] = {}
    for name in group:
        base = model_name(name)
        route, k = base, 1
        while route in out.values():
            k += 1
            route = f"{base}-{k}"
        out[name] = route
    return out


def measure_served(workers: dict[str, BenchWorker], files: dict[str, dict], *, scenario: dict, rule: RoundsRule,
                   budget_ms: float | None, serving: dict[str, dict], service_ms: dict[str, float],
                   pool: np.ndarray, round_s: float, settle_s: float, say: Callable[[str], None],
                   server: str = DEFAULT_SERVER, pairs: dict[str, dict[str, str]] | None = None) -> dict[str, dict]:
    """Per file in ``files`` (name → runtime, path, runner options) its ``served`` record: the served run and the
    in-process run of the same rounds at ``scenario``'s rate (a server test as ``ScenarioSettings`` fields), their
    paired p99 ratio, the server's split and the machine's load; or ``failed`` with the reason where its server
    could not start or stopped answering. ``serving[name]`` is the at-target configuration the file's worker
    resolved: the server is started with it, and the in-process turns use it too. An INT8 file and its fp32 file
    (``pairs``: serve_bench.bench.references.traffic_pairs) share one server and the same rounds, so the served
    run's ``paired.fp32`` is the INT8 file's served p99 over its fp32 file's, round by round, for the gate. Where
    such a group fails, each of its files is measured again on a server of its own, so one file's fault does not
    cost the other its figure (the INT8 file is then not paired, and the gate says so)."""
    out: dict[str, dict] = {}
    # every worker's time is the bench's own, as in the in-process rounds (serve_bench.latency.traffic._Turns)
    own = [os.getpid(), *(w.process.pid for w in workers.values())]
    for group in served_groups(list(files), pairs or {}):
        found = _served_group(group, workers, files, scenario=scenario, rule=rule, budget_ms=budget_ms,
                              serving=serving, service_ms=service_ms, pool=pool, round_s=round_s,
                              settle_s=settle_s, say=say, server=server, own=own)
        if len(group) > 1 and any("failed" in r for r in found.values()):
            say(f"{', '.join(group)}: served together, stopped; each is served again on its own")
            together = next(r["failed"] for r in found.values() if "failed" in r)
            for name in group:
                found[name] = {**_served_group([name], workers, files, scenario=scenario, rule=rule,
                                               budget_ms=budget_ms, serving=serving, service_ms=service_ms,
                                               pool=pool, round_s=round_s, settle_s=settle_s, say=say,
                                               server=server, own=own)[name],
                               "served_together_failed": together}
        out.update(found)
    return out


def _served_group(group: list[str], workers: dict[str, BenchWorker], files: dict[str, dict], *, scenario: dict,
                  rule: RoundsRule, budget_ms: float | None, serving: dict[str, dict], service_ms: dict[str, float],
                  pool: np.ndarray, round_s: float, settle_s: float, say: Callable[[str], None], server: str,
                  own: list[int]) -> dict[str, dict]:
    """The served records of one group of files, served by one server in the same rounds."""
    settings = {n: served_server_settings(serving[n], budget_ms, service_ms.get(n)) for n in group}
    routes = route_names(group)
    out: dict[str, dict] = {}
    for name in group:
        beside = [n for n in group if n != name]
        out[name] = {"server": server, "settings": settings[name].model_dump(mode="json"),
                     **({"served_with": beside} if beside else {})}
        say(f"{name}: served on {server} [{settings[name].label()}, queue limit {settings[name].max_queue or 'none'}]"
            + (f", beside {', '.join(beside)}" if beside else ""))
    first, *rest = group
    also = tuple(ServedModel(Path(files[n]["path"]), files[n]["runtime"], settings[n], routes[n],
                             files[n].get("options") or {}) for n in rest)
    try:
        with make_server(files[first]["path"], files[first]["runtime"], settings[first], server=server,
                         model=routes[first], runner_options=files[first].get("options") or {},
                         also=also) as started, ExitStack() as stack:
            clients = {n: stack.enter_context(ServedWorker(served_name(n), started.host, started.http_port,
                                                           routes[n], pool)) for n in group}
            sampler = LoadSampler([*own, *(c.process.pid for c in clients.values())], trees=started.processes())
            for name in group:
                out[name]["limits"] = started.limits(routes[name])
            found = _served_rounds({n: workers[n] for n in group}, clients, serving, scenario, rule, round_s,
                                   budget_ms, settle_s, say, sampler, fp32_of={n: first for n in rest})
        for name in group:
            out[name].update(found[name])
    except (BenchError, OSError, EOFError) as exc:  # this group's served records end; every other figure stays
        dead = [n for n in group if not workers[n].process.is_alive()]
        side = (f"{', '.join(dead)} in process" if dead else "the server or its client")
        reason = f"{side}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        for name in group:
            out[name]["failed"] = reason
        say(f"{', '.join(group)}: served measurement stopped: {reason}")
    return out


def _served_rounds(workers: dict[str, BenchWorker], clients: dict[str, ServedWorker], serving: dict[str, dict],
                   scenario: dict, rule: RoundsRule, round_s: float, budget_ms: float | None, settle_s: float,
                   say: Callable[[str], None], sampler: LoadSampler, fp32_of: dict[str, str]) -> dict[str, dict]:
    """The rounds of one group: every file in process and through its server, all four (or more) stopping
    together, so each ratio rests on the same rounds as the p99s beside it."""
    names = list(workers)
    who_is = {**{n: (workers[n], n) for n in names}, **{served_name(n): (clients[n], n) for n in names}}
    stats: dict[str, list[dict]] = {n: [] for n in names}
    loads: list[float | None] = []

    def turn(who: str, asked: list[dict]) -> list:
        time.sleep(settle_s)  # the other process's threads go quiet first, as between any two files' turns
        process, name = who_is[who]
        before = sampler.snapshot()
        answer = process.call("turn", serving[name], asked)
        loads.append(sampler.other_share(before))
        if process is clients[name]:
            stats[name].append(answer["server"])
        return answer["tests"]

    participants = [who for n in names for who in (n, served_name(n))]
    measured = measure_in_rounds(turn, participants, [scenario], rule, together={p: names[0] for p in participants},
                                 say=say, round_s=round_s)
    pairs = {served_name(n): {"in_process": n} for n in names}
    for name, reference in fp32_of.items():
        pairs[served_name(name)]["fp32"] = served_name(reference)
    pair_runs(measured, pairs)
    out = {}
    for name in names:
        run, tests = measured[(served_name(name), 0)]
        in_process, _ = measured[(name, 0)]
        fp32 = (run.get("paired") or {}).get("fp32")
        if fp32 is not None:  # the gate asks for the fp32 file by its own name: both ran through this server
            fp32.update(reference=fp32_of[name], through="served")
        # the client's own loop: its wait for a free client thread and each request's round trip, not a queue
        client_wait, round_trip = run.pop("queue_ms", None), run.pop("compute_ms", None)
        split = server_split(stats[name], np.concatenate([t.latencies_ms for t in tests]),
                             (client_wait or {}).get("mean"))
        split["client_wait_ms"], split["round_trip_ms"] = client_wait, round_trip
        run.pop("service_ms", None)
        run["mean_batch"], run["serving"], in_process["serving"] = split["mean_batch"], serving[name], serving[name]
        if split["refused"]:  # LoadGen counted each refusal as a quick answer: the p99 of what it counted is low
            run["sustainable"] = False
            queries = sum(len(t.latencies_ms) for t in tests)
            run["sustainable_reason"] = (f"the server refused {split['refused']} of {queries} queries (HTTP 503: "
                                         "its queue limit, or a replica not ready): a refused query is a failed "
                                         "one, and LoadGen counted each as a quick answer, so the p99 it gives is "
                                         "too low")
        for r in (run, in_process):
            r["within_budget"] = within_budget(r, budget_ms)
        out[name] = {"run": run, "in_process": in_process, "split": split, "machine_load": load_summary(loads)}
    return out
