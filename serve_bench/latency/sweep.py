"""The serving sweep: per serving configuration, an offline run (the throughput ceiling), then server runs at
fractions of it, a bisection between the last rate within the budget and the first past it, and a confirmation
at the capacity, giving the latency–load curve and the highest load within the budget (serve_bench.load.capacity).

What runs each test is the caller's: a file's worker in process (every configuration in one worker, the loop
set up per test), or a client of the model server started with the configuration (a server's batcher and
copies are fixed when it starts, so the served sweep starts one server per configuration). The sweep only asks
``turns(name, "serve", serving, scenario)`` for one test's answer and makes the scenarios it asks for with
``scenario(kind, qps, expected_ms=..., probe=...)``.
"""
from __future__ import annotations

from typing import Callable

from serve_bench.load.capacity import best_config, capacity, confirmed, next_rates, within_budget
from serve_bench.load.serving_loop import ServingSettings

Progress = Callable[[str], None]
Turns = Callable[..., dict]
MakeScenario = Callable[..., dict]
CONFIRM_SEED = 1_000_003  # a confirmation run's own arrivals, not the probe's it checks


def run_words(name: str, run: dict) -> str:
    """One server or offline test in a line, for the progress output."""
    lat = run.get("latency_ms") or {}
    rate = f" at {run['offered_qps']:,.0f}/s" if run.get("offered_qps") else ""
    verdict = "valid" if run["loadgen"]["valid"] else "INVALID"
    extra = {True: "", False: ", not sustainable", None: ", sustainability unknown"}[run.get("sustainable", True)]
    return (f"{name}: {run['scenario']}{rate} [{ServingSettings(**run['serving']).label()}]: p50 "
            f"{lat.get('p50', float('nan')):.3f} ms, p99 {lat.get('p99', float('nan')):.3f} ms ({verdict}{extra})")


def server_test(turns: Turns, name: str, serving: dict, scenario: dict, budget_ms: float | None,
                progress: Progress) -> dict:
    """One server-scenario test, judged against the budget and said."""
    run = turns(name, "serve", serving, scenario)
    run["within_budget"] = within_budget(run, budget_ms)
    progress(run_words(name, run))
    return run


def offline_guess(config: ServingSettings, service_ms: float) -> float:
    """The throughput LoadGen sizes an offline test by (its sample count is this × the duration): one model
    copy's closed-loop rate, more for batches and instances, so the test lasts about ``duration_s``."""
    return 1000.0 / max(service_ms, 0.01) * max(1.0, config.max_batch / 2) * config.instances


def sweep_config(turns: Turns, names: list[str], config: ServingSettings, *, rates: list[float], refine: int,
                 confirm: bool, scenario: MakeScenario, budget_ms: float | None, decision: str, progress: Progress,
                 service_ms: dict[str, float]) -> dict[str, dict]:
    """Per file, one configuration's record: its offline run, its curve of probes and its capacity (confirmed by
    a full-length run where ``confirm``). The files take turns at each rate."""
    serving = config.model_dump()
    offline = {n: turns(n, "serve", serving, scenario("offline", offline_guess(config, service_ms.get(n, 1.0)),
                                                      probe=True))
               for n in names}
    curves: dict[str, list[dict]] = {n: [] for n in names}
    failed_in_a_row = {n: 0 for n in names}
    for fraction in rates:
        for name in names:
            ceiling = offline[name]["completed_qps"] or 0.0
            if ceiling <= 0 or failed_in_a_row[name] >= 2:  # two rates past the budget: higher ones only fail
                continue
            run = server_test(turns, name, serving, scenario("server", ceiling * fraction, probe=True), budget_ms,
                              progress)
            failed_in_a_row[name] = 0 if run["within_budget"]["point"] else failed_in_a_row[name] + 1
            curves[name].append(run)
    for _ in range(refine):
        for name in names:
            for qps in next_rates(curves[name], budget_ms, 1, decision):
                curves[name].append(server_test(turns, name, serving, scenario("server", qps, probe=True), budget_ms,
                                                progress))
    out = {}
    for name in names:
        curve = sorted(curves[name], key=lambda r: r["offered_qps"])
        resolved = offline[name]["serving"]  # threads filled in by whoever ran it
        found = capacity(curve, budget_ms, decision)
        if confirm and found["qps"]:
            check = scenario("server", found["qps"])
            run = server_test(turns, name, serving, {**check, "seed": check["seed"] + CONFIRM_SEED}, budget_ms,
                              progress)
            found = confirmed(found, run, curve, decision)
        out[name] = {"label": ServingSettings(**resolved).label(), "serving": resolved, "offline": offline[name],
                     "curve": curve, "capacity": found}
    return out


def summarized(configs: list[dict]) -> dict:
    """A file's sweep record from its configurations' records: the best one and the batching gain."""
    best = best_config([c for c in configs if c.get("capacity")])  # a configuration whose server failed has none
    return {"configs": configs, "best": None if best is None else {k: best[k] for k in ("label", "serving",
                                                                                       "capacity")},
            "batching_gain": batching_gain(configs)}


def sweep(turns: Turns, names: list[str], configs: list[ServingSettings], **kwargs) -> dict[str, dict]:
    """Every file's sweep over ``configs`` (``kwargs`` as :func:`sweep_config`'s), one configuration at a time."""
    out: dict[str, list[dict]] = {name: [] for name in names}
    for config in configs:
        for name, record in sweep_config(turns, names, config, **kwargs).items():
            out[name].append(record)
    return {name: summarized(records) for name, records in out.items()}


def batching_gain(configs: list[dict]) -> dict | None:
    """The best batching configuration's capacity over the batch-1 one-instance configuration's, from the same
    sweep; its interval pairs the ends of the two capacities' intervals (lowest over highest and back)."""
    measured = [c for c in configs if c.get("capacity")]
    plain = next((c for c in measured if c["serving"]["max_batch"] == 1 and c["serving"]["instances"] == 1), None)
    batched = [c for c in measured if c["serving"]["max_batch"] > 1 and c["capacity"]["qps"]]
    if plain is None or not plain["capacity"]["qps"] or not batched:
        return None
    best = max(batched, key=lambda c: c["capacity"]["qps"])
    (b_lo, b_hi), (p_lo, p_hi) = best["capacity"]["ci"], plain["capacity"]["ci"]
    return {"ratio": round(best["capacity"]["qps"] / plain["capacity"]["qps"], 4),
            "ci": [round(b_lo / p_hi, 4) if b_lo and p_hi else None, round(b_hi / p_lo, 4) if b_hi and p_lo else None],
            "over": plain["label"], "config": best["label"]}
