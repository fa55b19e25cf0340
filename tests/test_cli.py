"""The command line: exit codes, messages without tracebacks, inspect, and one stage run alone."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from compress.cli import main
from tests.conftest import ROOT, run_cli


def test_run_then_inspect(tmp_path, tiny_config, write_pipeline, capsys):
    run_dir = tmp_path / "run"
    assert main(["run", str(write_pipeline(tiny_config)), "--run-dir", str(run_dir)]) == 0
    capsys.readouterr()
    assert main(["inspect", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "train.model" in out and "completed" in out and "test_top1=" in out and "torch-model" in out
    (run_dir / "train" / "model" / "model.json").write_text("{}")
    assert main(["inspect", str(run_dir)]) == 0
    assert "(changed)" in capsys.readouterr().out


def test_exit_codes_and_clean_messages(tmp_path, tiny_config, write_pipeline):
    bad = dict(tiny_config, data={"name": "imagefolder", "path": str(tmp_path / "no-such-folder")})
    result = run_cli("run", str(write_pipeline(bad, "bad_data.yaml")), "--run-dir", str(tmp_path / "a"))
    assert result.returncode == 2
    assert "data.path: imagefolder:" in result.stderr and "is not a folder" in result.stderr
    assert "Traceback" not in result.stderr

    exploding = dict(tiny_config, model={"name": "tests.user_models:ExplodingNet"})
    result = run_cli("run", str(write_pipeline(exploding, "nan.yaml")), "--run-dir", str(tmp_path / "b"))
    assert result.returncode == 3 and "loss became nan" in result.stderr and "Traceback" not in result.stderr

    result = run_cli("--debug", "run", str(write_pipeline(exploding, "nan.yaml")), "--run-dir", str(tmp_path / "b"))
    assert result.returncode == 3 and "Traceback" in result.stderr

    wrong_weights = dict(tiny_config, model={"name": "resnet20", "weights": str(tmp_path / "missing.pt")})
    result = run_cli("run", str(write_pipeline(wrong_weights, "w.yaml")), "--run-dir", str(tmp_path / "c"))
    assert result.returncode == 2 and "model.weights:" in result.stderr and "does not exist" in result.stderr

    assert main(["inspect", str(tmp_path)]) == 2


def test_bad_input_leaves_an_existing_run_untouched(tmp_path, tiny_config, write_pipeline):
    run_dir = tmp_path / "run"
    path = write_pipeline(tiny_config)
    assert main(["run", str(path), "--run-dir", str(run_dir)]) == 0
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    assert main(["run", str(path), "--run-dir", str(run_dir), "stages.train.epochs=0"]) == 2
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before


def test_stage_command_runs_one_stage_alone_on_a_given_model(tmp_path, tiny_config, write_pipeline):
    first = tmp_path / "first"
    assert main(["run", str(write_pipeline(tiny_config)), "--run-dir", str(first)]) == 0
    alone = tmp_path / "alone"
    code = main(["stage", "train", "--data", "digits", "--model", "resnet20", "--run-dir", str(alone),
                 "--input", f"model={first / 'train' / 'model'}", "epochs=1", "amp=off", "checkpoint_every=0",
                 "model.args={width: 4}"])
    assert code == 0
    manifest = json.loads((alone / "manifest.json").read_text())
    assert manifest["artifacts"]["external.model"]["kind"] == "torch-model"
    assert manifest["artifacts"]["train.model"]["made_from"] == ["external.model"]
    assert manifest["stages"]["train"]["metrics"]["steps"] == 1294 // 128  # default batch_size
    assert main(["stage", "train", "--input", "model"]) == 2


def test_help_does_not_import_torch():
    code = "import sys, compress.cli; compress.cli.build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_stage_command_takes_data_and_model_from_a_pipeline_file(tmp_path, tiny_config, write_pipeline):
    run_dir = tmp_path / "alone"
    code = main(["stage", "train", "--pipeline", str(write_pipeline(tiny_config)), "--run-dir", str(run_dir),
                 "epochs=1", "amp=off", "batch_size=64", "seed=2"])
    assert code == 0
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["data"]["name"] == "digits" and manifest["artifacts"]["train.model"]["made_from"] == []
    assert manifest["stages"]["train"]["metrics"]["params"] == 17_462  # resnet20 at width 4, from the file
    resolved = (run_dir / "pipeline.resolved.yaml").read_text()
    assert "seed: 2" in resolved


def test_sigterm_is_reported_as_such_even_when_a_library_re_raises_a_plain_keyboard_interrupt():
    """Ray's get catches the interrupt and raises its own KeyboardInterrupt: the exit code must still say SIGTERM."""
    import os
    import signal

    from compress.pipeline.interruption import Terminated, interruptible as _interruptible
    from compress.errors import RunInterrupted

    def run():
        try:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler raises at the next bytecode
        except Terminated:
            raise KeyboardInterrupt() from None

    with pytest.raises(RunInterrupted) as err:
        _interruptible(run, lambda: "kept", "go on")
    assert err.value.exit_code == 143 and str(err.value) == "terminated (SIGTERM): kept; go on"

    def ctrl_c():
        raise KeyboardInterrupt()

    with pytest.raises(RunInterrupted) as err:  # the next run starts clean
        _interruptible(ctrl_c, lambda: "kept", "go on")
    assert err.value.exit_code == 130


def test_stage_overrides_go_where_the_schemas_put_them():
    """``compress stage`` routes each key=value by the schemas: the stage's own field, else a pipeline-file field,
    else the stage (which refuses it by name); a written-out ``stages.KIND.`` path is kept."""
    from compress.commands.pipeline_runs import stage_scoped

    assert stage_scoped("threads=2", "bench") == "stages.bench.threads=2"  # the bench's own timing threads
    assert stage_scoped("threads=2", "train") == "threads=2"  # train has none: the pipeline's torch threads
    for pipeline_level in ("nms.iou=0.5", "task=detection", "tracking.uri=file:runs/mlruns", "seed=3",
                           "red_line.max_drop=1", "latency.p99_budget_ms=5"):
        assert stage_scoped(pipeline_level, "prune") == pipeline_level
    assert stage_scoped("epochs=3", "train") == "stages.train.epochs=3"
    assert stage_scoped("stages.train.epochs=3", "train") == "stages.train.epochs=3"
    assert stage_scoped("bogus=1", "train") == "stages.train.bogus=1"  # refused by the stage, by name
