"""One process of a stage launched by torchrun: ``python -m compress.pipeline.rank_worker SPEC``.

The runner (on node 0) writes the launch spec into the stage folder, torchrun starts this module
once per process on every node, and each process rebuilds the stage from the spec, joins the
process group and runs the same stage code as a single process would. Rank 0 writes the
artifacts and ``result.json``, which the runner registers in the manifest; a rank that fails
writes its message to ``ranks/rank-<r>.json`` for the runner to report.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

import torch
from torch.distributed.elastic.multiprocessing.errors import record

from compress.config import DistributedSettings, PipelineConfig
from compress.errors import DataInputError
from compress.pipeline.console_log import LIBRARY_LOGGERS, cli_console
from compress.pipeline.pipeline_data import load_section
from compress.stages import registry
from compress.stages.base import InputArtifact, StageContext
from train.atomic_io import atomic_write_text
from train.distributed import join_from_environment, leave

logger = logging.getLogger(__name__)

SPEC_FILE = "spec.json"
RESULT_FILE = "result.json"
RANKS_DIR = "ranks"


class _RankFormatter(logging.Formatter):
    def __init__(self, stage: str, rank: int) -> None:
        super().__init__()
        self.prefix = stage if rank == 0 else f"{stage} [rank {rank}]"

    def format(self, record: logging.LogRecord) -> str:
        return f"{getattr(record, 'stage', None) or self.prefix}: {record.getMessage()}"


def _log_to_stderr(stage: str, rank: int) -> None:
    """Rank 0 speaks for the stage; the other ranks only warn (their progress is rank 0's)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_RankFormatter(stage, rank))
    for name in LIBRARY_LOGGERS:
        lib = logging.getLogger(name)
        lib.addHandler(handler)
        lib.setLevel(logging.INFO if rank == 0 else logging.WARNING)
        lib.propagate = False


def _write_error(launch_dir: Path, rank: int, exc: BaseException) -> None:
    payload = {"rank": rank, "host": os.uname().nodename, "time": time.time(), "type": type(exc).__name__,
               "message": str(exc),
               "exit_code": 2 if getattr(exc, "bad_input", False) else getattr(exc, "exit_code", 3)}
    try:
        atomic_write_text(launch_dir / RANKS_DIR / f"rank-{rank}.json", json.dumps(payload))
    except OSError:  # the disk or the shared folder is gone: torchrun's own error file still names the rank
        logger.exception("could not record rank %d's error", rank)


def run_rank(spec_path: Path) -> None:
    launch_dir = spec_path.parent
    stage_dir = launch_dir.parent
    run_dir = stage_dir.parent
    spec = json.loads(spec_path.read_text())
    rank = int(os.environ.get("RANK", "0"))
    _log_to_stderr(spec["name"], rank)
    try:
        settings = DistributedSettings.model_validate(spec["distributed"])
        group = join_from_environment(settings.backend)
        pipeline = PipelineConfig.model_validate(spec["pipeline"])
        if pipeline.threads is not None:
            torch.set_num_threads(pipeline.threads)
        stage_cfg = pipeline.stages[spec["stage_index"]]
        cls = registry.get(stage_cfg["kind"])
        assert cls is not None, stage_cfg["kind"]
        cfg = cls.Config.model_validate(stage_cfg)
        data = load_section(pipeline.data, spec["source"])
        if data.digest() != spec["data_digest"]:
            raise DataInputError(f"rank {rank} on {os.uname().nodename}: its data ({pipeline.data.name}, "
                                 f"{pipeline.data.path or 'built in'}) differs from node 0's (split digest "
                                 f"{data.digest()[:12]}… ≠ {spec['data_digest'][:12]}…); every node needs the same "
                                 "data at the same path")
        # relative to the run directory as this machine mounts it (an absolute path stays as it is)
        inputs = {role: InputArtifact(a["name"], a["kind"], run_dir / a["path"], a["meta"], a["size_bytes"])
                  for role, a in spec["inputs"].items()}
        ctx = StageContext(run_dir=run_dir, stage_dir=stage_dir, name=spec["name"], pipeline=pipeline,
                           cache_key=spec["cache_key"], console=cli_console(), load_data=lambda: data,
                           environment=spec["environment"], group=group, distributed=settings)
        result, _ = cls(cfg).execute(ctx, inputs)
        if group.is_main:
            outputs = [{"role": o.role, "kind": o.kind, "path": o.path.relative_to(run_dir).as_posix(),
                        "meta": o.meta, "made_from": o.made_from} for o in result.outputs]
            atomic_write_text(launch_dir / RESULT_FILE, json.dumps(
                {"attempt": spec["attempt"], "outputs": outputs, "metrics": result.metrics},
                default=str))
        group.barrier()
    except BaseException as exc:
        _write_error(launch_dir, rank, exc)
        raise
    finally:
        leave()


@record
def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m compress.pipeline.rank_worker <stage dir>/launch/spec.json")
    run_rank(Path(sys.argv[1]).resolve())


if __name__ == "__main__":
    main()
