"""The at-target and ``loads`` tests of every file in rounds (serve_bench.load.rounds): each round gives every file
still measuring one turn, its rates' tests back to back after one warm-up, and a file's rate stops as soon as its
steady-state p99 is precise or decided against the budget. The report then holds, per file and rate, the pooled
run, the spread between its rounds, and its p99 over the baseline's and over its float file's at the same rate,
paired round by round."""
from __future__ import annotations

import logging
from typing import Callable

from serve_bench.load.loadgen_scenarios import RETEST_SEED, LoadGenTest, ScenarioSettings, scenario_result
from serve_bench.load.rounds import RATIO_LEVEL, RoundsRule, in_rounds, paired_p99_ratio

log = logging.getLogger(__name__)

Key = tuple[str, int]  # (file, index of its rate: 0 the target, then the `loads` entries)
RATE_SEED = 7_919  # a file's tests at two rates of one round draw different arrivals


def measure_in_rounds(turn: Callable[[str, list[dict]], list[LoadGenTest]], names: list[str],
                      scenarios: list[dict], rule: RoundsRule) -> dict[Key, tuple[dict, list[LoadGenTest]]]:
    """Per (file, rate index) its pooled run (``scenario_result``, plus why it stopped) and the tests it pooled.

    ``scenarios[i]`` is the server test at rate i as ``ScenarioSettings`` fields; round r's test draws the seed
    ``seed + RETEST_SEED·r + RATE_SEED·i``, and only a turn's first test warms up. ``turn(file, scenarios)`` runs
    one file's tests of a round."""
    keys = [(name, i) for name in names for i in range(len(scenarios))]

    def one_round(active: list[Key], index: int) -> dict[Key, LoadGenTest]:
        out: dict[Key, LoadGenTest] = {}
        for name in names:
            mine = [i for n, i in active if n == name]
            if not mine:
                continue
            asked = [{**scenarios[i], "seed": scenarios[i]["seed"] + RETEST_SEED * index + RATE_SEED * i,
                      "warmup_s": scenarios[i].get("warmup_s", 0.0) if k == 0 else 0.0} for k, i in enumerate(mine)]
            out.update(zip([(name, i) for i in mine], turn(name, asked)))
        return out

    measured = in_rounds(keys, one_round, lambda test: test.segment, rule)
    out = {}
    for key, m in measured.items():
        run = scenario_result(ScenarioSettings(**scenarios[key[1]]), m.tests, m.estimate, rounds=True)
        run["steady_state"]["stopped"] = m.stopped
        out[key] = (run, m.tests)
    return out


def pair_runs(measured: dict[Key, tuple[dict, list[LoadGenTest]]], pairs: dict[str, dict[str, str]]) -> None:
    """Add to each run its p99 over each reference's at the same rate, paired round by round (``paired``):
    ``pairs[file]`` names the reference of each role ("baseline", "fp32")."""
    for (name, i), (run, tests) in measured.items():
        for role, reference in (pairs.get(name) or {}).items():
            other = measured.get((reference, i))
            if other is None or reference == name:
                continue
            ratio = paired_p99_ratio([t.segment for t in tests], [t.segment for t in other[1]])
            if ratio is not None:
                run.setdefault("paired", {})[role] = {"reference": reference, **ratio.as_dict(), "level": RATIO_LEVEL}
