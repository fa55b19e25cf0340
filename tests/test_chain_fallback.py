"""The chain goes on from the last model within the red line: a file-making stage wired to a model past the line on
validation makes its files from the model behind it, recorded in the manifest and said in the log."""
from __future__ import annotations

import copy
import json

import pytest

from compress.cli import main
from compress.stages.base import InputArtifact
from compress.stages.red_line_check import fallback_for
from tests.conftest import TINY


def _artifact(name: str, within: bool | None, macs: int = 100) -> InputArtifact:
    meta = {"macs": macs}
    if within is not None:
        meta["validation_red_line"] = {"metric": "val_top1", "baseline": "train.model", "baseline_val": 90.0,
                            "val": 90.0 if within else 85.0, "drop": 0.0 if within else 5.0, "max_drop": 1.0,
                            "within": within}
    return InputArtifact(name, "torch-model", None, meta)


def test_the_fallback_walks_back_past_every_model_over_the_line_to_the_last_one_within():
    """distill made a model past the line from a pruned one also past it: the fallback is the trained model behind
    both (the baseline, within by definition), with the cost (its MACs over the wired model's) and why. A model
    within the line, or one that cannot be judged, falls back to nothing; a model behind it that cannot be judged is
    never taken as within."""
    chain = {"distill.model": _artifact("prune.model", False, macs=40), "prune.model": _artifact("train.model", None)}

    def verdict_of(artifact):
        return {"within": True} if artifact.name == "train.model" else artifact.meta.get("validation_red_line")

    wired = _artifact("distill.model", False, macs=40)
    used, why = fallback_for(wired, lambda a: chain.get(a.name), verdict_of)
    assert used.name == "train.model" and (why.wired, why.used, why.macs_ratio) == ("distill.model", "train.model", 2.5)
    assert "5.00 points down, red line 1" in why.words("quantize") and "×2.50 the MACs" in why.words("quantize")
    assert fallback_for(_artifact("prune.model", True), chain.get, verdict_of) is None
    assert fallback_for(_artifact("prune.model", None), chain.get, verdict_of) is None  # not judged: used as it is
    assert fallback_for(wired, lambda a: None, verdict_of) is None  # nothing behind it: the stage uses what it has
    unjudged = {"distill.model": _artifact("prune.model", None), "prune.model": None}
    assert fallback_for(wired, lambda a: unjudged.get(a.name), verdict_of) is None  # never "within" by default


def test_a_recorded_verdict_is_read_against_todays_line_and_baseline():
    """A model judged under a 1-point line, read after the line was relaxed to 6: within now (its stage's key holds
    no red line, so its record stays); judged against another baseline's bytes: judged again."""
    from compress.stages.red_line_check import current

    verdict = _artifact("prune.model", False).meta["validation_red_line"] | {"baseline_sha256": "abc"}
    baseline = InputArtifact("train.model", "torch-model", None, {}, 0, "abc")
    assert current(verdict, baseline, 6.0)["within"] and not current(verdict, baseline, 1.0)["within"]
    assert current(verdict, InputArtifact("train.model", "torch-model", None, {}, 0, "def"), 6.0) is None
    assert current(None, baseline, 1.0) is None


def test_export_makes_its_file_from_the_trained_model_when_the_pruned_one_is_past_the_red_line(tmp_path, capsys):
    """train → prune (10% of the MACs, no finetune: far past a 0-point line) → export. The prune stage's model is
    judged on validation and recorded past the line; the export stage exports the trained model instead, its
    lineage and record say so, and the log says why. With ``red_line.fall_back: false`` the export re-runs on the
    pruned model."""
    config = copy.deepcopy(TINY)
    config["stages"][0]["epochs"] = 2
    config["red_line"] = {"metric": "top1", "max_drop": 0.0, "collapse_margin": None}
    config["stages"] += [{"name": "prune", "kind": "prune", "target": {"macs": 0.1}, "importance": "magnitude",
                          "deployed_latency": {"enabled": False}, "sparsity": {"epochs": 0},
                          "finetune": {"epochs": 0}, "batchnorm": {"reestimate_images": 0}},
                         {"name": "export", "kind": "export", "parity": {"samples": 32}}]
    path = tmp_path / "p.yaml"
    import yaml

    path.write_text(yaml.safe_dump(config))
    run_dir = tmp_path / "run"
    assert main(["run", str(path), "--run-dir", str(run_dir)]) == 0
    manifest = json.loads((run_dir / "manifest.json").read_text())
    verdict = manifest["artifacts"]["prune.model"]["meta"]["validation_red_line"]
    assert verdict["within"] is False and verdict["drop"] > 0 and verdict["baseline"] == "train.model"
    assert manifest["artifacts"]["export.onnx"]["made_from"] == ["train.model"]
    assert manifest["artifacts"]["export.onnx"]["meta"]["source_model"] == "train.model"
    fallback = manifest["stages"]["export"]["key_material"]["fallback"]
    assert (fallback["wired"], fallback["used"]) == ("prune.model", "train.model") and fallback["macs_ratio"] > 5
    said = " ".join(capsys.readouterr().err.split())
    assert "prune.model is past the red line on validation" in said and "the last model within it, instead" in said

    assert main(["run", str(path), "--run-dir", str(run_dir), "red_line.fall_back=false"]) == 0
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["artifacts"]["export.onnx"]["made_from"] == ["prune.model"]
    assert "fallback" not in manifest["stages"]["export"]["key_material"]
