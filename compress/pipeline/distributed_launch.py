"""One stage on several processes: launched through torchrun, waited for, its result read back.

The rest of the pipeline stays one process. For a stage whose ``distributed:`` settings ask for
more than one process, the runner writes a launch spec into the stage folder and runs
``python -m torch.distributed.run … -m compress.pipeline.rank_worker SPEC`` as a subprocess;
every other machine runs ``compress join``, which reads the same spec from the shared run
directory and starts its own torchrun. Rank 0 (wherever it lands) writes the artifacts and a
``result.json`` the runner registers. A failure is reported with the rank that failed first, as
torchrun saw it, and that rank's own message.
"""
from __future__ import annotations

import collections
import json
import logging
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from compress.config import DistributedSettings
from compress.errors import ConfigError, StageError, StageInputError
from compress.pipeline.rank_worker import RANKS_DIR, RESULT_FILE, SPEC_FILE
from compress.stages.base import InputArtifact, Output, StageContext, StageResult
from train.atomic_io import atomic_write_text

logger = logging.getLogger(__name__)

LAUNCH_DIR = "launch"


def rendezvous_id(settings: DistributedSettings, pipeline: str, stage: str, attempt: str) -> str:
    return settings.rdzv_id or re.sub(r"[^A-Za-z0-9_-]", "-", f"{pipeline}-{stage}-{attempt}")


def torchrun_command(spec_path: Path, settings: DistributedSettings, rdzv_id: str) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(settings.nproc_per_node),
           "--max-restarts", str(settings.max_restarts)]
    if settings.nnodes == 1:  # a private rendezvous on a free port: two runs on one machine never collide
        cmd += ["--standalone", "--nnodes", "1"]
    else:
        # The c10d rendezvous numbers the machines itself (torchrun ignores --node-rank with it); ranks
        # follow the order they joined, so rank 0 may be on any machine: it writes to the shared run directory.
        cmd += ["--nnodes", str(settings.nnodes), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", settings.rdzv_endpoint, "--rdzv-id", rdzv_id,
                "--rdzv-conf", f"join_timeout={int(settings.join_timeout_s)}"]
    return cmd + ["-m", "compress.pipeline.rank_worker", str(spec_path)]


def _pump(stream, sink, tail: collections.deque) -> None:
    """Pass torchrun's (and its workers') stderr through, keeping the end for the failure report."""
    for line in stream:
        sink.write(line)
        sink.flush()
        tail.append(line.rstrip("\n"))


def _run_torchrun(cmd: list[str]) -> tuple[int, list[str]]:
    tail: collections.deque = collections.deque(maxlen=400)
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, errors="replace", bufsize=1)
    reader = threading.Thread(target=_pump, args=(proc.stderr, sys.stderr, tail), daemon=True)
    reader.start()
    try:
        code = proc.wait()
    except BaseException:  # Ctrl-C or SIGTERM of the runner: torchrun stops its workers, then exits
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    finally:
        reader.join(timeout=5)
    return code, list(tail)


# what a rank raises when another rank of its group vanished (gloo's TCP transport, NCCL, the c10d store)
PEER_LOST = re.compile(r"connection (reset|closed) by peer|remote process exited|broken pipe|socket closed",
                       re.IGNORECASE)


def _killed_ranks(text: str) -> dict[int, str]:
    """Ranks of torchrun's failure summary that a signal ended: rank → how (its traceback line)."""
    killed = {}
    for block in re.split(r"\n\s*\[\d+\]:\s*\n", text)[1:]:
        rank, code = re.search(r"rank\s*:\s*(\d+)", block), re.search(r"exitcode\s*:\s*(-?\d+)", block)
        how = re.search(r"traceback\s*:\s*(Signal.*)", block)
        if rank and (how or (code and int(code.group(1)) < 0)):
            killed[int(rank.group(1))] = how.group(1).strip() if how else f"killed by signal {-int(code.group(1))}"
    return killed


def _root_cause(tail: list[str], launch_dir: Path, world: int) -> tuple[str, bool]:
    """(what failed, whether it was bad input): torchrun's first observed failure, with that rank's message."""
    errors = {}
    for path in sorted((launch_dir / RANKS_DIR).glob("rank-*.json")):
        try:
            payload = json.loads(path.read_text())
            errors[int(payload["rank"])] = payload
        except (OSError, ValueError, KeyError):
            continue
    text = "\n".join(tail)
    cause = text[text.rfind("Root Cause"):] if "Root Cause" in text else ""
    rank_match = re.search(r"rank\s*:\s*(\d+)", cause)
    rank = int(rank_match.group(1)) if rank_match else (min(errors, key=lambda r: errors[r]["time"]) if errors else None)
    others_killed = {r: how for r, how in _killed_ranks(text).items() if r != rank}
    if rank in errors and PEER_LOST.search(errors[rank]["message"]) and others_killed:
        # the rank torchrun saw fail first only lost its peer (gloo read a reset connection before torchrun
        # noticed the peer's death, as on a busy machine): the rank a signal killed is the cause
        killed = min(others_killed)
        return f"rank {killed} of {world} died ({others_killed[killed]})", False
    if rank is None:
        last = next((line for line in reversed(tail) if line.strip()), "no output")
        return f"torchrun failed before any rank reported ({last.strip()})", False
    where = f"rank {rank} of {world}"
    if rank in errors:
        error = errors[rank]
        return f"{where} on {error['host']}: {error['type']}: {error['message']}", error["exit_code"] == 2
    exit_match = re.search(r"exitcode\s*:\s*(-?\d+)", cause)
    signal_match = re.search(r"traceback\s*:\s*(Signal.*)", cause)
    how = signal_match.group(1).strip() if signal_match else f"exit code {exit_match.group(1) if exit_match else '?'}"
    if exit_match and int(exit_match.group(1)) < 0 and not signal_match:
        how = f"killed by signal {-int(exit_match.group(1))}"
    return f"{where} died ({how})", False


def _checkpoints(stage_dir: Path) -> list[str]:
    return sorted(str(p) for p in stage_dir.glob("checkpoints*/last.pt"))


def launch_stage(ctx: StageContext, *, stage_index: int, kind: str, pipeline: dict, source: str,
                 inputs: dict[str, InputArtifact], settings: DistributedSettings, data_digest: str) -> tuple[StageResult, float]:
    """Run stage ``stage_index`` of ``pipeline`` under torchrun from this machine (node 0)."""
    launch_dir = ctx.stage_dir / LAUNCH_DIR
    for stale in [launch_dir / RESULT_FILE, *(launch_dir / RANKS_DIR).glob("rank-*.json")]:
        stale.unlink(missing_ok=True)
    attempt = time.strftime("%Y%m%dT%H%M%S")
    rdzv = rendezvous_id(settings, ctx.pipeline.name, ctx.name, attempt)
    spec = {"attempt": attempt, "rdzv_id": rdzv, "name": ctx.name, "stage_index": stage_index,
            "source": source, "pipeline": pipeline, "cache_key": ctx.cache_key, "environment": ctx.environment,
            "data_digest": data_digest, "distributed": settings.model_dump(mode="json"),
            "inputs": {role: {"name": a.name, "kind": a.kind, "path": _relative(a.path, ctx.run_dir), "meta": a.meta,
                              "size_bytes": a.size_bytes} for role, a in inputs.items()}}
    spec_path = launch_dir / SPEC_FILE
    atomic_write_text(spec_path, json.dumps(spec, default=str))
    world = settings.processes
    others = (f"; waiting for {settings.nnodes - 1} more machine(s) at {settings.rdzv_endpoint}: on each run "
              f"`compress join {source} --stage {ctx.name} --node-rank K --run-dir {ctx.run_dir}`"
              if settings.nnodes > 1 else "")
    logger.info(f"launching {world} processes with torchrun ({settings.nproc_per_node} per machine × "
                f"{settings.nnodes} machine(s), backend {settings.backend}){others}", extra={"stage": ctx.name})
    started = time.perf_counter()
    try:
        code, tail = _run_torchrun(torchrun_command(spec_path, settings, rdzv))
    finally:
        spec_path.unlink(missing_ok=True)  # a later `compress join` must not attach to a finished launch
    duration = time.perf_counter() - started
    result_file = launch_dir / RESULT_FILE
    if code == 0 and result_file.is_file():
        result = json.loads(result_file.read_text())
        if result.get("attempt") == attempt:
            outputs = [Output(o["role"], o["kind"], ctx.run_dir / o["path"], o["meta"], o["made_from"])
                       for o in result["outputs"]]
            return StageResult(outputs=outputs, metrics=result["metrics"]), duration
    what, bad_input = _root_cause(tail, launch_dir, world)
    kept = _checkpoints(ctx.stage_dir)
    resume = (f"its last checkpoint is kept ({', '.join(kept)}) and a re-run resumes from it" if kept
              else "no checkpoint had been written yet, so a re-run starts the stage afresh")
    message = (f"stage {ctx.name!r} ({kind}) failed: {what}; {resume}: compress run {source} "
               f"--run-dir {ctx.run_dir}")
    raise (StageInputError if bad_input else StageError)(message)


def _relative(path: Path, run_dir: Path) -> str:
    """Inside the run directory: relative, so a machine that mounts it elsewhere still finds it."""
    try:
        return Path(path).resolve().relative_to(Path(run_dir).resolve()).as_posix()
    except ValueError:
        return str(Path(path).resolve())


def join_stage(run_dir: Path, stage: str, node_rank: int, wait_s: float, load_data) -> None:
    """This machine's share of a stage node 0 launched: wait for its spec in the shared run directory,
    decode the data here (once, before the processes start), then start torchrun for this node."""
    spec_path = Path(run_dir) / stage / LAUNCH_DIR / SPEC_FILE
    deadline = time.monotonic() + wait_s
    logger.info(f"waiting up to {wait_s:.0f} s for node 0 to launch stage {stage!r} ({spec_path})")
    while not spec_path.is_file():
        if time.monotonic() > deadline:
            raise StageError(f"no launch of stage {stage!r} appeared in {run_dir} within {wait_s:.0f} s: start "
                             "`compress run` on node 0 with the same --run-dir (shared with this machine)")
        time.sleep(1.0)
    spec = json.loads(spec_path.read_text())
    settings = DistributedSettings.model_validate(spec["distributed"])
    if not 0 < node_rank < settings.nnodes:
        raise ConfigError(f"--node-rank {node_rank}: the launch has nnodes {settings.nnodes}; give 1…{settings.nnodes - 1} "
                          "(node 0 is the machine running `compress run`)")
    load_data()
    logger.info(f"joining stage {stage!r} as node {node_rank} of {settings.nnodes} at {settings.rdzv_endpoint}")
    code, tail = _run_torchrun(torchrun_command(spec_path.resolve(), settings, spec["rdzv_id"]))
    if code != 0:
        what, bad_input = _root_cause(tail, spec_path.parent, settings.processes)
        raise (StageInputError if bad_input else StageError)(f"stage {stage!r} failed: {what}")
