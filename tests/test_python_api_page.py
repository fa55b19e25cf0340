"""The Python API page's code runs as written: its plug-in stage joins a pipeline loaded and run from Python."""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import yaml

from compress.pipeline.pipeline_file import load_pipeline
from compress.pipeline.runner import Runner
from compress.stages import registry
from tests.conftest import TINY
from train.model_io import load_model

PAGE = Path(__file__).resolve().parents[1] / "docs" / "pages" / "python-api.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)


def test_every_code_block_of_the_page_is_python():
    for block in _blocks():
        compile(block, str(PAGE), "exec")


def test_the_pages_plug_in_stage_runs_in_a_pipeline_loaded_from_python(tmp_path):
    plug_in = next(b for b in _blocks() if "registry.register(" in b)
    namespace: dict = {"__name__": "compress_docs_plugin"}
    exec(compile(plug_in, str(PAGE), "exec", dont_inherit=True), namespace)  # registers kind "count"
    try:
        config = copy.deepcopy(TINY)
        config["stages"].append({"name": "count", "kind": "count"})
        path = tmp_path / "p.yaml"
        path.write_text(yaml.safe_dump(config))
        manifest = Runner(load_pipeline(str(path), overrides=["stages.train.epochs=1"]), tmp_path / "run").run()
        record = manifest.artifacts["count.counts"]
        counted = json.loads((tmp_path / "run" / record.path / "counts.json").read_text())["parameters"]
        model, _ = load_model(tmp_path / "run" / manifest.artifacts["train.model"].path)
        assert counted == sum(p.numel() for p in model.parameters()) and record.kind == "counts"
        assert manifest.stages["count"].metrics["parameters"] == counted
    finally:
        registry.unregister("count")
    assert "count" not in registry.kinds()
