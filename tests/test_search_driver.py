"""The search's bookkeeping without Ray: stopped trials told as infeasible, the search keyed on the
hand-set pipeline's limits, what a space may vary, whom a trial is judged against, and the report's
accuracy column."""
from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest
from rich.console import Console

from compress.errors import ConfigError
from compress.pipeline.manifest import ArtifactRecord, Manifest
from compress.pipeline.pipeline_file import build_pipeline
from compress.search.contenders import BASELINE, HAND_SET, TRIAL, Contender
from compress.stages.measurement import limits_of
from serve_bench.limits import Limits
from compress.search.search_report import final_table
from compress.search.settings import load_search
from compress.search.split_bench import deployables, entry_of
from compress.search.trial_phases import TrialSpec, contenders_of
from tests.report_entries import as_report
from tests.test_search_plan import FULL, _write

optuna = pytest.importorskip("optuna")


def _search(tmp_path, search: dict, pipeline: dict | None = None, folder: str = "s"):
    from compress.search.driver import Search

    plan = load_search(_write(tmp_path, search, pipeline))
    out = tmp_path / folder
    out.mkdir(exist_ok=True)
    return Search(plan, Console(file=open(tmp_path / f"{folder}.log", "a")), out)


SPACE = {"space": {"stages.prune.target.macs": {"low": 0.2, "high": 0.6}}, "trials": 4}


def test_a_trial_stopped_early_is_told_as_infeasible_by_its_relative_miss_and_ranks_below_a_measured_one(tmp_path):
    """TPE puts a PRUNED trial without constraints among the good ones when few trials are done (a pruned
    trial without intermediate values scores like the best) and copies it. Told with its miss, it ranks with
    the infeasible trials, behind one that missed the red line by less."""
    from optuna.samplers._tpe.sampler import _split_trials

    search = _search(tmp_path, SPACE)  # red line 2 points
    study = search._study(optuna)
    fine, _ = search._ask(study)
    study.tell(fine, 0.5)
    near, _ = search._ask(study)
    near.set_constraint("drop", 0.2)  # a measured trial 0.4 points past the line
    near.set_constraint("p99", -0.5)
    study.tell(near, 0.3)
    stopped, _ = search._ask(study)
    search._tell_stopped(study, optuna, stopped, {"status": "pruned", "reason": "stopped after prune: …",
                                                  "drop": 6.0, "seconds": 1.0})
    frozen = study.trials[stopped.number]
    assert frozen.state == optuna.trial.TrialState.PRUNED
    assert frozen.constraints == {"drop": pytest.approx((6.0 - 2.0) / 2.0), "p99": 0.0}
    below, above = _split_trials(study, study.trials, n_below=2)
    assert [t.number for t in below] == [fine.number, near.number]
    assert [t.number for t in above] == [stopped.number]


def test_misses_are_relative_to_their_limits():
    limits = Limits(metric="top1", max_drop=1.0, p99_budget_ms=20.0, decision="confident")
    assert limits.drop_miss(1.5) == pytest.approx(0.5)  # half a red line past it
    assert limits.p99_miss(22.0) == pytest.approx(0.1)  # a tenth of the budget past it, not "2.0"
    assert limits.p99_miss(10.0) < 0 and limits.drop_miss(0.2) < 0
    assert Limits(metric="top1", max_drop=0.0, p99_budget_ms=None, decision="point").drop_miss(0.3) == pytest.approx(0.3)  # a red line of 0: per point
    assert Limits(metric="top1", max_drop=0.0, p99_budget_ms=None, decision="point").p99_miss(99.0) == 0.0  # no budget, no miss


def test_a_search_directory_judged_under_other_limits_is_not_continued(tmp_path):
    search = _search(tmp_path, SPACE)
    study = search._study(optuna)
    trial, _ = search._ask(study)
    study.tell(trial, 0.5)
    tighter = {**copy.deepcopy(FULL), "red_line": {"metric": "top1", "max_drop": 0.5}}
    with pytest.raises(ConfigError) as err:
        _search(tmp_path, SPACE, tighter)._study(optuna)
    assert "limits" in str(err.value) and '"max_drop": 0.5' in str(err.value) and '"max_drop": 2.0' in str(err.value)
    budget = {**copy.deepcopy(FULL), "latency": {"p99_budget_ms": 7.0}}
    with pytest.raises(ConfigError, match="p99_budget_ms"):
        _search(tmp_path, SPACE, budget)._study(optuna)


def test_a_final_bench_judged_under_other_limits_is_measured_again(tmp_path, monkeypatch):
    from compress.search import finals
    from compress.search.finals import measured_before

    stands = {"now": True}  # what the final bench's own key says: same files, settings, images and machine
    monkeypatch.setattr(finals, "contenders_for", lambda search, best, reference: [])
    monkeypatch.setattr(finals, "still_stands", lambda *args: stands["now"])
    search = _search(tmp_path, SPACE)
    (search.dir / "final-1").mkdir()
    (search.dir / "report").mkdir()
    judged_at = Limits(metric="top1", max_drop=1.0, p99_budget_ms=None, decision="confident")
    final = {"folder": "final-1", "finalists": [3, 1], "limits": judged_at.as_dict(), "entries": []}
    (search.dir / "report" / "search.json").write_text(json.dumps({"final": final}))
    best = [SimpleNamespace(number=3), SimpleNamespace(number=1)]
    search.limits = judged_at
    assert measured_before(search, best, {}) == final  # nothing changed: that bench stands
    search.limits = Limits(metric="top1", max_drop=0.5, p99_budget_ms=None, decision="confident")  # red_line.max_drop edited 1.0 → 0.5
    assert measured_before(search, best, {}) is None
    search.limits = judged_at
    assert measured_before(search, best[:1], {}) is None  # other finalists
    stands["now"] = False  # a re-made reference file, edited bench settings, another machine
    assert measured_before(search, best, {}) is None


@pytest.mark.parametrize("path, value, message", [
    ("red_line.max_drop", [0.5, 1.0], r"the limits \(red_line, latency.p99_budget_ms, gate\) are what every trial"),
    ("latency.p99_budget_ms", [5.0, 10.0], "the limits"),
    ("gate.decision", ["point", "confident"], "the limits"),
    ("data.image_size", [8, 16], "judged against the reference baseline on the reference's images"),
])
def test_a_space_may_not_vary_the_limits_or_the_images(tmp_path, path, value, message):
    with pytest.raises(ConfigError, match=message):
        load_search(_write(tmp_path, {"space": {path: value}}))


def test_a_space_may_vary_where_images_are_decoded_and_settings_upstream_of_the_baseline(tmp_path):
    plan = load_search(_write(tmp_path, {"space": {"data.decode_workers": [1, 2], "seed": [0, 1]}}))
    assert set(plan.settings.space) == {"data.decode_workers", "seed"}


def _record(name: str, kind: str = "torch-model") -> ArtifactRecord:
    return ArtifactRecord(name=name, kind=kind, path=name.replace(".", "/"), sha256="0" * 64, size_bytes=1,
                          stage=name.split(".")[0])


def test_a_trial_that_trains_its_own_model_is_judged_against_the_reference_baseline(tmp_path):
    """A space reaching the train stage (here: the seed) gives every trial its own trained model; the
    trial's bench still takes the reference run's baseline, and never the trial's own model as a candidate."""
    pipeline = build_pipeline(copy.deepcopy(FULL), "p.yaml")
    reference, trial = tmp_path / "reference", tmp_path / "trials" / "003"
    for folder, names in ((reference, ["train.model"]),
                          (trial, ["train.model", "prune.model", "quantize.onnx_cpu"])):
        folder.mkdir(parents=True)
        Manifest(pipeline="p", artifacts={n: _record(n, "onnx" if "onnx" in n else "torch-model")
                                          for n in names}).save(folder)
    # quantize.onnx_openvino too (made where OpenVINO runs); this trial's manifest has no such file
    assert deployables(pipeline) == ["train.model", "prune.model", "quantize.onnx_cpu", "quantize.onnx_openvino"]
    spec = TrialSpec(label="3", run_dir=str(trial), raw={}, source="p.yaml", reference=str(reference), shared=[],
                     early_stop_after=None, hopeless_margin=3.0, limits={}, environment={}, number=3)
    contenders = contenders_of(spec, pipeline)
    assert contenders[0] == Contender(BASELINE, "train.model", str(reference))
    assert [c.name for c in contenders[1:]] == ["trial-3:prune.model", "trial-3:quantize.onnx_cpu"]
    assert all(c.run_dir == str(trial) and c.trial == 3 for c in contenders[1:])
    own = contenders_of(TrialSpec(**{**spec.as_dict(), "reference": None, "run_dir": str(reference),
                                     "number": None}), pipeline)
    assert own == [Contender(BASELINE, "train.model", str(reference))]  # the reference made nothing else here


def test_contenders_are_identities_not_names_to_parse():
    trial = Contender(TRIAL, "quantize.onnx_cpu", "runs/s/trials/012", trial=12)
    assert trial.name == "trial-12:quantize.onnx_cpu" and trial.label == "trial-12"
    assert Contender.from_dict(json.loads(json.dumps(trial.as_dict()))) == trial
    assert Contender(HAND_SET, "export.onnx", "runs/s/reference").name == "hand-set:export.onnx"
    with pytest.raises(ValueError, match="needs trial number"):
        Contender(TRIAL, "export.onnx", "x")
    with pytest.raises(ValueError, match="has no trial number"):
        Contender(HAND_SET, "export.onnx", "x", trial=1)
    # an entry is found by the identity stored beside it, whatever its display name says
    report = as_report({"artifacts": [{"name": "renamed for display", "contender": trial.as_dict()}]})
    assert entry_of(report, trial).name == "renamed for display"
    with pytest.raises(KeyError):
        entry_of(report, Contender(TRIAL, "quantize.onnx_cpu", "runs/s/trials/012", trial=13))


def test_the_final_tables_accuracy_column_is_the_red_lines_metric():
    """Under a top-5 red line the drop is in top-5 points, and the accuracy beside it must be top-5 too."""
    entry = {"name": "trial-1:export.onnx", "macs": 10_000_000, "accuracy": {"top1": 71.5, "top5": 90.25},
             "accuracy_ci": {"top1": [70.0, 73.0], "top5": [89.0, 91.5]}, "drop": 0.4, "drop_ci": [0.1, 0.7],
             "p50": 1.0, "p50_ci": [0.9, 1.1], "p99": 2.0, "p99_ci": [1.8, 2.2],
             "latency_ratio": {"p99": {"ratio": 0.5, "ci": [0.45, 0.55]}}}
    row = final_table({"entries": [entry]}, "top5")[0]
    assert row[2] == "90.25 [89.00, 91.50]" and row[-1] == "×0.500 [0.450, 0.550]"
    assert final_table({"entries": [entry]}, "top1")[0][2] == "71.50 [70.00, 73.00]"



def test_an_edited_target_rate_is_measured_again_and_does_not_continue_a_search(tmp_path):
    """The traffic a bench ran at is part of what its figures mean: a cached split bench and a stored study
    stand for their ``latency`` section (scenario, arrival rate) and ``nms`` too, not only the limits."""
    from compress.search.split_bench import _key

    at_300 = {**copy.deepcopy(FULL), "latency": {"p99_budget_ms": 10.0, "scenario": "server", "target_qps": 300}}
    at_500 = {**copy.deepcopy(FULL), "latency": {"p99_budget_ms": 10.0, "scenario": "server", "target_qps": 500}}
    search = _search(tmp_path, SPACE, at_300)
    search._study(optuna)
    with pytest.raises(ConfigError, match="target_qps"):
        _search(tmp_path, SPACE, at_500)._study(optuna)

    def key(pipeline: dict) -> str:
        plan = load_search(_write(tmp_path, SPACE, pipeline))
        cfg = SimpleNamespace(model_dump=lambda **_: {"kind": "bench"}, batch_size=None, runtimes=["onnxruntime"],
                              device="cpu", name="bench")
        contender = SimpleNamespace(as_dict=lambda: {"run": "r", "artifact": "a"})
        return _key([SimpleNamespace(sha256="0" * 64)], [contender], cfg, SimpleNamespace(digest="d"),
                    limits_of(plan.base.config), plan.base)

    assert key(at_300) == key(copy.deepcopy(at_300)) and key(at_300) != key(at_500)


def test_the_reference_on_another_runtime_never_stands_as_a_trials_candidate():
    """A copy of the reference baseline measured on a second runtime (its drop against itself about 0, and faster)
    must not become the trial's candidate: every trial would score the baseline's figures."""
    from compress.search.objective import outcome_of
    from tests.search_entries import entry, split_report

    copy_of_baseline = entry("train.model", 2.0, 0, 0, [1.9, 2.1], role=BASELINE)
    copy_of_baseline["name"] += "@openvino"
    copy_of_baseline["contender"]["runtime"] = "openvino"
    trial = entry("export.onnx", 3.0, 1, 1, [2.9, 3.1])
    trial["contender"]["runtime"] = "onnxruntime"
    outcome = outcome_of(split_report("point", [copy_of_baseline, trial]))
    assert (outcome["candidate"], outcome["runtime"], outcome["p99_ratio"]) == ("export.onnx", "onnxruntime", 0.75)


def test_a_trials_candidate_is_named_with_the_runtime_its_figures_are_from():
    from compress.search.objective import candidate_name

    assert candidate_name({"candidate": "export.onnx", "runtime": "openvino"}) == "export.onnx@openvino"
    assert candidate_name({"candidate": "export.onnx", "runtime": "onnxruntime"}) == "export.onnx"
    assert candidate_name({"candidate": "train.model", "runtime": None}) == "train.model"
    assert candidate_name({"candidate": None}) == "—"
