"""The bench stage end to end on a tiny model: report schema, files, gate exit codes, re-rendering."""
from __future__ import annotations

import copy
import json
import shutil

import pytest
import yaml

from compress.cli import main
from tests.conftest import TINY

FAST_BENCH = {"name": "bench", "kind": "bench", "min_iters": 200, "min_samples": 200, "min_duration_s": 0.0,
              "warmup_iters": 5, "warmup_s": 0.0, "block_iters": 50, "threads": 1, "settle_s": 0.0, "block_s": 0.0}


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench")
    config = copy.deepcopy(TINY)
    config["latency"] = {"p99_budget_ms": 1000.0, "batch_size": 1}
    config["red_line"] = {"metric": "top1", "max_drop": 0.5}
    config["stages"] += [{"name": "export", "kind": "export", "parity": {"samples": 32}}, dict(FAST_BENCH)]
    path = folder / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    run_dir = folder / "run"
    code = main(["run", str(path), "--run-dir", str(run_dir)])
    return code, path, run_dir


def test_report_json_has_the_documented_keys(bench_run):
    code, _, run_dir = bench_run
    assert code == 0
    report = json.loads((run_dir / "bench" / "report" / "report.json").read_text())
    assert {"baseline", "artifacts", "gate", "environment"} <= set(report)
    assert report["baseline"] == "train.model"
    names = [a["name"] for a in report["artifacts"]]
    assert names == ["train.model", "export.onnx"]
    for art in report["artifacts"]:
        assert {"name", "stage", "backend", "precision", "format", "path", "size_bytes", "params", "macs", "accuracy",
                "accuracy_drop", "latency_ms", "throughput", "speedup_p99"} <= set(art)
        assert {"p50", "p90", "p95", "p99", "p99_ci", "mean", "n"} <= set(art["latency_ms"])
        assert art["latency_ms"]["n"] >= 200 and art["latency_ms"]["p99_ci"][0] <= art["latency_ms"]["p99"]
        assert {"top1", "top5"} <= set(art["accuracy"]) and art["accuracy"]["n"] == 359
    torch_entry, onnx_entry = report["artifacts"]
    assert (torch_entry["backend"], onnx_entry["backend"]) == ("torch", "onnxruntime")
    assert torch_entry["speedup_p99"] == 1.0 and torch_entry["accuracy_drop"] == 0.0
    assert abs(onnx_entry["accuracy_drop"]) < 0.5  # the same weights: ONNX accuracy equals torch's
    assert torch_entry["macs"] > 0 and onnx_entry["params"] == torch_entry["params"]
    gate = report["gate"]
    assert {"p99_budget_ms", "max_accuracy_drop", "passed", "release", "reasons"} <= set(gate)
    assert gate["passed"] and gate["release"] in names


def test_report_files_are_self_contained(bench_run):
    _, _, run_dir = bench_run
    folder = run_dir / "bench" / "report"
    html = (folder / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 3 and "src=\"http" not in html and "<link" not in html
    assert "Gate <b>PASSED</b>" in html
    assert (folder / "report.md").read_text().startswith("# Release report: tiny")
    assert {p.name for p in folder.iterdir()} >= {"latency_cdf.png", "accuracy_vs_p99.png", "size_by_artifact.png",
                                                 "latencies.npz"}


def test_every_report_names_the_instruction_set_it_was_measured_on(bench_run):
    _, _, run_dir = bench_run
    folder = run_dir / "bench" / "report"
    env = json.loads((folder / "report.json").read_text())["environment"]
    isa = env["isa"]
    for key in ("torch_cpu_capability", "avx2", "avx512_f", "avx512_vnni", "avx512_bf16", "amx_tile", "avx_vnni",
                "physical_cores", "int8_dot_product"):
        assert key in isa
    assert env["onnxruntime"]["version"] and "CPUExecutionProvider" in env["onnxruntime"]["providers"]
    line = f"instruction set: {env['isa_summary']}"
    html = (folder / "report.html").read_text()
    header = html[html.index("<h1>"): html.index("<table>")]  # above the first table, not in the footer
    assert line in header and f"int8 dot product: {isa['int8_dot_product']}" in header
    assert line in (folder / "report.md").read_text().split("| artifact |")[0]


def _report_from_another_machine(run_dir, tmp_path, isa):
    report = json.loads((run_dir / "bench" / "report" / "report.json").read_text())
    report["environment"]["isa"] = isa
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    return path


def test_gate_and_report_say_when_a_report_comes_from_another_instruction_set(bench_run, tmp_path, capsys):
    _, _, run_dir = bench_run
    assert main(["gate", str(run_dir)]) == 0
    assert "another instruction set" not in capsys.readouterr().err  # same machine: nothing to say
    here = json.loads((run_dir / "bench" / "report" / "report.json").read_text())["environment"]["isa"]
    other = {**here, "avx512_f": not here["avx512_f"], "avx512_vnni": not here["avx512_vnni"]}
    assert main(["gate", str(_report_from_another_machine(run_dir, tmp_path, other))]) == 0
    err = capsys.readouterr().err
    assert "another instruction set" in err and "avx512_vnni" in err and "re-run the bench stage here" in err
    folder = tmp_path / "copy"
    shutil.copytree(run_dir / "bench" / "report", folder / "report")
    _report_from_another_machine(run_dir, folder / "report", None)
    assert main(["report", str(folder)]) == 0
    assert "does not record the instruction set" in capsys.readouterr().err


def test_gate_command_re_evaluates_with_other_limits(bench_run, capsys):
    _, _, run_dir = bench_run
    assert main(["gate", str(run_dir)]) == 0
    assert main(["gate", str(run_dir / "bench" / "report" / "report.json"), "--p99-ms", "0.000001"]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "no artifact meets both the accuracy red line and the p99 budget" in out
    assert main(["gate", str(run_dir), "--max-drop", "-5"]) == 1
    assert main(["gate", str(run_dir / "nowhere")]) == 2


def test_report_command_re_renders_without_measuring(bench_run):
    _, _, run_dir = bench_run
    (run_dir / "bench" / "report" / "report.html").unlink()
    before = (run_dir / "bench" / "report" / "report.json").read_text()
    assert main(["report", str(run_dir)]) == 0
    assert (run_dir / "bench" / "report" / "report.html").is_file()
    assert (run_dir / "bench" / "report" / "report.json").read_text() == before


def test_a_failing_gate_exits_1_after_writing_the_report(bench_run, capsys):
    _, path, run_dir = bench_run
    assert main(["run", str(path), "--run-dir", str(run_dir), "latency.p99_budget_ms=0.000001"]) == 1
    err = capsys.readouterr().err
    assert "release gate FAILED (bench)" in err and "p99" in err
    report = json.loads((run_dir / "bench" / "report" / "report.json").read_text())
    assert not report["gate"]["passed"] and report["gate"]["p99_budget_ms"] == 0.000001


def test_bench_settings_are_validated(tmp_path, tiny_config, write_pipeline, capsys):
    tiny_config["stages"].append({"name": "bench", "kind": "bench", "min_iters": 100})
    assert main(["validate", str(write_pipeline(tiny_config))]) == 2
    assert "min_iters 100 is below min_samples 1000" in capsys.readouterr().err


def test_the_baseline_is_measured_even_when_not_listed(tmp_path, capsys):
    config = copy.deepcopy(TINY)
    config["stages"] += [{"name": "export", "kind": "export", "parity": {"samples": 32}},
                         dict(FAST_BENCH, artifacts=["export.onnx"], concurrency=2)]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["run", str(path), "--run-dir", str(tmp_path / "run")]) == 0
    report = json.loads((tmp_path / "run" / "bench" / "report" / "report.json").read_text())
    assert [a["name"] for a in report["artifacts"]] == ["train.model", "export.onnx"]
    assert report["settings"]["concurrency"] == 2 and all(a["throughput"] > 0 for a in report["artifacts"])


def test_bench_stage_alone_exits_1_when_its_gate_fails(bench_run, tmp_path, capsys):
    _, path, run_dir = bench_run
    settings = [f"{k}={v}" for k, v in FAST_BENCH.items() if k not in ("name", "kind")]
    args = ["stage", "bench", "--pipeline", str(path), "--input", f"artifact:model={run_dir / 'train' / 'model'}",
            *settings]
    assert main([*args, "--run-dir", str(tmp_path / "failing"), "latency.p99_budget_ms=0.000001"]) == 1
    assert "release gate FAILED (bench)" in capsys.readouterr().err
    assert main([*args, "--run-dir", str(tmp_path / "passing")]) == 0


def test_synthetic_data_gates_on_latency_only_and_the_ladder_does_not_climb(tmp_path, capsys):
    config = copy.deepcopy(TINY)
    config["data"] = {"name": "synthetic", "image_size": 8, "channels": 1, "synthetic_samples": 400}
    config["red_line"] = {"metric": "top1", "max_drop": 0.0}  # any noise would climb the ladder
    config["latency"] = {"p99_budget_ms": 1000.0}
    config["stages"] += [{"name": "quantize", "kind": "quantize", "flavours": ["cpu"],
                          "calibration": {"method": "minmax", "samples": 64}, "qat": {"epochs": 1}},
                         dict(FAST_BENCH)]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(config))
    run_dir = tmp_path / "run"
    assert main(["run", str(path), "--run-dir", str(run_dir)]) == 0
    err = capsys.readouterr().err
    assert "the ladder stays at PTQ" in " ".join(err.split())
    manifest = json.loads((run_dir / "manifest.json").read_text())
    ladder = manifest["stages"]["quantize"]["metrics"]
    assert ladder["rung"] == "ptq" and ladder["climbed"] == [] and ladder["red_line"]["within"] is None
    report = json.loads((run_dir / "bench" / "report" / "report.json").read_text())
    assert report["gate"]["decided_on"] == "latency only" and report["gate"]["passed"]
    assert "accuracy not gated" in (run_dir / "bench" / "report" / "report.md").read_text()
    assert main(["gate", str(run_dir)]) == 0
    assert "decided on latency only" in " ".join(capsys.readouterr().out.split())


def test_two_bench_stages_keep_their_own_reports_and_the_gate_reads_the_last(tmp_path, capsys):
    config = copy.deepcopy(TINY)
    config["latency"] = {"p99_budget_ms": 1000.0}
    config["stages"] += [{"name": "export", "kind": "export", "parity": {"samples": 32}},
                         dict(FAST_BENCH, name="bench_torch", artifacts=["train.model"]),
                         dict(FAST_BENCH, name="bench_all")]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(config))
    run_dir = tmp_path / "run"
    assert main(["run", str(path), "--run-dir", str(run_dir)]) == 0
    first = json.loads((run_dir / "bench_torch" / "report" / "report.json").read_text())
    last = json.loads((run_dir / "bench_all" / "report" / "report.json").read_text())
    assert [a["name"] for a in first["artifacts"]] == ["train.model"]
    assert [a["name"] for a in last["artifacts"]] == ["train.model", "export.onnx"]
    assert not (run_dir / "report").exists()  # nothing outside the stages' own folders
    capsys.readouterr()
    assert main(["gate", str(run_dir)]) == 0
    assert "bench_all" in capsys.readouterr().out.replace("\n", "")
