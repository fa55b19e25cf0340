"""A trial's measure phase on real files: its deployable artifacts measured beside the reference run's
baseline on the validation split, never the test split, the figures cached for a resumed trial."""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from compress.pipeline.manifest import Manifest
from compress.pipeline.pipeline_data import load_section
from compress.pipeline.pipeline_file import build_pipeline
from compress.search.contenders import BASELINE
from compress.stages.measurement import limits_of
from compress.search.measure_env import MeasurementEnvironment
from compress.search.split_bench import VALIDATION_BENCH, split_set
from compress.search.trial_phases import TrialSpec, build, measure
from serve_bench.runners import usable_onnx_runtimes
from tests.conftest import TINY

FAST_BENCH = {"name": "bench", "kind": "bench", "min_iters": 60, "min_samples": 50, "min_duration_s": 0.0,
              "warmup_iters": 2, "warmup_s": 0.0, "block_iters": 20, "threads": 1, "settle_s": 0.0, "block_s": 0.0,
              "profile_iters": 0}  # every usable runtime, as the bench stage: a trial is scored where it would ship
PIPELINE = {**copy.deepcopy(TINY), "red_line": {"metric": "top1", "max_drop": 50.0}, "gate": {"decision": "point"},
            "stages": [*copy.deepcopy(TINY["stages"]),
                       {"name": "export", "kind": "export", "formats": ["onnx"], "parity": {"samples": 32}},
                       FAST_BENCH]}


def _spec(raw: dict, run_dir: Path, reference: Path | None, number: int | None) -> TrialSpec:
    pipeline = build_pipeline(copy.deepcopy(PIPELINE), "p.yaml")
    return TrialSpec(label=str(number) if number is not None else "reference", run_dir=str(run_dir), raw=raw,
                     source="p.yaml", reference=None if reference is None else str(reference), shared=[],
                     early_stop_after=None, hopeless_margin=3.0, limits=limits_of(pipeline.config).as_dict(),
                     environment=MeasurementEnvironment.here().as_dict(), number=number)


@pytest.mark.slow  # trains two tiny models and measures them: about 20 s on 2 cores
@pytest.mark.openvino
def test_a_trial_that_trains_its_own_model_is_measured_on_validation_against_the_reference_baseline(tmp_path):
    reference, trial = tmp_path / "reference", tmp_path / "trials" / "000"
    ref_spec = _spec(copy.deepcopy(PIPELINE), reference, None, None)
    assert build(ref_spec.as_dict())["status"] == "built"
    own_seed = {**copy.deepcopy(PIPELINE), "seed": 1}  # a space reaching the train stage: the trial trains again
    spec = _spec(own_seed, trial, reference, 0)
    assert build(spec.as_dict())["status"] == "built"
    ref_model, own_model = (Manifest.load(d).artifacts["train.model"].sha256 for d in (reference, trial))
    assert ref_model != own_model

    result = measure(spec.as_dict())
    assert result["status"] == "measured", result
    report = json.loads(Path(result["report"]).read_text())
    assert report["split"] == "val" and report["data"]["split"] == "val"
    data = load_section(build_pipeline(copy.deepcopy(PIPELINE), "p.yaml").config.data, "p.yaml")
    assert report["data"]["test_digest"] == split_set(data, "val").digest != split_set(data, "test").digest
    base = next(e for e in report["artifacts"] if e["name"] == report["baseline"])
    assert base["contender"] == {"role": BASELINE, "artifact": "train.model", "run_dir": str(reference), "trial": None,
                                 "runtime": None}
    runtimes = usable_onnx_runtimes()  # the file on each, as the bench stage measures it
    assert [e["name"] for e in report["artifacts"]] == ["baseline:train.model"] + [
        "trial-0:export.onnx" + ("" if r == "onnxruntime" else f"@{r}") for r in runtimes]
    assert [e["contender"]["runtime"] for e in report["artifacts"][1:]] == runtimes
    outcome = result["outcome"]
    assert outcome["split"] == "val" and outcome["candidate"] == "export.onnx" and outcome["runtime"] in runtimes
    scored = next(e for e in report["artifacts"] if e["contender"].get("runtime") == outcome["runtime"])
    assert outcome["p99_ratio"] == pytest.approx(scored["latency_ratio"]["p99"]["ratio"])
    assert not (trial / "bench").exists()  # the pipeline's own (test-split) bench stage did not run
    assert result["environment"] == MeasurementEnvironment.here().on_this_machine().as_dict()

    stamp = os.stat(trial / VALIDATION_BENCH / "report.json").st_mtime_ns
    again = measure(spec.as_dict())  # a resumed trial: nothing it measured changed
    assert again["outcome"] == outcome and os.stat(trial / VALIDATION_BENCH / "report.json").st_mtime_ns == stamp
