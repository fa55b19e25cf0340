"""The `distributed:` section: validation, which stages it reaches, what joins the cache key, who writes."""
from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from compress.config import DistributedSettings
from compress.pipeline.distributed_launch import _root_cause, torchrun_command
from compress.pipeline.manifest import Manifest
from compress.pipeline.pipeline_file import load_pipeline
from compress.pipeline.runner import Runner
from compress.stages import registry
from tests.conftest import run_cli


def test_node_rank_and_endpoint_are_checked():
    with pytest.raises(ValidationError, match="node_rank 2 must be below nnodes 2"):
        DistributedSettings(nnodes=2, node_rank=2)
    with pytest.raises(ValidationError, match="must be host:port"):
        DistributedSettings(rdzv_endpoint="node0")


def test_only_training_stages_take_a_distributed_override(tiny_config, write_pipeline):
    tiny_config["stages"].append({"name": "quantize", "kind": "quantize", "distributed": {"nproc_per_node": 2}})
    result = run_cli("validate", str(write_pipeline(tiny_config)))
    assert result.returncode == 2 and "stages[1].distributed" in result.stderr


def _material(path, overrides=()) -> dict:
    runner = Runner(load_pipeline(path, list(overrides)), path.parent / "run")
    runner.manifest = Manifest(pipeline="tiny")
    cfg = runner.pipeline.stages[0]
    return runner._key_material(cfg, registry.get(cfg.kind), {})


def test_the_cache_key_holds_what_changes_the_weights_not_where_processes_run(tiny_config, write_pipeline):
    path = write_pipeline(tiny_config)
    single = _material(path)
    assert "distributed" not in single  # one process: keys of runs from before stay valid
    two = _material(path, ["distributed.nproc_per_node=2"])
    assert two["distributed"] == {"processes": 2, "sync_batchnorm": None, "lr_scaling": "none"}
    # Two machines with one process each train the same weights as one machine with two.
    elsewhere = _material(path, ["distributed.nproc_per_node=1", "distributed.nnodes=2",
                                 "distributed.rdzv_endpoint=other:1234"])
    assert elsewhere["distributed"] == two["distributed"] and elsewhere["settings"] == two["settings"]
    # A stage's own section wins over the pipeline's.
    stage_wins = _material(path, ["distributed.nproc_per_node=4", "stages.train.distributed={nproc_per_node: 2}"])
    assert stage_wins["distributed"]["processes"] == 2


def test_run_on_another_node_than_zero_is_refused_with_the_join_command(tiny_config, write_pipeline, tmp_path):
    tiny_config["distributed"] = {"nnodes": 2, "node_rank": 1}
    result = run_cli("run", str(write_pipeline(tiny_config)), "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 2
    assert "compress join" in result.stderr and "--stage train --node-rank 1" in result.stderr
    assert not (tmp_path / "run" / "manifest.json").exists()  # refused before anything ran


def test_torchrun_gets_a_private_rendezvous_on_one_machine_and_the_shared_one_on_several(tmp_path):
    spec = tmp_path / "spec.json"
    one = torchrun_command(spec, DistributedSettings(nproc_per_node=2), "id")
    assert "--standalone" in one and "--rdzv-endpoint" not in one and one[-2:] == ["compress.pipeline.rank_worker", str(spec)]
    many = torchrun_command(spec, DistributedSettings(nnodes=3, rdzv_endpoint="n0:29500"), "run-train-1")
    assert many[many.index("--nnodes") + 1] == "3" and many[many.index("--rdzv-endpoint") + 1] == "n0:29500"
    assert many[many.index("--rdzv-id") + 1] == "run-train-1" and "--standalone" not in many


def test_join_without_a_launch_says_what_to_start(tiny_config, write_pipeline, tmp_path):
    result = run_cli("join", str(write_pipeline(tiny_config)), "--stage", "train", "--node-rank", "1",
                     "--run-dir", str(tmp_path / "run"), "--wait", "1")
    assert result.returncode == 3
    assert "no launch of stage 'train'" in result.stderr and "compress run" in result.stderr


def test_join_names_an_unknown_stage(tiny_config, write_pipeline, tmp_path):
    result = run_cli("join", str(write_pipeline(tiny_config)), "--stage", "nope", "--node-rank", "1")
    assert result.returncode == 2 and "no stage named 'nope'" in result.stderr


def _rank_error(folder, rank: int, when: float, message: str, exit_code: int = 3) -> None:
    (folder / "ranks").mkdir(parents=True, exist_ok=True)
    (folder / "ranks" / f"rank-{rank}.json").write_text(json.dumps(
        {"rank": rank, "host": "n1", "time": when, "type": "StageError", "message": message, "exit_code": exit_code}))


_TORCHRUN_SUMMARY = """
Root Cause (first observed failure):
[0]:
  time      : 2026-11-30_19:00:00
  host      : n1
  rank      : 1 (local_rank: 0)
  exitcode  : {code} (pid: 4242)
  error_file: <N/A>
  traceback : {traceback}
"""


def test_the_failure_reported_is_the_rank_torchrun_saw_fail_first_with_its_own_message(tmp_path):
    # rank 0 wrote an error later (its peer vanished); torchrun names rank 1 as the root cause
    _rank_error(tmp_path, 0, 2.0, "connection closed by peer")
    _rank_error(tmp_path, 1, 1.0, "data.path unreadable", exit_code=2)
    tail = _TORCHRUN_SUMMARY.format(code=1, traceback="see error file").splitlines()
    what, bad_input = _root_cause(tail, tmp_path, 4)
    assert what == "rank 1 of 4 on n1: StageError: data.path unreadable" and bad_input


def test_a_rank_killed_by_a_signal_is_named_with_the_signal(tmp_path):
    _rank_error(tmp_path, 0, 2.0, "connection closed by peer")
    tail = _TORCHRUN_SUMMARY.format(code=-9, traceback="Signal 9 (SIGKILL) received by PID 4242").splitlines()
    assert _root_cause(tail, tmp_path, 2) == ("rank 1 of 2 died (Signal 9 (SIGKILL) received by PID 4242)", False)


def test_a_rank_that_only_lost_its_killed_peer_is_not_named_the_cause(tmp_path):
    """On a busy machine gloo reads the reset connection in rank 0 before torchrun sees rank 1's SIGKILL: torchrun
    then names rank 0 first, but the cause is the rank the signal killed."""
    _rank_error(tmp_path, 0, 2.0, "[gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:36241: Connection reset by "
                                  "peer. This is typically caused by a remote worker hanging")
    tail = ("""
Failures:
[1]:
  time      : 2026-11-30_19:00:01
  host      : n1
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 4243)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4243
""" + _TORCHRUN_SUMMARY.format(code=1, traceback="see error file").replace("rank      : 1", "rank      : 0")).splitlines()
    assert _root_cause(tail, tmp_path, 2) == ("rank 1 of 2 died (Signal 9 (SIGKILL) received by PID 4243)", False)
    # a rank that failed on its own (not a lost peer) stays the cause even where another was killed after it
    _rank_error(tmp_path, 0, 2.0, "data.path unreadable", exit_code=2)
    assert _root_cause(tail, tmp_path, 2) == ("rank 0 of 2 on n1: StageError: data.path unreadable", True)


def test_without_torchrun_summary_the_earliest_rank_error_is_the_cause(tmp_path):
    _rank_error(tmp_path, 0, 2.0, "later")
    _rank_error(tmp_path, 3, 1.0, "first")
    assert _root_cause(["something else"], tmp_path, 4)[0] == "rank 3 of 4 on n1: StageError: first"
    assert _root_cause(["rendezvous timed out"], tmp_path / "none", 4)[0] == (
        "torchrun failed before any rank reported (rendezvous timed out)")


def test_only_rank_0_writes_artifacts_the_others_write_to_scratch(tmp_path):
    from rich.console import Console

    from compress.config import PipelineConfig
    from compress.stages.base import StageContext
    from train.distributed import ProcessGroupInfo

    pipeline = PipelineConfig(name="p", data={"name": "digits"}, model={"name": "resnet20"},
                              stages=[{"name": "train", "kind": "train"}])
    written = {}
    for rank in (1, 0):
        ctx = StageContext(run_dir=tmp_path, stage_dir=tmp_path / "train", name="train", pipeline=pipeline,
                           cache_key="k", console=Console(), load_data=lambda: None,
                           group=ProcessGroupInfo(rank=rank, world=2))
        with ctx.atomic_output_dir("model") as folder:
            (folder / "weights").write_text(f"rank {rank}")
            written[rank] = folder
        if rank == 1:
            assert not (tmp_path / "train" / "model").exists() and not written[1].exists()
    assert (tmp_path / "train" / "model" / "weights").read_text() == "rank 0"
