"""The search's choice, simulated where the answer is known: trials whose true drop sits exactly on the
red line. Any release is then a false pass; the gate promises at most 2.5% under the `confident` rule.

Each simulated search runs the search's own scoring (outcome_of on a split bench report), its choice of
finalists (best_first) and its final gate (judge_finalists) on per-image agreement counts drawn for
every trial, independently on the validation split (500 images) and the test split (1,000 images),
as the mnist5k pipelines split them. Today's rule before this change is simulated through the same
functions: trials scored on the test split, and the finalists re-judged on those same test figures
without correction.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest

import serve_bench.gate as gate_module
import serve_bench.stats.paired as paired_module
from compress.search import final_gate
from serve_bench.limits import Limits
from compress.search.final_gate import correction_for, judge_finalists
from compress.search.objective import best_first, outcome_of
from serve_bench.report_model import Report
from tests.report_entries import as_entries, as_report
from serve_bench.gate import evaluate
from serve_bench.stats.paired import PairedCounts
from tests.search_entries import baseline_entry

MAX_DROP = 1.0
BASELINE_ONLY, ARTIFACT_ONLY = 0.015, 0.005  # per image: the drop is exactly 1.0 point, 2% of images disagree
TRIALS, FINALISTS, VAL_N, TEST_N = 14, 3, 500, 1000
LIMITS = Limits(metric="top1", max_drop=MAX_DROP, p99_budget_ms=None, decision="confident")
BASELINES = {n: baseline_entry(n) for n in (VAL_N, TEST_N)}


@pytest.fixture
def fast_intervals(monkeypatch):
    """The same score interval, computed once per distinct count (a simulation draws the same counts often);
    the gate's 'how many images would it take' words are not part of any decision, so they are left out."""
    cached = functools.lru_cache(maxsize=None)(paired_module.drop_interval)
    for module in (paired_module, gate_module, final_gate):
        monkeypatch.setattr(module, "drop_interval", cached)
    monkeypatch.setattr(gate_module, "_needed_words", lambda paired, max_drop: "", raising=False)
    return cached


def _entry(trial: int, counts: tuple[int, int], n: int, p99: float) -> dict:
    b, c = counts
    low, high = paired_module.drop_interval(PairedCounts(n, b, c))
    ratio = p99 / 4.0
    return {"name": f"trial-{trial}:export.onnx", "accuracy": {"top1": 95.0}, "accuracy_drop": 100.0 * (b - c) / n,
            "contender": {"role": "trial", "artifact": "export.onnx", "run_dir": f"trials/{trial:03d}", "trial": trial},
            "accuracy_paired": {"n": n, "baseline_only": b, "artifact_only": c, "discordant": b + c,
                                "drop_ci": [low, high]},
            "latency_ms": {"p50": p99 / 2, "p99": p99, "p99_ci_blocks": [p99 * 0.9, p99 * 1.1]},
            "latency_ratio": {"p99": {"ratio": ratio, "ci": [ratio * 0.95, ratio * 1.05], "rounds": 12,
                                      "verdict": "faster"},
                              "p50": {"ratio": ratio, "ci": [ratio * 0.95, ratio * 1.05], "rounds": 12,
                                      "verdict": "faster"}}}


def _draw(rng, n: int, size: int) -> list[tuple[int, int]]:
    drawn = rng.multinomial(n, [BASELINE_ONLY, ARTIFACT_ONLY, 1 - BASELINE_ONLY - ARTIFACT_ONLY], size=size)
    return [(int(b), int(c)) for b, c, _ in drawn]


def _report(entry: dict, split: str, n: int) -> Report:
    """A trial's split bench report (as split_bench writes it): the baseline and the trial's candidate."""
    return as_report({"split": split, "baseline": BASELINES[n]["name"], "metric": "top1", "limits": LIMITS.as_dict(),
                      "data": {"meaningful_accuracy": True, "test_images": n}, "artifacts": [BASELINES[n], entry]})


def _search(rng, rule: str) -> bool:
    """One search over TRIALS trials on the red line; True when it released an artifact (a false pass)."""
    p99 = rng.uniform(0.2, 2.0, size=TRIALS)
    test = [_entry(t, counts, TEST_N, p99[t]) for t, counts in enumerate(_draw(rng, TEST_N, TRIALS))]
    if rule == "today":  # scored on the test split; the final gate re-judges the same test figures, uncorrected
        scores = [(t, outcome_of(_report(e, "test", TEST_N))) for t, e in enumerate(test)]
        finalists = best_first(scores, "fastest_within_red_line")[:FINALISTS]
        return bool(finalists) and evaluate(as_entries([test[t] for t in finalists]), Limits(max_drop=MAX_DROP, p99_budget_ms=None, decision="confident"))["passed"]
    val = [_entry(t, counts, VAL_N, p99[t]) for t, counts in enumerate(_draw(rng, VAL_N, TRIALS))]
    scores = [(t, outcome_of(_report(e, "val", VAL_N))) for t, e in enumerate(val)]
    finalists = best_first(scores, "fastest_within_red_line")[:FINALISTS]
    return bool(finalists) and judge_finalists(as_entries([test[t] for t in finalists]), LIMITS)["passed"]


def _rate(rule: str, searches: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    return sum(_search(rng, rule) for _ in range(searches)) / searches


def test_a_search_of_trials_on_the_red_line_releases_one_at_most_2_5_percent_of_the_time(fast_intervals, capsys):
    new = _rate("validation", 2000, seed=1)
    today = _rate("today", 600, seed=2)
    with capsys.disabled():
        print(f"\nfalse-pass rate, {TRIALS} trials on the red line ({MAX_DROP:g} point, confident rule): "
              f"today's rule {today:.1%}, scored on validation with the corrected final gate {new:.1%}")
    # Trials are chosen on validation by their point estimates, so three finalists on the line reach the final
    # bench in almost every search, and the corrected gate lets one through about 1.6% of the time (see the next
    # test); 2,000 searches estimate that within about ±0.6 point, so the promise, 2.5%, is 3 SE above it.
    assert new <= 0.025
    assert today >= 0.15  # choosing on the split it then reports: about 1 − 0.975^14 ≈ 30% in the issue


def test_the_final_gate_corrects_for_choosing_among_the_finalists(fast_intervals):
    """Finalists on the line that reached the final bench (whatever their validation figures): one of three
    passes the uncorrected 95% rule about 1 − 0.975^3 ≈ 7% of the time; the Bonferroni level keeps the
    chance that one is released at 2.5% or less."""
    rng = np.random.default_rng(3)
    searches, corrected, uncorrected = 4000, 0, 0
    for _ in range(searches):
        entries = [_entry(t, counts, TEST_N, 1.0 + t) for t, counts in enumerate(_draw(rng, TEST_N, FINALISTS))]
        corrected += judge_finalists(as_entries(entries), LIMITS)["passed"]
        uncorrected += evaluate(as_entries(entries), Limits(max_drop=MAX_DROP, p99_budget_ms=None, decision="confident"))["passed"]
    # 20,000 such searches gave 6.9% and 1.6%; 4,000 estimate each within about ±0.4 and ±0.2 point
    assert uncorrected / searches >= 0.04  # the error the correction is for
    assert corrected / searches <= 0.025


def test_the_correction_says_what_it_is_and_leaves_one_finalist_and_the_point_rule_alone():
    bonferroni = correction_for(3, "confident")
    assert bonferroni.method == "bonferroni" and bonferroni.level == pytest.approx(1 - 0.05 / 3)
    assert "Bonferroni over 3 finalists" in bonferroni.words()
    assert correction_for(1, "confident").method == "none"
    point = correction_for(3, "point")
    assert point.method == "none" and "no error rate to correct" in point.words()


def test_the_released_finalist_is_the_fastest_by_its_ratio_to_the_baseline_in_the_same_bench():
    """Two finalists within the line: the one released has the smaller p99 ratio to the baseline, even where
    its absolute p99 (here: measured in another round mix) reads higher."""
    a, b = _entry(1, (0, 0), TEST_N, 1.0), _entry(2, (0, 0), TEST_N, 1.2)
    a["latency_ratio"]["p99"]["ratio"], b["latency_ratio"]["p99"]["ratio"] = 0.40, 0.30
    decided = judge_finalists(as_entries([a, b]), Limits(metric="top1", max_drop=1.0, p99_budget_ms=None, decision="confident"))
    assert decided["release"] == "trial-2:export.onnx" and decided["ranked_on"].startswith("p99 ratio")


def test_a_trial_is_chosen_on_validation_by_its_point_estimates_not_certified_there():
    """500 validation images cannot certify a 1-point red line for a trial with 1 of 500 images against it (upper
    bound 1.12): judged by bounds, every such trial was infeasible and none reached the final bench."""
    entry = _entry(0, (1, 0), VAL_N, 1.0)
    assert entry["accuracy_paired"]["drop_ci"][1] > MAX_DROP
    outcome = outcome_of(_report(entry, "val", VAL_N))
    assert outcome["feasible"] and outcome["decision"] == "point" and outcome["constraints"][0] < 0
    on_test = outcome_of(_report(_entry(0, (2, 0), VAL_N, 1.0), "test", VAL_N))  # the test split: certified
    assert not on_test["feasible"] and on_test["decision"] == "confident"


def test_the_final_choice_follows_the_objective():
    fast, accurate = _entry(1, (3, 0), TEST_N, 1.0), _entry(2, (0, 0), TEST_N, 2.0)
    limits = Limits(metric="top1", max_drop=1.0, p99_budget_ms=None, decision="point")
    assert judge_finalists(as_entries([fast, accurate]), limits)["release"] == fast["name"]
    decided = judge_finalists(as_entries([fast, accurate]), limits, objective="most_accurate_within_budget")
    assert decided["release"] == accurate["name"] and decided["ranked_on"].startswith("accuracy drop")


def test_most_traffic_ranks_by_load_only_where_every_passing_finalist_has_one():
    """A finalist swept to 300/s beside one never swept (as under measured_at served, where a file's sweep through
    its server may be missing): the unswept one is not ranked as carrying nothing; the p99 ratio decides, and the
    gate says so."""
    limits = Limits(metric="top1", max_drop=1.0, p99_budget_ms=None, decision="point")
    swept, unswept = _entry(1, (3, 0), TEST_N, 2.0), _entry(2, (3, 0), TEST_N, 1.0)
    config = {"label": "b1", "serving": {"max_batch": 1, "max_queue_delay_us": 0, "instances": 1, "threads": 1},
              "capacity": {"qps": 300.0, "budget_ms": None, "rule": "point"}}
    swept["traffic"] = {"scenario": "single-stream", "sweep": {"configs": [config], "best": config}}
    decided = judge_finalists(as_entries([swept, unswept]), limits, objective="most_traffic_within_budget")
    assert decided["release"] == unswept["name"]
    assert any("ranked by their p99 ratio" in note for note in decided["notes"])
    unswept["traffic"] = {"scenario": "single-stream", "sweep": {"configs": [{**config, "capacity": {
        **config["capacity"], "qps": 100.0}}], "best": {**config, "capacity": {**config["capacity"], "qps": 100.0}}}}
    assert judge_finalists(as_entries([swept, unswept]), limits,
                           objective="most_traffic_within_budget")["release"] == swept["name"]


def test_the_p99_at_the_pipelines_traffic_is_judged_at_the_corrected_level_too():
    """Under the server scenario a finalist's p99 interval is read again from its stored steady-state tail at the
    Bonferroni level (99% → 1 − 0.01/F two-sided): a p99 whose 99% upper end is just within the budget is
    refused among four finalists, where its corrected upper end is past it."""
    from serve_bench.load.queue_simulation import single_server_fifo
    from serve_bench.load.steady_state import steady_p99, upper_at

    rng = np.random.default_rng(0)
    n = 30_000
    run = single_server_fifo(np.cumsum(rng.standard_exponential(n)) * 0.002 / 0.6, np.full(n, 0.002))
    steady = steady_p99([(run.arrival_s, run.latency_ms)]).as_dict()
    assert upper_at(steady, 1) == steady["ci"][1]
    budget = (upper_at(steady, 1) + upper_at(steady, 4)) / 2
    entry = {**_entry(1, (0, 0), 1000, 1.0), "traffic": {"scenario": "server", "at_target": {
        "scenario": "server", "offered_qps": 300.0, "latency_ms": {"p99": steady["point"]}, "p99_ci": steady["ci"],
        "steady_state": steady, "sustainable": True, "sustainable_reason": "sustainable", "errors": [],
        "loadgen": {"valid": True, "invalid_reasons": [], "early_stopping": [], "target_latency_ms": budget}}}}
    limits = Limits(metric="top1", max_drop=MAX_DROP, p99_budget_ms=budget, decision="confident")
    alone = judge_finalists(as_entries([entry]), limits, meaningful=False)
    assert alone["passed"], alone["reasons"]
    others = [{**entry, "name": f"other{i}"} for i in range(3)]
    among_four = judge_finalists(as_entries([entry, *others]), limits, meaningful=False)
    assert not among_four["passed"] and "finalists) > budget" in among_four["reasons"][-1]
