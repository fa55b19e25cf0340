"""The runner: cache skips, invalidation, --force/--from/--only, changed inputs, failures."""
from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from compress.errors import ArtifactError, ConfigError, StageError
from compress.pipeline.manifest import Manifest, digest_path
from compress.pipeline.pipeline_file import load_pipeline
from compress.pipeline.runner import RunOptions, Runner


def _two_stage(config: dict) -> dict:
    config["stages"].append({"name": "finetune", "kind": "train", "epochs": 1, "batch_size": 64, "lr": 0.001,
                             "amp": "off", "checkpoint_every": 0})
    return config


def _run(path, run_dir, overrides=(), **options) -> tuple[Manifest, str]:
    out = io.StringIO()
    manifest = Runner(load_pipeline(path, list(overrides)), run_dir, Console(file=out, width=200),
                      RunOptions(**options)).run()
    return manifest, out.getvalue()


def _started(run_dir) -> dict[str, str]:
    return {name: rec.started for name, rec in Manifest.load(run_dir).stages.items()}


def test_second_run_skips_the_cached_stage(tmp_path, tiny_config, write_pipeline):
    path, run_dir = write_pipeline(tiny_config), tmp_path / "run"
    first, log = _run(path, run_dir)
    assert "train: running" in log
    second, log = _run(path, run_dir)
    assert "train: cached, skipped" in log and "train: running" not in log
    assert second.stages["train"].started == first.stages["train"].started


def test_changing_a_setting_reruns_that_stage_and_only_the_ones_after_it(tmp_path, tiny_config, write_pipeline):
    path, run_dir = write_pipeline(_two_stage(tiny_config)), tmp_path / "run"
    _run(path, run_dir)
    before = _started(run_dir)
    _, log = _run(path, run_dir, ["stages.finetune.lr=0.002"])
    assert "train: cached, skipped" in log and "finetune: running" in log
    middle = _started(run_dir)
    assert middle["train"] == before["train"] and middle["finetune"] != before["finetune"]
    _, log = _run(path, run_dir, ["stages.finetune.lr=0.002", "stages.train.lr=0.02"])
    assert "train: running" in log and "finetune: running" in log


def test_force_from_and_only(tmp_path, tiny_config, write_pipeline):
    path, run_dir = write_pipeline(_two_stage(tiny_config)), tmp_path / "run"
    _run(path, run_dir)
    _, log = _run(path, run_dir, force={"train"})
    # train re-ran with the same seed and data, so its model is identical: finetune stays cached.
    assert "train: running" in log and "finetune: cached, skipped" in log
    _, log = _run(path, run_dir, from_stage="finetune")
    assert "train:" not in log and "finetune: running" in log
    _, log = _run(path, run_dir, only="finetune")
    assert "train:" not in log and "finetune: cached, skipped" in log
    with pytest.raises(Exception, match=r"--only nope: no such stage"):
        _run(path, run_dir, only="nope")


def test_a_changed_input_artifact_stops_the_run_and_names_the_fix(tmp_path, tiny_config, write_pipeline):
    path, run_dir = write_pipeline(_two_stage(tiny_config)), tmp_path / "run"
    _run(path, run_dir)
    weights = run_dir / "train" / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(ArtifactError, match=r"needs input train\.model, but .*train/model changed since it was "
                                            r"recorded .*compress run .* --from train"):
        _run(path, run_dir, only="finetune")


def test_manifest_records_artifacts_lineage_and_environment(tmp_path, tiny_config, write_pipeline):
    path, run_dir = write_pipeline(_two_stage(tiny_config)), tmp_path / "run"
    _run(path, run_dir)
    data = json.loads((run_dir / "manifest.json").read_text())
    model = data["artifacts"]["train.model"]
    assert model["kind"] == "torch-model" and model["stage"] == "train"
    assert (model["sha256"], model["size_bytes"]) == digest_path(run_dir / model["path"])
    assert data["artifacts"]["finetune.model"]["made_from"] == ["train.model"]
    stage = data["stages"]["finetune"]
    assert stage["status"] == "completed" and stage["input_digests"] == {"model": model["sha256"]}
    assert {"config_hash", "cache_key", "package_version", "started", "ended", "duration_s"} <= set(stage)
    assert {"test_top1", "best_val_top1", "images_per_s", "peak_memory_mb", "steps"} <= set(stage["metrics"])
    assert {"python", "cpu", "packages"} <= set(data["environment"]) and "torch" in data["environment"]["packages"]
    assert len(data["data"]["split_hash"]) == 64 and data["data"]["sizes"]["test"] == 359
    assert (run_dir / "pipeline.resolved.yaml").is_file()


def test_a_failed_stage_is_recorded_and_never_cached(tmp_path, tiny_config, write_pipeline):
    tiny_config["model"] = {"name": "tests.user_models:ExplodingNet", "args": {"explode_at": 4}}
    tiny_config["stages"][0]["checkpoint_every"] = 1
    path, run_dir = write_pipeline(tiny_config), tmp_path / "run"
    with pytest.raises(StageError, match=r"loss became nan at step 4/20 .*lower lr.*clip_grad_norm.*amp: off"):
        _run(path, run_dir)
    manifest = Manifest.load(run_dir)
    assert manifest.stages["train"].status == "failed"
    assert "loss became nan" in manifest.stages["train"].error
    assert "train.model" not in manifest.artifacts and not (run_dir / "train" / "model").exists()
    # The last good checkpoint (after step 3) is kept.
    assert (run_dir / "train" / "checkpoints" / "last.pt").is_file()
    with pytest.raises(StageError):
        _run(path, run_dir)


def test_a_failed_attempt_keeps_the_completed_record_and_its_cache(tmp_path, tiny_config, write_pipeline):
    path, run_dir = write_pipeline(tiny_config), tmp_path / "run"
    first, _ = _run(path, run_dir)
    model_digest = first.artifacts["train.model"].sha256
    # an argument the builder refuses: not checked before the run (only building the model tells), so the
    # train stage itself fails
    with pytest.raises(ConfigError, match=r"no_such_argument"):
        _run(path, run_dir, ["model.args={width: 4, no_such_argument: 1}"])
    record = Manifest.load(run_dir).stages["train"]
    assert record.status == "completed" and record.last_attempt["status"] == "failed"
    assert "no_such_argument" in record.last_attempt["error"]
    manifest, log = _run(path, run_dir)
    assert "train: cached, skipped" in log and manifest.artifacts["train.model"].sha256 == model_digest


def test_a_weights_file_overwritten_in_place_reruns_the_stage(tmp_path, tiny_config, write_pipeline):
    import torch
    from safetensors.torch import save_file

    from train.models import build_model

    weights = tmp_path / "start.safetensors"

    def write_weights(seed: int) -> None:
        torch.manual_seed(seed)
        state = build_model("resnet20", 10, 1, {"width": 4}).state_dict()
        save_file({k: v.contiguous() for k, v in state.items()}, str(weights))

    write_weights(0)
    tiny_config["model"]["weights"] = str(weights)
    path, run_dir = write_pipeline(tiny_config), tmp_path / "run"
    _run(path, run_dir)
    _, log = _run(path, run_dir)
    assert "train: cached, skipped" in log
    write_weights(1)  # same path, other bytes
    _, log = _run(path, run_dir)
    assert "train: running" in log


def test_edited_user_model_code_reruns_the_stage(tmp_path, tiny_config, write_pipeline, monkeypatch):
    package = tmp_path / "mymodels"
    package.mkdir()
    (package / "__init__.py").write_text("")
    source = (tmp_path / "mymodels" / "nets.py")
    source.write_text("from tests.user_models import SmallNet\n\n\ndef net(num_classes=10, in_channels=1):\n"
                      "    return SmallNet(num_classes, in_channels, width=4)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    tiny_config["model"] = {"name": "mymodels.nets:net"}
    path, run_dir = write_pipeline(tiny_config), tmp_path / "run"
    _run(path, run_dir)
    assert "train: cached, skipped" in _run(path, run_dir)[1]
    source.write_text(source.read_text().replace("width=4", "width=6"))
    assert "train: running" in _run(path, run_dir)[1]


def test_teacher_and_student_weights_enter_the_key_by_content(tmp_path):
    from compress.stages.model_source import model_sources
    from compress.stages.distill_stage import DistillConfig

    weights = tmp_path / "teacher.safetensors"
    weights.write_bytes(b"first")
    cfg = DistillConfig(name="distill", external_teacher={"name": "resnet20", "weights": str(weights)},
                        student={"name": "resnet20", "weights": str(weights)})
    first = model_sources(cfg)
    weights.write_bytes(b"second")
    second = model_sources(cfg)
    assert len(first) == 2 and all("weights" in s for s in first)
    assert all(a["weights"] != b["weights"] for a, b in zip(first, second))


def test_bench_and_export_rerun_on_another_machine_and_each_record_keeps_its_own(tmp_path, tiny_config,
                                                                                write_pipeline, monkeypatch):
    from compress.pipeline import runner as runner_module
    from compress.pipeline.fingerprint import environment

    tiny_config["stages"] += [
        {"name": "export", "kind": "export", "parity": {"samples": 32}},
        {"name": "bench", "kind": "bench", "min_iters": 100, "min_samples": 100, "min_duration_s": 0.0,
         "warmup_iters": 2, "warmup_s": 0.0, "block_iters": 50, "threads": 1, "settle_s": 0.0, "block_s": 0.0}]
    path, run_dir = write_pipeline(tiny_config), tmp_path / "run"
    _run(path, run_dir)
    here = environment()
    monkeypatch.setattr(runner_module, "environment", lambda: {**here, "cpu": "Another CPU 9000"})
    manifest, log = _run(path, run_dir)
    assert "train: cached, skipped" in log and "export: running" in log and "bench: running" in log
    train_env = manifest.environments[manifest.stages["train"].environment]
    bench_env = manifest.environments[manifest.stages["bench"].environment]
    assert train_env["cpu"] == here["cpu"] and bench_env["cpu"] == "Another CPU 9000"
    from compress.pipeline.inspect_view import environment_lines

    lines = environment_lines(manifest)
    assert any(line.startswith("train ran on") and here["cpu"] in line for line in lines)
    assert any(line.startswith("export, bench ran on: Another CPU 9000") for line in lines)


def test_a_stage_whose_output_was_renamed_runs_again_and_says_why(tmp_path, tiny_config, write_pipeline):
    """A run folder from before an output's rename (the export stage's ``engine``, now ``tensorrt``): the completed
    stage is not taken as cached, or a later stage would look for today's name and miss it without a word."""
    from typing import ClassVar, Literal

    from compress.config import StageConfig
    from compress.stages import registry
    from compress.stages.base import Output, Stage, StageResult

    class NoteConfig(StageConfig):
        kind: Literal["note"] = "note"

    class NoteStage(Stage):
        kind, Config, produces = "note", NoteConfig, ("written",)
        renamed: ClassVar[dict[str, str]] = {"old": "written"}
        judges_on_data = False

        def run(self, ctx, inputs):
            with ctx.atomic_output_dir("written") as folder:
                (folder / "note.txt").write_text("made")
            return StageResult(outputs=[Output("written", "note", ctx.stage_dir / "written")])

    tiny_config["stages"].append({"name": "note", "kind": "note"})
    path, run_dir = write_pipeline(tiny_config), tmp_path / "run"
    with registry.registered(NoteStage):
        _run(path, run_dir)
        manifest = Manifest.load(run_dir)  # as an older compress recorded it: the output under its former name
        manifest.artifacts["note.old"] = manifest.artifacts.pop("note.written").model_copy(update={"name": "note.old"})
        manifest.stages["note"].outputs = ["note.old"]
        manifest.save(run_dir)
        manifest, log = _run(path, run_dir)
    assert "train: cached, skipped" in log and "note: running" in log
    assert "note.old is now named note.written" in " ".join(log.split())
    assert manifest.stages["note"].outputs == ["note.written"] and "note.old" not in manifest.artifacts
