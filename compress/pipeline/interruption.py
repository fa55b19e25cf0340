"""What an interrupted run kept, in words: the user decides from one line whether to resume."""
from __future__ import annotations

from train.checkpoint import CHECKPOINT_FILE


def kept_line(runner) -> str:
    """Completed stages, the stage that stopped and its last checkpoint (if it wrote one)."""
    manifest = runner.manifest
    done = [n for n, r in (manifest.stages.items() if manifest else []) if r.status == "completed"]
    parts = [f"completed stages kept ({', '.join(done)})" if done else "no stage had completed"]
    stage = runner.current_stage
    if stage:
        checkpoints = sorted((runner.run_dir / stage).glob(f"*/{CHECKPOINT_FILE}"))
        where = ", ".join(str(c) for c in checkpoints)
        parts.append(f"stage {stage!r} stopped, its last checkpoint kept ({where}) and resumed from there"
                     if checkpoints else f"stage {stage!r} stopped before its first checkpoint and starts over")
    parts.append("lock released")
    return "; ".join(parts)
