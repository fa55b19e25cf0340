"""The search file, the shared stages, trial directories and a trial's score, without Ray."""
from __future__ import annotations

import copy
import json
import os

import pytest
import yaml

from compress.cli import main
from compress.errors import ConfigError
from compress.pipeline.manifest import Manifest
from compress.pipeline.pipeline_file import build_pipeline
from compress.pipeline.runner import RunOptions, Runner
from compress.search.objective import outcome_of, values
from compress.search.search_report import pareto_plot, render_markdown, trial_table
from compress.search.settings import load_search
from compress.search.trial_dirs import seed_trial, shared_stages
from tests.conftest import TINY
from tests.search_entries import entry, split_report

FULL = {**copy.deepcopy(TINY), "red_line": {"metric": "top1", "max_drop": 2.0}, "stages": [
    *copy.deepcopy(TINY["stages"]),
    {"name": "prune", "kind": "prune", "sparsity": {"epochs": 1}, "finetune": {"epochs": 1}, "target": {"macs": 0.5}},
    {"name": "quantize", "kind": "quantize"},
    {"name": "bench", "kind": "bench"}]}


def _write(tmp_path, search: dict, pipeline: dict | None = None):
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(pipeline or FULL, sort_keys=False))
    path = tmp_path / "search.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "pipeline": "base.yaml", **search}, sort_keys=False))
    return path


def test_a_typo_in_a_space_path_is_refused_before_anything_runs(tmp_path):
    path = _write(tmp_path, {"space": {"stages.prune.target.mac": {"low": 0.1, "high": 0.5},
                                       "stages.quantize.calibration.method": ["entropy", "nonsense"]}})
    with pytest.raises(ConfigError) as err:
        load_search(path)
    text = str(err.value)
    assert str(path) in text and "2 space entries" in text
    assert "space.stages.prune.target.mac = 0.1" in text and "unknown field; known fields: macs" in text
    assert "space.stages.quantize.calibration.method = 'nonsense'" in text
    assert main(["search", str(path)]) == 2
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("path, values", [("latency.batch_size", [1, 32]), ("stages.bench.threads", [1, 2]),
                                          ("stages.bench.min_duration_s", [1.0, 3.0])])
def test_a_space_may_not_vary_how_trials_are_measured(tmp_path, path, values):
    """Trials chosen on batch-32 speed-ups would be judged at batch 1 in the final bench (the hand-set protocol)."""
    with pytest.raises(ConfigError, match=rf"space\.{path}: the measurement protocol .* not a setting to search"):
        load_search(_write(tmp_path, {"space": {path: values}}))


@pytest.mark.parametrize("space, message", [
    ({"stages.prune.target.macs": {"low": 0.5, "high": 0.1}}, "high 0.1 must be above low 0.5"),
    ({"stages.prune.round_to": []}, "give at least one choice"),
    ({"name": ["a", "b"]}, "a trial may not change name"),
    ({"stages.train.augment": [{"pad": 2}]}, "choices must be plain values"),
    ({"stages.prune.target.macs": {"low": 0, "high": 0.5, "log": True}}, "log: both ends must be above 0"),
])
def test_bad_space_entries_name_the_file_line_and_field(tmp_path, space, message):
    path = _write(tmp_path, {"space": space})
    with pytest.raises(ConfigError) as err:
        load_search(path)
    assert message in str(err.value) and f"{path}:" in str(err.value)


def test_a_pipeline_without_a_bench_stage_or_with_its_own_threads_is_refused(tmp_path):
    no_bench = {**FULL, "stages": FULL["stages"][:-1]}
    with pytest.raises(ConfigError, match="has none; add `- {name: bench, kind: bench}`"):
        load_search(_write(tmp_path, {"space": {"stages.prune.round_to": [8]}}, no_bench))
    with pytest.raises(ConfigError, match="pins every trial's thread count"):
        load_search(_write(tmp_path, {"space": {"stages.prune.round_to": [8]}}, {**FULL, "threads": 2}))
    with pytest.raises(ConfigError, match="pipeline: .* is not a file"):
        load_search(_write(tmp_path, {"space": {"stages.prune.round_to": [8]}, "pipeline": "missing.yaml"}))


def test_trials_share_the_stages_upstream_of_what_the_space_touches(tmp_path):
    plan = load_search(_write(tmp_path, {"space": {"stages.prune.target.macs": {"low": 0.2, "high": 0.6}},
                                         "threads_per_trial": 1}))
    assert shared_stages(plan.base, ["stages.prune.target.macs"]) == ["train"]
    assert shared_stages(plan.base, ["stages.quantize.calibration.method"]) == ["train", "prune"]
    assert shared_stages(plan.base, ["red_line.max_drop"]) == ["train"]  # prune (macs: auto, the guard) reads it too
    assert shared_stages(plan.base, ["stages.1.round_to"]) == ["train"]  # a stage by index
    assert shared_stages(plan.base, ["data.image_size"]) == []
    raw = plan.trial_raw({"stages.prune.target.macs": 0.3, "stages.prune.finetune.distill.temperature": 2.0})
    assert raw["threads"] == 1 and raw["stages"][1]["target"] == {"macs": 0.3}
    assert raw["stages"][1]["finetune"]["distill"] == {"temperature": 2.0}  # an unset section is filled in
    assert plan.base_raw["stages"][1]["target"] == {"macs": 0.5}  # the hand-set mapping is never changed


def test_trials_log_nothing_to_mlflow_and_the_chosen_pipeline_keeps_its_tracking(tmp_path):
    tracked = {**copy.deepcopy(FULL), "tracking": {"mlflow": {"experiment": "e"}, "tensorboard": True}}
    plan = load_search(_write(tmp_path, {"space": {"stages.prune.target.macs": [0.3, 0.5]}}, tracked))
    params = {"stages.prune.target.macs": 0.3}
    assert plan.trial_run_raw(params)["tracking"] == {"tensorboard": True}
    assert build_pipeline(plan.trial_run_raw(params), "trial").config.tracking.mlflow is None
    assert plan.trial_raw(params)["tracking"]["mlflow"] == {"experiment": "e"}  # what chosen.yaml is written from
    assert plan.base_raw["tracking"]["mlflow"] == {"experiment": "e"}


def test_threads_pin_the_run_and_enter_the_cache_key_only_when_set(tmp_path, tiny_config):
    import torch

    before = torch.get_num_threads()
    keys = {}
    for threads in (None, 1):
        cfg = copy.deepcopy(tiny_config)
        if threads:
            cfg["threads"] = threads
        run_dir = tmp_path / f"t{threads}"
        Runner(build_pipeline(cfg, "p.yaml"), run_dir).run()
        record = Manifest.load(run_dir).stages["train"]
        keys[threads] = record.key_material
    assert "threads" not in keys[None] and keys[1]["threads"] == 1
    assert torch.get_num_threads() == before  # the caller's count is restored


def test_a_trial_directory_starts_with_hard_links_to_the_shared_stages_and_skips_them(tmp_path, tiny_config):
    reference = tmp_path / "reference"
    Runner(build_pipeline(tiny_config, "p.yaml"), reference).run()
    trial = tmp_path / "trial"
    assert seed_trial(reference, trial, ["train"]) == ["train"]
    ref_file = next(p for p in (reference / "train" / "model").iterdir() if p.suffix == ".safetensors")
    linked = trial / ref_file.relative_to(reference)
    assert os.stat(linked).st_ino == os.stat(ref_file).st_ino
    before = json.loads((reference / "manifest.json").read_text())
    changed = copy.deepcopy(tiny_config)
    changed["stages"].append({"name": "again", "kind": "train", "epochs": 1, "checkpoint_every": 0, "amp": "off"})
    Runner(build_pipeline(changed, "p.yaml"), trial, options=RunOptions(reuse_run_dir=True)).run()
    manifest = Manifest.load(trial)
    assert manifest.stages["train"].started == before["stages"]["train"]["started"]  # cached, not trained again
    assert manifest.stages["again"].status == "completed"
    assert json.loads((reference / "manifest.json").read_text()) == before  # the reference is untouched
    assert seed_trial(reference, trial, ["train"]) == []  # a trial directory with a manifest is left as it is


_entry = entry


def _report(decision, entries):
    return split_report(decision, entries)


def test_a_trial_scores_its_fastest_artifact_within_the_rule_and_misses_say_by_how_much():
    fast_risky = _entry("quantize.onnx_cpu", 0.2, 20, 15, [0.19, 0.21])  # drop 0.5, upper bound above 1
    slower_safe = _entry("export.onnx", 0.4, 2, 1, [0.38, 0.45])  # drop 0.1, upper bound below 1
    assert fast_risky["accuracy_paired"]["drop_ci"][1] > 1.2 and slower_safe["accuracy_paired"]["drop_ci"][1] < 0.7
    # On the test split the pipeline's rule decides: `confident` takes the upper bounds.
    point = outcome_of(split_report("point", [fast_risky, slower_safe], split="test"))
    assert point["candidate"] == "quantize.onnx_cpu" and point["feasible"]
    confident = outcome_of(split_report("confident", [fast_risky, slower_safe], split="test"))
    assert confident["candidate"] == "export.onnx" and confident["feasible"]
    upper = slower_safe["accuracy_paired"]["drop_ci"][1]
    # each miss relative to its limit (red line 1 point, budget 5 ms)
    assert confident["constraints"] == [pytest.approx((upper - 1.0) / 1.0, abs=1e-4),
                                        pytest.approx((0.45 - 5.0) / 5.0, abs=1e-4)]
    # speed is the p99 ratio to the baseline measured in the same bench (0.4 ms against 4 ms)
    assert values(confident, "fastest_within_red_line", "tpe") == [pytest.approx(0.1)]
    assert values(confident, "most_accurate_within_budget", "tpe") == [pytest.approx(0.1)]
    assert values(confident, "fastest_within_red_line", "nsga2") == [pytest.approx(0.1), pytest.approx(0.1)]
    # On the validation split a trial is chosen, not certified: point estimates, whatever the rule.
    chosen = outcome_of(_report("confident", [fast_risky, slower_safe]))
    assert chosen["split"] == "val" and chosen["decision"] == "point"
    assert chosen["candidate"] == "quantize.onnx_cpu" and chosen["feasible"]
    assert chosen["constraints"] == [pytest.approx(-0.5, abs=1e-4),
                                     pytest.approx((fast_risky["latency_ms"]["p99"] - 5.0) / 5.0, abs=1e-4)]
    over = _entry("quantize.onnx_cpu", 0.2, 30, 10, [0.19, 0.21])  # drop 2 points: over the line on the estimate
    out = outcome_of(_report("confident", [over]))
    assert not out["feasible"] and out["candidate"] == "quantize.onnx_cpu"
    assert out["constraints"][0] == pytest.approx(1.0) and out["why"].startswith("trial-0:quantize.onnx_cpu: ")
    assert "test set" not in out["why"]


def test_the_search_report_lists_every_trial_with_its_status_and_draws_the_front():
    measured = outcome_of(_report("point", [_entry("export.onnx", 0.4, 2, 1, [0.38, 0.45])]))
    over = outcome_of(_report("point", [_entry("export.onnx", 0.1, 35, 5, [0.09, 0.12])]))
    report = {"name": "s", "objective": "fastest_within_red_line", "sampler": "tpe", "pipeline": "base.yaml",
              "shared_stages": ["train"], "threads": 1, "metric": "top1", "max_drop": 1.0, "p99_budget_ms": 5.0,
              "red_line_accuracy": 94.0, "counts": "1 feasible, 1 over the limits, 1 pruned", "reference": measured,
              "final": None, "chosen": None, "trials": [
                  {"trial": 0, "status": "feasible", "params": {"stages.prune.target.macs": 0.3}, "outcome": measured,
                   "note": None, "retry_of": None},
                  {"trial": 1, "status": "over the limits", "params": {"stages.prune.target.macs": 0.1},
                   "outcome": over, "note": None, "retry_of": None},
                  {"trial": 2, "status": "pruned", "params": {"stages.prune.target.macs": 0.05}, "outcome": None,
                   "note": "stopped after prune: …", "retry_of": 0}]}
    rows = trial_table(report)
    assert [r[1] for r in rows] == ["hand-set", "feasible", "over the limits", "pruned"]
    assert rows[2][-1].startswith("trial-0:export.onnx: accuracy drop 3.00 points > red line 1")
    assert rows[3][-1] == "retry of trial 0. stopped after prune: …"
    assert "Nothing chosen: no trial was within the limits." in render_markdown(report)
    assert pareto_plot(report)[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_study_asks_tells_and_recovers_interrupted_trials_without_ray(tmp_path):
    """The Optuna side of the driver (NSGA-II here): trials asked, measured ones told with their
    constraints, a trial left running by a killed search marked interrupted and asked again into
    its own folder, and a changed space refused."""
    optuna = pytest.importorskip("optuna")
    from rich.console import Console

    from compress.search.driver import Search

    path = _write(tmp_path, {"space": {"stages.prune.target.macs": {"low": 0.2, "high": 0.6},
                                       "stages.prune.round_to": [8, 16]}, "sampler": "nsga2", "trials": 3})
    search = Search(load_search(path), Console(file=open(tmp_path / "log.txt", "w")), tmp_path / "s")
    search.dir.mkdir()
    study = search._study(optuna)
    first, spec = search._ask(study)
    assert spec.run_dir.endswith("trials/000") and spec.shared == ["train"] and spec.raw["threads"] >= 1
    assert spec.raw["stages"][1]["target"]["macs"] == first.params["stages.prune.target.macs"]
    good = outcome_of(_report("confident", [_entry("export.onnx", 0.4, 2, 1, [0.38, 0.45])]))
    search._tell_measured(study, optuna, first, {"status": "measured", "outcome": good, "seconds": 1.0})
    second, _ = search._ask(study)  # the search is killed while this one runs
    study = search._study(optuna)  # a new invocation reads the journal
    search._recover(study, optuna)
    retry, retry_spec = search._ask(study)
    assert retry.params == second.params and retry_spec.run_dir.endswith("trials/001")
    assert retry.user_attrs["retry_of"] == second.number
    assert search._finished(study, optuna) == 1  # the interrupted trial does not count
    done = study.trials[0]
    assert done.values == [pytest.approx(0.1), pytest.approx(0.1)] and done.user_attrs["status"] == "feasible"
    assert done.constraints == {"drop": pytest.approx(good["constraints"][0]), "p99": pytest.approx((0.4 - 5.0) / 5)}  # point p99 on validation

    changed = _write(tmp_path, {"space": {"stages.prune.target.macs": {"low": 0.1, "high": 0.6}}, "sampler": "nsga2"})
    with pytest.raises(ConfigError, match="holds a search with another space"):
        Search(load_search(changed), Console(file=open(tmp_path / "log2.txt", "w")), tmp_path / "s")._study(optuna)


def test_a_trial_far_past_the_red_line_after_pruning_is_stopped_with_the_reason():
    from compress.pipeline.manifest import StageRecord
    from compress.search.trial_phases import _hopeless

    pipeline = build_pipeline(copy.deepcopy(FULL), "p.yaml")  # red line 2 points

    def manifest(pruned_val: float) -> Manifest:
        def record(name, kind, metrics):
            return StageRecord(name=name, kind=kind, status="completed", config_hash="", cache_key="",
                               package_version="", started="", metrics=metrics)
        return Manifest(pipeline="tiny", stages={"train": record("train", "train", {"best_val_top1": 95.0}),
                                                 "prune": record("prune", "prune", {"val_top1": pruned_val})})

    stop = _hopeless(manifest(89.0), pipeline, "prune", margin=3.0)  # 6 points down: 4 past the line
    assert stop.reason.startswith("stopped after prune: validation top-1 89.00% against the baseline's 95.00%")
    assert "4.00 past the red line of 2" in stop.reason and stop.drop == pytest.approx(6.0)
    assert _hopeless(manifest(91.0), pipeline, "prune", margin=3.0) is None  # 2 past the line: it may recover
    assert _hopeless(manifest(89.0), pipeline, "prune", margin=5.0) is None
    # a trial that trained its own baseline is judged against the reference run's: 97% there, so 8 points down
    reference = Manifest(pipeline="tiny", stages={"train": manifest(0).stages["train"].model_copy(
        update={"metrics": {"best_val_top1": 97.0}})})
    stop = _hopeless(manifest(89.0), pipeline, "prune", margin=3.0, reference=reference)
    assert "against the baseline's 97.00%" in stop.reason and stop.drop == pytest.approx(8.0)
