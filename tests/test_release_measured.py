"""A release ships only bytes the deciding bench measured: the released file, and the TensorRT engines of the
same model that bench measured and the gate passes."""
from __future__ import annotations

import pytest

from compress.errors import ArtifactError
from compress.pipeline.manifest import ArtifactRecord, Manifest, StageRecord
from compress.release.bundle import _engines_of
from compress.release.measured import engines_to_ship, measured_digests, require_measured
from tests.report_entries import as_report


def _record(name, kind, made_from=(), source=None, sha="0", precision=None):
    meta = {k: v for k, v in (("source_model", source), ("precision", precision)) if v}
    return ArtifactRecord(name=name, kind=kind, path=name, sha256=sha * 64, size_bytes=1, stage=name.split(".")[0],
                          meta=meta, made_from=list(made_from))


def _bench(measured: dict[str, str]) -> StageRecord:
    roles = {f"artifact:{name}": sha * 64 for name, sha in measured.items()}
    return StageRecord(name="bench", kind="bench", status="completed", config_hash="c", cache_key="k",
                       input_digests=roles, package_version="0", started="t",
                       key_material={"input_names": {role: role.split(":", 1)[1] for role in roles}})


def _entry(name, drop, p99):
    return {"name": name, "accuracy_drop": drop, "latency_ms": {"p99": p99}}


FIELDS = {"gate": {"passed": True, "release": "export.onnx", "decision": "point", "reasons": [],
                   "limits": {"metric": "top1", "max_drop": 0.5, "p99_budget_ms": 1.0, "decision": "point"}},
          "data": {"meaningful_accuracy": True},
          "artifacts": [_entry("train.model", 0.0, 2.0), _entry("export.onnx", 0.1, 0.8),
                        _entry("export.tensorrt", 0.1, 0.2),         # fp32 engine: within both limits
                        _entry("int8.engine", 2.0, 0.1),           # INT8 engine: past the red line
                        _entry("rebuilt.engine", 0.0, 0.1)]}       # measured, then built again
REPORT = as_report(FIELDS)


@pytest.fixture
def manifest() -> Manifest:
    manifest = Manifest(pipeline="p")
    for r in (_record("train.model", "torch-model", sha="1"),
              _record("export.onnx", "onnx", ["train.model"], "train.model", sha="2", precision="fp32"),
              _record("quantize.onnx_tensorrt", "onnx", ["train.model"], "train.model", sha="3", precision="int8"),
              _record("export.tensorrt", "tensorrt", ["export.onnx"], sha="4", precision="fp32"),
              _record("int8.engine", "tensorrt", ["quantize.onnx_tensorrt"], sha="5", precision="int8"),
              _record("rebuilt.engine", "tensorrt", ["export.onnx"], sha="7", precision="fp16"),
              _record("unmeasured.engine", "tensorrt", ["export.onnx"], sha="6", precision="fp16")):
        manifest.artifacts[r.name] = r
    return manifest


def test_the_fp32_file_ships_only_the_engines_its_bench_measured_and_its_gate_passes(manifest):
    bench = _bench({"train.model": "1", "export.onnx": "2", "export.tensorrt": "4", "int8.engine": "5",
                    "rebuilt.engine": "8"})  # the bench read another rebuilt.engine than the manifest's now
    candidates = _engines_of(manifest, manifest.artifacts["export.onnx"])
    assert {e.name for e in candidates} == {"export.tensorrt", "int8.engine", "rebuilt.engine", "unmeasured.engine"}
    choice = engines_to_ship(candidates, REPORT, measured_digests(bench))
    assert [e.name for e in choice.shipped] == ["export.tensorrt"]
    why = {engine.name: reason for engine, reason in choice.withheld}
    assert why["int8.engine"] == "the release gate refused it (accuracy drop 2.00 points > red line 0.5)"
    not_measured = "the bench the gate decided on did not measure this engine"
    assert why["rebuilt.engine"] == why["unmeasured.engine"] == not_measured


def test_no_engine_ships_where_the_gate_passes_none(manifest):
    report = as_report({**FIELDS, "gate": {**FIELDS["gate"], "limits": {**FIELDS["gate"]["limits"], "p99_budget_ms": 0.05}}})
    # every engine over the budget
    bench = _bench({"export.tensorrt": "4", "int8.engine": "5"})
    choice = engines_to_ship(_engines_of(manifest, manifest.artifacts["export.onnx"]), report, measured_digests(bench))
    assert choice.shipped == [] and len(choice.withheld) == 4
    assert "p99 0.200 ms > budget 0.05 ms" in dict((e.name, r) for e, r in choice.withheld)["export.tensorrt"]


def test_a_file_re_made_after_its_bench_is_refused(manifest, tmp_path):
    record = manifest.artifacts["export.onnx"]
    require_measured(record, _bench({"export.onnx": "2"}), tmp_path)  # the very bytes: accepted
    with pytest.raises(ArtifactError, match=r"it measured another export\.onnx \(sha256 999999999999…\), made "
                                            r"before the file was re-made \(now 222222222222…\).*Nothing was written"
                       ) as refused:
        require_measured(record, _bench({"export.onnx": "9"}), tmp_path)
    assert refused.value.exit_code == 2 and f"--run-dir {tmp_path} --from bench" in str(refused.value)
    with pytest.raises(ArtifactError, match="it did not measure export.onnx at all"):
        require_measured(record, _bench({"train.model": "1"}), tmp_path)


def test_a_record_that_kept_no_input_names_is_judged_by_its_digests(manifest, tmp_path):
    bench = _bench({"export.onnx": "2"}).model_copy(update={"key_material": None})
    assert measured_digests(bench) == {"artifact:export.onnx": "2" * 64}
    require_measured(manifest.artifacts["export.onnx"], bench, tmp_path)


def test_release_anyway_picks_the_fastest_file_the_baseline_exported_as_it_is_included(tmp_path):
    """The baseline's own file is a candidate like any other: --anyway takes the fastest measured file, which may be
    it, and --artifact names it."""
    from compress.errors import ConfigError
    from compress.release.bundle import _chosen

    failed = {**FIELDS, "gate": {**FIELDS["gate"], "passed": False, "release": None, "reasons": ["none passed"]},
              "baseline": "train.model",
              "artifacts": [_entry("train.model", 0.0, 2.0), _entry("export.onnx", 0.1, 0.8),
                            {**_entry("export-alone:train.model", 0.0, 0.1), "role": "reference"}]}
    report = as_report(failed)
    assert _chosen(report, None, True, tmp_path / "report.json") == "export-alone:train.model"
    assert _chosen(report, "export-alone:train.model", True, tmp_path / "report.json") == "export-alone:train.model"
    with pytest.raises(ConfigError, match="--artifact nothing.onnx: not in"):
        _chosen(report, "nothing.onnx", True, tmp_path / "report.json")
