"""Gate logic: pass, accuracy fail, latency fail, both; the release is the fastest passing artifact."""
from __future__ import annotations

import numpy as np
import pytest

from serve_bench.accuracy.classification import accuracy
from serve_bench.limits import Limits
from tests.report_entries import as_entries
from serve_bench.gate import evaluate


def _art(name, drop, p99):
    return {"name": name, "accuracy_drop": drop, "latency_ms": {"p99": p99}}


def test_pass_picks_the_fastest_artifact_within_both_limits():
    gate = evaluate(as_entries([_art("torch", 0.0, 4.0), _art("onnx", 0.1, 1.5), _art("int8", 0.4, 0.9)]), Limits(max_drop=0.5, p99_budget_ms=2.0))
    assert gate["passed"] and gate["release"] == "int8"
    assert gate["reasons"] == ["torch: p99 4.000 ms > budget 2 ms"]


def _int8(name, p99, ratio, ci, verdict, reference="onnx"):
    pair = {"ratio": ratio, "ci": ci, "verdict": verdict}
    return {**_art(name, 0.3, p99), "precision": "int8",
            "int8_vs_fp32": {"reference": reference, "p50": pair, "p99": pair}}


def test_an_int8_file_not_shown_faster_than_its_float_file_gives_way_to_it():
    """The INT8 file's point p99 is lower, but its paired ratio over the fp32 file reaches 1: the float file ships,
    and the note says why. Shown faster (the whole interval below 1), the INT8 file ships."""
    limits = Limits(max_drop=0.5, p99_budget_ms=2.0)
    tie = evaluate(as_entries([_art("onnx", 0.0, 1.2), _int8("int8", 1.1, 0.93, [0.81, 1.07], "not distinguishable")]),
                   limits)
    assert tie["release"] == "onnx"
    assert any("int8 (int8) gives way to onnx" in n and "0.81–1.07" in n for n in tie["notes"])
    faster = evaluate(as_entries([_art("onnx", 0.0, 1.2), _int8("int8", 1.1, 0.90, [0.85, 0.95], "faster")]), limits)
    assert faster["release"] == "int8" and not any("gives way" in n for n in faster["notes"])
    # the float file over the budget: nothing to give way to, the INT8 file ships
    alone = evaluate(as_entries([_art("onnx", 0.0, 2.5), _int8("int8", 1.9, 0.95, [0.70, 1.20], "not distinguishable")]),
                     limits)
    assert alone["release"] == "int8" and not any("gives way" in n for n in alone["notes"])
    # no fp32 file on its runtime at all: ranked by its p99, and the note says so instead of silence
    lone = evaluate(as_entries([{**_art("int8", 0.3, 1.1), "precision": "int8"}]), limits)
    assert lone["release"] == "int8" and any("int8 (int8) has no fp32 file on onnxruntime" in n for n in lone["notes"])


def test_under_traffic_the_int8_file_gives_way_by_its_ratio_paired_round_by_round():
    """Gated on the server scenario, the ratio that decides is the one at the pipeline's rate, the two files'
    rounds paired; the closed-loop ratio (here: faster) does not."""
    from tests.test_load_scenarios import artifact_with_run, run_at

    def int8(verdict: str, ci: list[float]) -> dict:
        run = {**run_at(200, 1.1, (1.0, 1.3)), "paired": {"fp32": {"reference": "onnx", "ratio": 0.93, "ci": ci,
                                                                    "rounds": 6, "verdict": verdict, "level": 0.99}}}
        return {**artifact_with_run("int8", run), "precision": "int8", "accuracy_drop": 0.3,
                "int8_vs_fp32": {"reference": "onnx", "p50": {"ratio": 0.5, "ci": [0.4, 0.6], "verdict": "faster"},
                                 "p99": {"ratio": 0.5, "ci": [0.4, 0.6], "verdict": "faster"}}}

    onnx = {**artifact_with_run("onnx", run_at(200, 1.2, (1.1, 1.4))), "accuracy_drop": 0.0}
    limits = Limits(max_drop=0.5, p99_budget_ms=2.0)
    tie = evaluate(as_entries([onnx, int8("not distinguishable", [0.81, 1.07])]), limits)
    assert tie["release"] == "onnx"
    assert any("at 200 queries/s, paired round by round" in n and "99% CI 0.81–1.07" in n for n in tie["notes"])
    faster = evaluate(as_entries([onnx, int8("faster", [0.85, 0.97])]), limits)
    assert faster["release"] == "int8" and not any("gives way" in n for n in faster["notes"])
    unpaired = int8("faster", [0.85, 0.97])
    del unpaired["traffic"]["at_target"]["paired"]
    silent = evaluate(as_entries([onnx, unpaired]), limits)
    assert silent["release"] == "int8" and any("is not paired with onnx (fp32) at 200" in n for n in silent["notes"])


def test_accuracy_fail():
    gate = evaluate(as_entries([_art("int8", 1.2, 0.5)]), Limits(max_drop=0.5, p99_budget_ms=2.0))
    assert not gate["passed"] and gate["release"] is None
    assert gate["reasons"] == ["no artifact meets both the accuracy red line and the p99 budget",
                               "int8: accuracy drop 1.20 points > red line 0.5"]


def test_latency_fail():
    gate = evaluate(as_entries([_art("onnx", 0.0, 3.0)]), Limits(max_drop=0.5, p99_budget_ms=2.0))
    assert not gate["passed"] and "onnx: p99 3.000 ms > budget 2 ms" in gate["reasons"]


def test_both_fail_and_fastest_fails_accuracy():
    gate = evaluate(as_entries([_art("int8", 2.0, 0.5), _art("torch", 0.0, 9.0)]), Limits(max_drop=0.5, p99_budget_ms=2.0))
    assert not gate["passed"]
    assert "int8: accuracy drop 2.00 points > red line 0.5" in gate["reasons"]
    assert "torch: p99 9.000 ms > budget 2 ms" in gate["reasons"]


def test_no_budget_means_accuracy_alone_decides():
    assert evaluate(as_entries([_art("a", 0.2, 50.0)]), Limits(max_drop=0.5, p99_budget_ms=None))["release"] == "a"


def test_meaningless_accuracy_is_not_gated_and_the_result_says_so():
    artifacts = [_art("torch", 0.0, 4.0), _art("int8", 7.5, 0.9),
                 {**_art("refused", 9.0, 0.5), "refused": "no rung within the red line"}]
    judged = evaluate(as_entries(artifacts), Limits(max_drop=0.5, p99_budget_ms=2.0))
    assert judged["release"] is None and judged["decided_on"] == "accuracy and latency" and not judged["notes"]
    gate = evaluate(as_entries(artifacts), Limits(max_drop=0.5, p99_budget_ms=2.0), accuracy_meaningful=False)
    assert gate["passed"] and gate["release"] == "refused"  # the fastest within the budget: latency alone decides
    assert gate["decided_on"] == "latency only" and "random" in gate["notes"][0]
    assert gate["reasons"] == ["torch: p99 4.000 ms > budget 2 ms"]
    slow = evaluate(as_entries([_art("int8", 0.0, 3.0)]), Limits(max_drop=0.5, p99_budget_ms=2.0), accuracy_meaningful=False)
    assert not slow["passed"] and slow["reasons"][0] == "no artifact meets the p99 budget"


def test_accuracy_from_logits():
    logits = np.array([[0.1, 0.9, 0, 0, 0, 0, 0], [0.8, 0.1, 0, 0, 0, 0, 0.05], [0, 0, 0, 0, 0, 0.2, 0.7]])
    result = accuracy(logits, np.array([1, 6, 5]), per_class=True)
    assert result["top1"] == pytest.approx(100 / 3, abs=1e-3) and result["top5"] == 100.0
    assert result["per_class"] == {1: 100.0, 5: 0.0, 6: 0.0}


@pytest.mark.slow  # 4 candidates × 150 picks, each a 30,000-request queue on a fake clock: about a minute
def test_picking_among_candidates_at_the_budget_releases_one_past_it_at_most_as_often_as_the_stated_bound():
    """Every candidate's true p99 is exactly the budget (M/D/1 at ρ 0.6, fake clock), so any release is an error.
    `confident` releases one in at most K × 2.5% of the picks, the bound the gate states (measured, 250 picks of
    4: 4.0%; one candidate alone: 1.6%)."""
    from serve_bench.gate import family_claim
    from serve_bench.load.queue_simulation import single_server_fifo
    from serve_bench.load.steady_state import steady_p99
    from serve_bench.load.steady_state_check import SERVICE_S

    rho, n = 0.6, 30_000
    rng = np.random.default_rng(1)
    long = single_server_fifo(np.cumsum(rng.standard_exponential(2_000_000)) * SERVICE_S / rho,
                              np.full(2_000_000, SERVICE_S))
    budget = float(np.percentile(long.latency_ms[20_000:], 99))

    def candidate(i: int, budget: float = budget) -> dict:
        run = single_server_fifo(np.cumsum(rng.standard_exponential(n)) * SERVICE_S / rho, np.full(n, SERVICE_S))
        steady = steady_p99([(run.arrival_s, run.latency_ms)], budget_ms=budget).as_dict()
        at_target = {"scenario": "server", "offered_qps": rho / SERVICE_S, "latency_ms": {"p99": steady["point"]},
                     "p99_ci": steady["ci"], "steady_state": steady, "sustainable": True, "errors": [],
                     "loadgen": {"valid": True, "invalid_reasons": [], "early_stopping": [],
                                 "target_latency_ms": budget}}
        return {"name": f"c{i}", "traffic": {"scenario": "server", "at_target": at_target}}

    picks = 150
    released = sum(evaluate(as_entries([candidate(i) for i in range(4)]), Limits(max_drop=1.0, p99_budget_ms=budget, decision="confident"), accuracy_meaningful=False)["passed"] for _ in range(picks))
    looser = 1.5 * budget  # the same candidates well within a looser budget are released
    assert all(evaluate(as_entries([candidate(i, looser) for i in range(4)]), Limits(max_drop=1.0, p99_budget_ms=looser, decision="confident"), accuracy_meaningful=False)["passed"] for _ in range(10))
    bound = family_claim(4)["bound"]
    assert bound == pytest.approx(4 * 0.025, abs=1e-4)
    assert released / picks <= bound


def _eager(name, drop, p99):
    """A torch model in eager mode; ``train.model`` is the baseline, its paired accuracy the reference."""
    baseline = {"accuracy_paired": {"reference": True, "n": 1000, "baseline_only": 0, "artifact_only": 0,
                                    "discordant": 0, "drop": 0.0, "drop_ci": [0.0, 0.0]}} if name == "train.model" else {}
    return {**_art(name, drop, p99), "runtime": "torch", "format": "torch", "source_model": name, **baseline}


def _as_it_is(name, drop, p99, runtime="onnxruntime"):
    """The baseline exported as it is (export alone): a candidate like any other."""
    return {**_art(name, drop, p99), "role": "reference", "runtime": runtime, "source_model": "train.model"}


def test_the_baseline_exported_as_it_is_is_released_where_every_compressed_file_breaks_the_red_line():
    """The case that shipped torch eager at p99 10.3 ms while the same weights exported ran at 1.2 ms: pruning lost
    2.44 points past a 1-point line and every file made from it inherited the loss. The export of the baseline as it
    is passes and is released; the note says compression bought nothing and by how much the best compressed file
    missed."""
    arts = [_eager("train.model", 0.0, 10.33),
            {**_art("export.onnx", 2.44, 0.70), "source_model": "prune.model"},
            {**_art("quantize.onnx_cpu", 3.38, 0.55), "precision": "int8", "source_model": "prune.model"},
            _as_it_is("export-alone:train.model", -0.75, 1.50),
            _as_it_is("export-alone:train.model@openvino", -0.75, 1.23, runtime="openvino")]
    gate = evaluate(as_entries(arts), Limits(max_drop=1.0, p99_budget_ms=20.0))
    assert gate["passed"] and gate["release"] == "export-alone:train.model@openvino"
    note = next(n for n in gate["notes"] if n.startswith("compression bought nothing"))
    assert "no compressed file passed; the fastest, quantize.onnx_cpu (p99 0.550 ms)" in note
    assert "accuracy drop 3.38 points > red line 1" in note


def test_a_compressed_file_within_the_limits_but_slower_than_the_baseline_exported_says_by_how_much():
    arts = [_eager("train.model", 0.0, 10.0), {**_art("export.onnx", 0.3, 1.8), "source_model": "prune.model"},
            _as_it_is("export-alone:train.model", 0.0, 1.2)]
    gate = evaluate(as_entries(arts), Limits(max_drop=1.0, p99_budget_ms=20.0))
    assert gate["release"] == "export-alone:train.model"
    assert any("the fastest compressed file within both limits, export.onnx, has p99 1.800 ms: ×1.50 the released "
               "file's (point p99s, not paired)" in n for n in gate["notes"])
    # faster and within the line: the compressed file ships, and nothing is said about the baseline's export
    faster = evaluate(as_entries([*arts[:1], {**arts[1], "latency_ms": {"p99": 0.9}}, arts[2]]),
                      Limits(max_drop=1.0, p99_budget_ms=20.0))
    assert faster["release"] == "export.onnx" and not any("compression bought" in n for n in faster["notes"])


def test_torch_eager_is_released_only_where_no_exported_or_compiled_file_passes():
    """Eager is faster here (a pathological case), yet an exported file within both limits ships; only where every
    exported file fails does eager ship, and the note names the fastest of them and why it failed."""
    limits = Limits(max_drop=1.0, p99_budget_ms=5.0)
    arts = [_eager("train.model", 0.0, 0.8), _eager("prune.model", 0.2, 0.6),
            _as_it_is("export-alone:train.model", 0.0, 1.2)]
    gate = evaluate(as_entries(arts), limits)
    assert gate["release"] == "export-alone:train.model"
    failing = [arts[0], arts[1], _as_it_is("export-alone:train.model", 0.0, 6.5),
               {**_art("export.onnx", 2.0, 0.4), "source_model": "prune.model"}]
    gate = evaluate(as_entries(failing), limits)
    assert gate["release"] == "prune.model"
    assert any(n.startswith("prune.model runs in torch eager because no exported or compiled file of any model "
                            "passed; the fastest, export.onnx (p99 0.400 ms), failed: accuracy drop 2.00") for n in
               gate["notes"])


def test_an_int8_file_whose_only_float_counterpart_is_the_baseline_exported_gives_way_to_it():
    """An INT8 file of the baseline in a pipeline with no export stage: its fp32 counterpart is the baseline exported
    as it is. Not shown faster than it, it gives way on the same terms as to any fp32 file, with the same note."""
    arts = [_eager("train.model", 0.0, 9.0), _as_it_is("export-alone:train.model", 0.0, 1.2),
            {**_int8("quantize.onnx_cpu", 1.1, 0.93, [0.81, 1.07], "not distinguishable",
                     reference="export-alone:train.model"), "source_model": "train.model"}]
    gate = evaluate(as_entries(arts), Limits(max_drop=0.5, p99_budget_ms=2.0))
    assert gate["release"] == "export-alone:train.model"
    assert any("quantize.onnx_cpu (int8) gives way to export-alone:train.model (fp32, same model and runtime"
               in n and "so quantization buys no latency" in n for n in gate["notes"])


def test_a_compressed_file_not_shown_faster_than_the_baseline_exported_gives_way_to_it():
    """The rule INT8 files follow, for every compression step: a pruned file whose p99 over the baseline exported as
    it is, block-paired, reaches 1 gives way to it, however its point p99 falls; shown faster, it ships."""
    def pruned(verdict, ci):
        pair = {"ratio": 0.93, "ci": ci, "verdict": verdict}
        return {**_art("export.onnx", 0.4, 1.10), "source_model": "prune.model",
                "vs_export_alone": {"reference": "export-alone:train.model", "p50": pair, "p99": pair}}

    arts = [_eager("train.model", 0.0, 9.0), _as_it_is("export-alone:train.model", 0.0, 1.2)]
    limits = Limits(max_drop=1.0, p99_budget_ms=5.0)
    tie = evaluate(as_entries([*arts, pruned("not distinguishable", [0.80, 1.08])]), limits)
    assert tie["release"] == "export-alone:train.model"
    assert any("export.onnx gives way to export-alone:train.model (the baseline model as it is" in n and
               "compression buys no latency" in n for n in tie["notes"])
    note = next(n for n in tie["notes"] if n.startswith("compression bought nothing"))
    assert "×0.93 the released file's, block-paired (95% CI 0.80–1.08, not distinguishable)" in note
    faster = evaluate(as_entries([*arts, pruned("faster", [0.85, 0.97])]), limits)
    assert faster["release"] == "export.onnx" and not any("gives way" in n for n in faster["notes"])


def test_an_unswept_eager_model_does_not_turn_a_swept_release_into_one_ranked_by_p99():
    """The sweep ranks the release where every file it is chosen among was swept; torch eager, left out of the sweep
    and out of the release while an exported file passes, does not count, and the basis says so."""
    from tests.test_load_scenarios import run_at

    def swept(name, p99, qps):
        config = {"label": "b1", "serving": {"max_batch": 1, "max_queue_delay_us": 0, "instances": 1, "threads": 1},
                  "curve": [run_at(qps, p99, (p99 * 0.9, p99 * 1.1))],
                  "capacity": {"qps": qps, "budget_ms": 5.0, "rule": "point"}}
        return {**_art(name, 0.0, p99), "traffic": {"scenario": "single-stream",
                                                    "sweep": {"configs": [config], "best": config}}}

    arts = [_eager("train.model", 0.0, 3.0), swept("export.onnx", 1.2, 200.0), swept("other.onnx", 1.6, 400.0)]
    gate = evaluate(as_entries(arts), Limits(max_drop=1.0, p99_budget_ms=5.0))
    assert gate["release"] == "other.onnx" and gate["ranked_by"].startswith("most traffic within the p99 budget")


def test_measured_at_served_gates_on_the_run_through_the_server_and_fails_a_file_no_server_ran():
    """The same two files: in process both pass and the faster ships; gated on the served p99, the one whose server
    adds past the budget fails, and a file that was never served cannot pass (its reason names why)."""
    from tests.test_load_scenarios import artifact_with_run, run_at

    def file(name: str, inside: float, served: float | None, failed: str | None = None) -> dict:
        entry = {**artifact_with_run(name, run_at(50, inside, (inside * 0.9, inside * 1.1))), "accuracy_drop": 0.0}
        entry["traffic"]["served"] = ({"server": "ray-serve", "failed": failed} if served is None else
                                      {"server": "ray-serve", "run": run_at(50, served, (served * 0.9, served * 1.1)),
                                       "in_process": run_at(50, inside, (inside * 0.9, inside * 1.1))})
        return entry

    files = [file("fast", 0.5, 7.0), file("slow", 1.5, 3.0), file("eager", 1.0, None, "not served: no model server "
                                                                                  "here runs this file")]
    limits = Limits(max_drop=0.5, p99_budget_ms=5.0)
    in_process = evaluate(as_entries(files), limits)
    assert in_process["release"] == "fast"
    for entry in files:
        entry["traffic"]["measured_at"] = "served"
    served = evaluate(as_entries(files), limits)
    assert served["release"] == "slow"
    assert "fast: through its model server, p99 7.000 ms at 50.0 queries/s > budget 5 ms" in served["reasons"]
    assert any(r.startswith("eager: no run through its model server (latency.measured_at served): not served: no "
                            "model server here runs this file") for r in served["reasons"])
    assert "through the model server" in served["latency_basis"]


def test_under_measured_at_served_files_are_ranked_by_the_load_their_server_sustains_not_the_load_in_process():
    """Two swept files: in process the first carries twice the load, but through its server it keeps a quarter of
    it, and the second more. Gated on the served run, the release is ranked by the sweep through the server."""
    from tests.test_load_scenarios import artifact_with_run, run_at

    def sweep(qps: float) -> dict:
        config = {"label": "b1", "serving": {"max_batch": 1, "max_queue_delay_us": 0, "instances": 1, "threads": 1},
                  "curve": [run_at(qps, 2.0, (1.8, 2.2))], "capacity": {"qps": qps, "budget_ms": 5.0, "rule": "point"}}
        return {"configs": [config], "best": config}

    def file(name: str, inside: float, through: float) -> dict:
        entry = {**artifact_with_run(name, run_at(50, 1.0, (0.9, 1.1))), "accuracy_drop": 0.0}
        entry["traffic"]["sweep"] = sweep(inside)
        entry["traffic"]["served"] = {"server": "ray-serve", "run": run_at(50, 3.0, (2.7, 3.3)),
                                      "in_process": run_at(50, 1.0, (0.9, 1.1)), "sweep": sweep(through)}
        return entry

    files = [file("quick", 400.0, 100.0), file("steady", 200.0, 150.0)]
    limits = Limits(max_drop=0.5, p99_budget_ms=5.0)
    assert evaluate(as_entries(files), limits)["release"] == "quick"
    for entry in files:
        entry["traffic"]["measured_at"] = "served"
    served = evaluate(as_entries(files), limits)
    assert served["release"] == "steady" and served["ranked_by"].startswith("most traffic within the p99 budget")
    files[1]["traffic"]["served"].pop("sweep")  # one file not swept through its server: ranked by p99 again
    assert evaluate(as_entries(files), limits)["ranked_by"] == "lowest p99"


def test_under_measured_at_served_the_int8_file_gives_way_by_its_ratio_through_the_server():
    """An INT8 file and its fp32 file served through one server in the same rounds: the INT8 file's served p99 over
    the fp32 file's, paired round by round, decides as the in-process ratio does where the gate reads in process;
    where the served runs were not paired the note says so."""
    from tests.test_load_scenarios import artifact_with_run, run_at

    def file(name: str, served: float, paired: dict | None = None) -> dict:
        entry = {**artifact_with_run(name, run_at(50, 1.0, (0.9, 1.1))), "accuracy_drop": 0.0}
        run = {**run_at(50, served, (served * 0.9, served * 1.1)), **({"paired": paired} if paired else {})}
        entry["traffic"].update(measured_at="served", served={"server": "ray-serve", "run": run,
                                                              "in_process": run_at(50, 1.0, (0.9, 1.1))})
        return entry

    def int8(verdict: str, ci: list[float]) -> dict:
        pair = {"reference": "onnx", "ratio": 0.95, "ci": ci, "rounds": 6, "verdict": verdict, "level": 0.99,
                "through": "served"}
        return {**file("int8", 3.8, {"fp32": pair}), "precision": "int8", "accuracy_drop": 0.3,
                "int8_vs_fp32": {"reference": "onnx", "p50": {"ratio": 0.5, "ci": [0.4, 0.6], "verdict": "faster"},
                                 "p99": {"ratio": 0.5, "ci": [0.4, 0.6], "verdict": "faster"}}}

    limits = Limits(max_drop=0.5, p99_budget_ms=5.0)
    tie = evaluate(as_entries([file("onnx", 4.0), int8("not distinguishable", [0.8, 1.1])]), limits)
    assert tie["release"] == "onnx"
    assert any("int8 (int8) gives way to onnx" in n and "through their model server at 50 queries/s, paired round "
               "by round" in n and "99% CI 0.80–1.10" in n for n in tie["notes"])
    faster = evaluate(as_entries([file("onnx", 4.0), int8("faster", [0.85, 0.97])]), limits)
    assert faster["release"] == "int8" and not any("gives way" in n for n in faster["notes"])
    # the fp32 file is the baseline as it is: the release note gives the INT8 file's ratio on the basis the gate
    # ranked by (through the server, by round), not the closed-loop one that would contradict the gate
    as_is = {**file("onnx", 4.0), "role": "reference", "source_model": "train.model"}
    note = next(n for n in evaluate(as_entries([as_is, int8("not distinguishable", [0.8, 1.1])]), limits)["notes"]
                if n.startswith("compression bought nothing"))
    assert "×0.95 the released file's through their model server at 50 queries/s, paired round by round (99% CI " \
           "0.80–1.10, not distinguishable)" in note and "block-paired" not in note
    unpaired = int8("faster", [0.85, 0.97])
    del unpaired["traffic"]["served"]["run"]["paired"]
    silent = evaluate(as_entries([file("onnx", 4.0), unpaired]), limits)
    assert silent["release"] == "int8" and any("not paired with onnx (fp32) through their servers" in n
                                               for n in silent["notes"])
