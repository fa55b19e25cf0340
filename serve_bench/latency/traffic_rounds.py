"""The at-target and ``loads`` tests of every file in rounds (serve_bench.load.rounds): each round gives every file
still measuring one turn, its rates' tests back to back after one warm-up, and a file's rate stops as soon as its
steady-state p99 is precise or decided against the budget. The report then holds, per file and rate, the pooled
run, the spread between its rounds, and its p99 over the baseline's and over its float file's at the same rate,
paired round by round."""
from __future__ import annotations

import logging
from typing import Callable

from serve_bench.load.loadgen_scenarios import OF_CYCLES, RETEST_SEED, LoadGenTest, ScenarioSettings, scenario_result
from serve_bench.load.steady_state import MIN_QUERIES
from serve_bench.load.rounds import RATIO_LEVEL, Measured, RoundsRule, in_rounds, paired_p99_ratio, round_size

log = logging.getLogger(__name__)

Key = tuple[str, int]  # (file, index of its rate: 0 the target, then the `loads` entries)
RATE_SEED = 7_919  # a file's tests at two rates of one round draw different arrivals


def measure_in_rounds(turn: Callable[[str, list[dict]], list[LoadGenTest]], names: list[str],
                      scenarios: list[dict], rule: RoundsRule, together: dict[str, str] | None = None,
                      say: Callable[[str], None] | None = None, round_s: float | None = None) -> dict[Key, tuple[dict, list[LoadGenTest]]]:
    """Per (file, rate index) its pooled run (``scenario_result``, plus why it stopped) and the tests it pooled.

    ``scenarios[i]`` is the server test at rate i as ``ScenarioSettings`` fields. A file's first round at a rate
    holds ``min_queries`` queries (LoadGen's verdict is that test's); later ones :func:`round_queries` (``round_s``
    seconds of them, 200 at least), grown toward ``min_queries`` where the file's busy periods are long
    (serve_bench.load.rounds.round_size), never past the cap, and alike for files paired at that rate. Each draws
    the seed ``seed + RETEST_SEED·r + RATE_SEED·i`` (the same
    arrivals for every file in round r, so pairs compare like with like), and only a turn's first test warms up.
    The files take their turns in an order rotated by one each round, so no file always follows the same one.
    Files paired with each other (``together`` maps each to its group's name: an INT8 file and its fp32 file)
    stop together at each rate (serve_bench.load.rounds: in_rounds's ``group``), so their ratio rests on the same
    rounds as the p99s beside it; every other file stops by itself (a fast file is not held for a slow baseline's
    cap). ``turn(file, scenarios)`` runs one file's tests of a round; ``say`` hears each stop; ``round_s`` None
    sizes every round by ``min_queries`` alone."""
    rule_of = rule if callable(rule) else (lambda key: rule)
    keys = [(name, i) for name in names for i in range(len(scenarios))]
    earlier: dict[Key, list] = {key: [] for key in keys}
    group_of = together or {}

    def group(key: Key) -> tuple[str, int]:
        return group_of.get(key[0], key[0]), key[1]

    def one_round(active: list[Key], index: int) -> dict[Key, LoadGenTest]:
        sizes: dict[tuple[str, int], tuple[int, int]] = {}  # per group: the largest grown size, the least room
        # left under the cap (files paired at a rate hold rounds of one size: like with like; none past its cap)
        for key in active:
            scenario = scenarios[key[1]]
            most = max(scenario["min_queries"], 2 * MIN_QUERIES)
            planned = round_queries(scenario["target_qps"], scenario["min_queries"],
                                    float("inf") if round_s is None else round_s)
            left = max(rule_of(key).max_queries - sum(len(lat) for _, lat in earlier[key]), 2 * MIN_QUERIES)
            grown, room = sizes.get(group(key), (0, left))
            sizes[group(key)] = (max(grown, round_size(planned, most, earlier[key])), min(room, left))
        out: dict[Key, LoadGenTest] = {}
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            mine = [i for n, i in active if n == name]
            if not mine:
                continue
            asked = [_round_test(scenarios[i], index, i, k == 0, min(sizes[group((name, i))]))
                     for k, i in enumerate(mine)]
            out.update(zip([(name, i) for i in mine], turn(name, asked)))
        for key, test in out.items():
            earlier[key].append(test.segment)
        return out

    def told(key: Key, m: Measured) -> None:
        if say is not None:  # the complete busy periods' p99, where the record gives it (not every query's)
            point = None if m.estimate.leaves_out_too_much else m.estimate.point
            say(f"{key[0]} at {scenarios[key[1]]['target_qps']:g}/s: {m.stopped} after {len(m.tests)} rounds"
                + (f", p99 {point:.3f} ms" if point is not None else ""))

    measured = in_rounds(keys, one_round, lambda test: test.segment, rule, group=group, said=told)
    out = {}
    for key, m in measured.items():
        run = scenario_result(ScenarioSettings(**scenarios[key[1]]), m.tests, m.estimate, rounds=True)
        run["steady_state"]["stopped"] = m.stopped
        out[key] = (run, m.tests)
    return out


def round_queries(qps: float, min_queries: int, round_s: float) -> int:
    """How many queries one round's test holds at ``qps``: ``round_s`` seconds of them, between ``2·MIN_QUERIES``
    (a verdict on the queue and a round that counts toward the interval) and ``min_queries``.

    Why seconds at slow rates: a machine that drifts between rounds adds the rounds' variance to the interval
    divided by their number, so for the same measuring time more, shorter rounds give a narrower interval (and a
    smaller widening for few degrees of freedom). At 100/s a round of 1,000 queries lasted 10 s and files needed
    11-20 of them; at fast rates ``min_queries`` bounds the round so the cap still holds about 20 of them."""
    most = max(min_queries, 2 * MIN_QUERIES)
    return most if qps * round_s >= most else max(round(qps * round_s), 2 * MIN_QUERIES)


def _round_test(scenario: dict, index: int, rate: int, first: bool, queries: int) -> dict:
    qps = scenario["target_qps"]
    return {**scenario, "seed": scenario["seed"] + RETEST_SEED * index + RATE_SEED * rate, "min_queries": queries,
            "duration_s": min(scenario["duration_s"], queries / qps),
            "warmup_s": scenario["warmup_s"] if first else 0.0}


def groups_of(pairs: dict[str, dict[str, str]]) -> dict[str, str]:
    """Each paired file's group (its reference's name) for :func:`measure_in_rounds`."""
    return {name: reference for file, roles in pairs.items() for reference in roles.values()
            for name in (file, reference)}


def pair_runs(measured: dict[Key, tuple[dict, list[LoadGenTest]]], pairs: dict[str, dict[str, str]]) -> None:
    """Add to each run its p99 over each reference's at the same rate, paired round by round (``paired``):
    ``pairs[file]`` names the reference of each role ("fp32")."""
    for (name, i), (run, tests) in measured.items():
        for role, reference in (pairs.get(name) or {}).items():
            other = measured.get((reference, i))
            if other is None or reference == name or not (_of_cycles(run) and _of_cycles(other[0])):
                continue  # a record of every query has no busy periods' figure to pair
            ratio = paired_p99_ratio([t.segment for t in tests], [t.segment for t in other[1]])
            if ratio is not None:
                run.setdefault("paired", {})[role] = {"reference": reference, **ratio.as_dict(), "level": RATIO_LEVEL}


def _of_cycles(run: dict) -> bool:
    return run["steady_state"].get("percentiles_of") == OF_CYCLES
