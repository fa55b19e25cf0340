"""A run directory belongs to one pipeline, and no record of a finished run is ever replaced."""
from __future__ import annotations

import copy

import yaml

from compress.cli import main
from compress.pipeline.manifest import Manifest


def _snapshot(run_dir):
    return {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != ".lock"}


def _write(folder, name, config):
    path = folder / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_another_pipeline_is_refused_and_the_run_stays_byte_identical(tmp_path, tiny_config, capsys):
    run_dir = tmp_path / "first"
    assert main(["run", str(_write(tmp_path, "first.yaml", tiny_config)), "--run-dir", str(run_dir)]) == 0
    before = _snapshot(run_dir)
    other = dict(copy.deepcopy(tiny_config), name="other")
    other_path = _write(tmp_path, "other.yaml", other)
    assert main(["run", str(other_path), "--run-dir", str(run_dir)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "holds a run of pipeline 'tiny'" in err and "is pipeline 'other'" in err and "--reuse-run-dir" in err
    assert _snapshot(run_dir) == before
    broken = dict(other, model={"name": "no_such_model_xyz"})  # the case from the field: also refused up front
    assert main(["run", str(_write(tmp_path, "broken.yaml", broken)), "--run-dir", str(run_dir)]) == 2
    assert _snapshot(run_dir) == before


def test_reuse_keeps_every_resolved_configuration(tmp_path, tiny_config, capsys):
    run_dir = tmp_path / "run"
    assert main(["run", str(_write(tmp_path, "first.yaml", tiny_config)), "--run-dir", str(run_dir)]) == 0
    first_resolved = (run_dir / "pipeline.resolved.yaml").read_text()
    other = dict(copy.deepcopy(tiny_config), name="other", seed=1)
    assert main(["run", str(_write(tmp_path, "other.yaml", other)), "--run-dir", str(run_dir),
                 "--reuse-run-dir"]) == 0
    manifest = Manifest.load(run_dir)
    files = [c["file"] for c in manifest.resolved_configs]
    assert len(files) == 2 and [c["pipeline"] for c in manifest.resolved_configs] == ["tiny", "other"]
    assert (run_dir / files[0]).read_text() == first_resolved  # the finished run's configuration, kept
    assert manifest.stages["train"].resolved_config == files[1]
    assert (run_dir / "pipeline.resolved.yaml").read_text() == (run_dir / files[1]).read_text()


def test_a_cached_run_writes_nothing(tmp_path, tiny_config):
    run_dir = tmp_path / "run"
    path = _write(tmp_path, "p.yaml", tiny_config)
    assert main(["run", str(path), "--run-dir", str(run_dir)]) == 0
    before = _snapshot(run_dir)
    assert main(["run", str(path), "--run-dir", str(run_dir)]) == 0
    assert _snapshot(run_dir) == before
