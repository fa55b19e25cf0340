"""`compress search` end to end on Ray: a tiny pipeline, 3 trials on 2 workers, interrupted and
continued, every trial scored on the validation split against the reference baseline, the finalists
measured on the test split, and the chosen configuration rebuilt bit for bit by `compress run` on the
written file."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, run_cli

pytestmark = pytest.mark.slow
optuna = pytest.importorskip("optuna")
pytest.importorskip("ray")

FAST_BENCH = {"name": "bench", "kind": "bench", "min_iters": 200, "min_samples": 200, "min_duration_s": 0.0,
              "warmup_iters": 5, "warmup_s": 0.0, "block_iters": 20, "threads": 1, "settle_s": 0.0, "block_s": 0.0,
              "profile_iters": 0, "runtimes": ["onnxruntime"]}
TINY_FULL = {
    "name": "tiny-full", "seed": 0, "data": {"name": "digits"}, "model": {"name": "resnet20", "args": {"width": 8}},
    "red_line": {"metric": "top1", "max_drop": 6.0}, "latency": {"p99_budget_ms": 50.0}, "gate": {"decision": "point"},
    "stages": [
        {"name": "train", "kind": "train", "epochs": 10, "batch_size": 64, "optimizer": "adamw", "lr": 3e-3,
         "schedule": "wsd", "warmup_epochs": 0.5, "amp": "off", "checkpoint_every": 0},
        {"name": "prune", "kind": "prune", "target": {"macs": 0.7}, "deployed_latency": {"enabled": False},
         "sparsity": {"epochs": 1, "batch_size": 64, "lr": 5e-3, "amp": "off", "checkpoint_every": 0},
         "finetune": {"epochs": 4, "batch_size": 64, "optimizer": "adamw", "lr": 3e-3, "amp": "off",
                      "checkpoint_every": 0}},
        {"name": "quantize", "kind": "quantize", "calibration": {"method": "minmax", "samples": 128},
         "fallback": {"enabled": False}, "qat": {"epochs": 1}},
        {"name": "export", "kind": "export", "formats": ["onnx"], "parity": {"samples": 32}},
        FAST_BENCH,
    ]}
SEARCH = {"name": "tiny-search", "pipeline": "pipeline.yaml", "trials": 3, "parallel": 2, "threads_per_trial": 1,
          "finalists": 2,
          "space": {"stages.prune.target.macs": {"low": 0.3, "high": 0.9},
                    "stages.quantize.calibration.method": ["minmax", "percentile"]}}
MEASURED = re.compile(r"search: trial (\d+): \S+ p99 ")


def _start(search_file, run_dir):
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen([sys.executable, "-m", "compress", "search", str(search_file), "--run-dir", str(run_dir)],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _interrupt_after_first_measured(proc: subprocess.Popen) -> str:
    """Read the search's log line by line until a trial's measurement is said (or the search ends), then send
    Ctrl-C and read the rest: what a user pressing Ctrl-C after that line would see. No clock is read; the suite's
    timeout guards a search that hangs."""
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if MEASURED.search(line):
            break
    proc.send_signal(signal.SIGINT)
    lines.append(proc.stderr.read())
    proc.wait()
    return "".join(lines)


def _deployables(run_dir):
    manifest = json.loads((run_dir / "manifest.json").read_text())
    # the stages' files: a bench's own (the baseline exported as it is) is made where a bench runs, not in a trial
    benches = {name for name, st in manifest["stages"].items() if st["kind"] == "bench"}
    return {name: a["sha256"] for name, a in manifest["artifacts"].items()
            if a["kind"] in ("torch-model", "onnx") and a["stage"] not in benches}


def test_a_search_runs_on_ray_continues_after_an_interruption_and_its_choice_reproduces(tmp_path):
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(TINY_FULL, sort_keys=False))
    search_file = tmp_path / "search.yaml"
    search_file.write_text(yaml.safe_dump(SEARCH, sort_keys=False))
    run_dir = tmp_path / "search"

    proc = _start(search_file, run_dir)
    first_log = _interrupt_after_first_measured(proc)
    assert proc.returncode == 130, first_log[-3000:]
    assert "interrupted (Ctrl-C): the finished trials are kept in" in first_log
    assert "continue with: compress search" in first_log
    measured_first = {int(n) for n in MEASURED.findall(first_log)}
    assert measured_first
    def scored(n: int) -> Path:
        return run_dir / "trials" / f"{n:03d}" / "validation-bench" / "report.json"

    ended = {n: scored(n).stat().st_mtime_ns for n in measured_first}

    second = run_cli("search", str(search_file), "--run-dir", str(run_dir), timeout=900)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "finished before" in second.stderr
    report = json.loads((run_dir / "report" / "search.json").read_text())
    statuses = {t["trial"]: t["status"] for t in report["trials"]}
    finished = [n for n, s in statuses.items() if s != "interrupted"]
    assert len(finished) == 3, statuses
    for n in measured_first:  # measured before the interruption: kept, not measured again
        assert statuses[n] in ("feasible", "over the limits")
        assert scored(n).stat().st_mtime_ns == ended[n]
    for t in report["trials"]:  # scored on validation, against the reference run's baseline
        if t["status"] in ("feasible", "over the limits"):
            assert t["outcome"]["split"] == "val" and t["outcome"]["p99_ratio"] > 0
            val = json.loads((run_dir / t["dir"] / "validation-bench" / "report.json").read_text())  # a retry: its dir
            assert val["split"] == "val" and val["contenders"][0]["run_dir"] == str(run_dir / "reference")
            assert not (run_dir / t["dir"] / "bench").exists()  # the test split is left for the final bench
    for t in report["trials"]:
        if t["status"] == "interrupted":  # asked again with the same settings, into the same folder
            retry = next(r for r in report["trials"] if r.get("retry_of") == t["trial"])
            assert retry["params"] == t["params"] and retry["dir"] == t["dir"]
    assert report["reference"]["feasible"] and report["shared_stages"] == ["train"]
    for folder in (run_dir / "trials").iterdir():  # the baseline trained once: every trial links the reference's
        ref_model = next((run_dir / "reference" / "train" / "model").glob("*.safetensors"))
        assert os.stat(folder / "train" / "model" / ref_model.name).st_ino == os.stat(ref_model).st_ino

    final = report["final"]
    assert final["split"] == "test" and [c["role"] for c in final["contenders"]][:2] == ["baseline", "hand-set"]
    assert [c["trial"] for c in final["contenders"][2:]] == final["finalists"]
    assert final["gate"]["correction"]["method"] == "none"  # the point rule: nothing to correct, and it says so
    chosen = report["chosen"]
    assert chosen is not None and final["chosen"]["artifact"] == chosen["artifact"]
    assert final["chosen"]["trial"] == chosen["trial"]
    assert set(final["chosen_vs_hand_set"]["p99"]) >= {"ratio", "ci", "verdict"}
    for name in ("search.md", "search.html", "pareto.png"):
        assert (run_dir / "report" / name).stat().st_size > 0

    third = run_cli("search", str(search_file), "--run-dir", str(run_dir), timeout=600)  # nothing left to do
    assert third.returncode == 0 and "that bench stands" in third.stderr, third.stderr[-3000:]
    assert json.loads((run_dir / "report" / "search.json").read_text())["final"]["folder"] == final["folder"]

    rebuilt = tmp_path / "rebuilt"
    again = run_cli("run", chosen["pipeline"], "--run-dir", str(rebuilt), timeout=600)
    assert again.returncode in (0, 1), again.stderr[-3000:]
    trial_artifacts = _deployables(run_dir / chosen["dir"])
    assert trial_artifacts and _deployables(rebuilt) == trial_artifacts
