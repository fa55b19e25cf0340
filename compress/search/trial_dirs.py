"""A directory per trial, started from the reference run's stages that the trial does not change.

Trials share everything upstream of what the space touches: the trained baseline is trained
once, in the reference run, and every trial's directory starts with a manifest holding those
stages' records and hard links to their files. The runner then finds the same cache key and
skips them, so sharing goes through the manifest cache rather than around it; a trial whose
settings did reach the baseline would see another key and train its own.

Hard links are safe here because nothing rewrites a file in place: every artifact is written
under a temporary name and renamed, which replaces the link rather than the shared bytes.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from compress.pipeline.manifest import Manifest
from compress.pipeline.pipeline_file import Pipeline
from compress.stages import registry


def shared_stages(pipeline: Pipeline, paths: list[str]) -> list[str]:
    """The leading stages no space path can change: not addressed, and reading no addressed section."""
    names = [s.name for s in pipeline.stages]
    touched_stages, touched_sections = set(), set()
    for path in paths:
        parts = path.split(".")
        if parts[0] == "stages" and len(parts) > 1:
            touched_stages.add(names[int(parts[1])] if parts[1].isdigit() else parts[1])
        else:
            touched_sections.add(parts[0])
    shared = []
    for stage in pipeline.stages:
        cls = registry.get(stage.kind)
        assert cls is not None  # validated
        if stage.name in touched_stages or touched_sections & set(cls.uses) or touched_sections & {"distributed"}:
            break
        shared.append(stage.name)
    return shared


def _link_tree(source: Path, target: Path) -> None:
    for path in source.rglob("*"):
        if not path.is_file():
            continue
        dest = target / path.relative_to(source)
        if dest.exists():
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, dest)
        except OSError:  # another file system, or links not allowed: a copy does the same
            shutil.copy2(path, dest)


def seed_trial(reference: Path, trial_dir: Path, stages: list[str]) -> list[str]:
    """Start ``trial_dir`` with the reference's completed ``stages``; returns those it got.

    A trial directory that already has a manifest (a resumed trial) is left as it is.
    """
    if (trial_dir / "manifest.json").is_file() or not stages:
        return []
    source = Manifest.load(reference)
    if source is None:
        return []
    # Outputs are not hashed here: the trial's runner checks them before skipping a stage, as in any run.
    kept = [s for s in stages if s in source.stages and source.stages[s].status == "completed"]
    manifest = Manifest(pipeline=source.pipeline, environment=source.environment, data=source.data)
    for name in kept:
        record = source.stages[name]
        manifest.stages[name] = record
        manifest.artifacts.update({a: source.artifacts[a] for a in record.outputs})
        if record.environment in source.environments:
            manifest.environments[record.environment] = source.environments[record.environment]
        _link_tree(reference / name, trial_dir / name)
        config = record.resolved_config
        if config and (reference / config).is_file():
            _link_tree((reference / config).parent, trial_dir / Path(config).parent)
            manifest.resolved_configs += [c for c in source.resolved_configs
                                          if c["file"] == config and c not in manifest.resolved_configs]
    trial_dir.mkdir(parents=True, exist_ok=True)
    manifest.save(trial_dir)
    return kept
