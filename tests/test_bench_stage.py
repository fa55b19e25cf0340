"""The bench stage end to end on a tiny model: report schema, files, gate exit codes, re-rendering."""
from __future__ import annotations

import copy
import json
import logging
import shutil

import pytest
import yaml

from compress.cli import main
from serve_bench.runners import InductorRunner, usable_onnx_runtimes
from tests.conftest import TINY
from tests.report_invariants import points_outside_intervals

FAST_BENCH = {"name": "bench", "kind": "bench", "min_iters": 200, "min_samples": 200, "min_duration_s": 0.0,
              "warmup_iters": 5, "warmup_s": 0.0, "block_iters": 50, "threads": 1, "settle_s": 0.0, "block_s": 0.0,
              "profile_iters": 0}


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench")
    config = copy.deepcopy(TINY)
    config["latency"] = {"p99_budget_ms": 1000.0, "batch_size": 1}
    config["red_line"] = {"metric": "top1", "max_drop": 0.5}
    # OpenVINO pinned to f32: its default (auto) runs bf16 on a CPU with native bf16, and the runtime-parity check
    # below is about the same fp32 file in two runtimes (auto moved 5 of 359 top-1 answers on an AVX-512 BF16 EPYC)
    config["stages"] += [{"name": "export", "kind": "export", "parity": {"samples": 32}},
                         dict(FAST_BENCH, repeats=2, openvino={"inference_precision": "f32"})]
    path = folder / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    run_dir = folder / "run"
    code = main(["run", str(path), "--run-dir", str(run_dir)])
    return code, path, run_dir


def on_openvino() -> list[str]:
    """The ONNX file's second candidate where OpenVINO runs here (the bench measures it on every usable runtime)."""
    return ["export.onnx@openvino"] if "openvino" in usable_onnx_runtimes() else []


def test_report_json_has_the_documented_keys(bench_run):
    code, _, run_dir = bench_run
    assert code == 0
    report = json.loads((run_dir / "bench" / "report" / "report.json").read_text())
    assert {"baseline", "artifacts", "gate", "environment"} <= set(report)
    assert report["baseline"] == "train.model"
    names = [a["name"] for a in report["artifacts"]]
    assert names == ["train.model", "export.onnx", *on_openvino()]  # the ONNX file once per runtime usable here
    for art in report["artifacts"]:
        assert {"name", "stage", "runtime", "precision", "format", "path", "size_bytes", "params", "macs", "accuracy",
                "accuracy_drop", "latency_ms", "throughput", "speedup_p99"} <= set(art)
        assert {"p50", "p90", "p95", "p99", "p99_ci", "mean", "n"} <= set(art["latency_ms"])
        assert art["latency_ms"]["n"] >= 200 and art["latency_ms"]["p99_ci"][0] <= art["latency_ms"]["p99"]
        assert {"top1", "top5"} <= set(art["accuracy"]) and art["accuracy"]["n"] == 359
    torch_entry, onnx_entry = report["artifacts"][:2]
    assert (torch_entry["runtime"], onnx_entry["runtime"]) == ("torch", "onnxruntime")
    assert torch_entry["speedup_p99"] == 1.0 and torch_entry["accuracy_drop"] == 0.0
    assert abs(onnx_entry["accuracy_drop"]) < 0.5  # the same weights: ONNX accuracy equals torch's
    assert torch_entry["macs"] > 0 and onnx_entry["params"] == torch_entry["params"]
    for entry in report["artifacts"][2:]:  # the same file on OpenVINO: its own candidate, paired with onnxruntime's
        assert (entry["runtime"], entry["artifact"], entry["runner"]["runtime"]) == ("openvino", "export.onnx",
                                                                                   "openvino")
        parity = entry["runtime_parity"]
        assert parity["reference"] == "export.onnx" and parity["n"] == 359
        assert entry["runner"]["inference_precision"] == "f32" and entry["runner"]["version"]  # pinned, any CPU
        assert parity["top1_differs"] <= 3 and parity["max_abs_logit_diff_relative"] < 1e-2  # fp32 in both
    gate = report["gate"]
    assert {"limits", "passed", "release", "reasons"} <= set(gate)
    assert gate["limits"] == {"metric": "top1", "max_drop": 0.5,
                              "p99_budget_ms": 1000.0, "decision": "confident"}  # the pipeline file's names
    assert gate["passed"] and gate["release"] in names


def test_every_gated_number_carries_its_interval(bench_run):
    _, _, run_dir = bench_run
    folder = run_dir / "bench" / "report"
    report = json.loads((folder / "report.json").read_text())
    torch_entry, onnx_entry = report["artifacts"][:2]
    assert points_outside_intervals(report) == []
    for art in report["artifacts"]:
        lo, hi = art["accuracy_ci"]["top1"]
        assert lo < art["accuracy"]["top1"] < hi and hi - lo > 2  # 359 images: several points wide
        lat = art["latency_ms"]
        assert lat["p99_ci_blocks"][0] <= lat["p99"] <= lat["p99_ci_blocks"][1] and lat["blocks"] >= 4
        assert art["repeats"]["k"] == 2 and len(art["repeats"]["per_repeat"]) == 2
        assert set(art["repeats"]["spread"]["p99"]) >= {"min", "max", "max_over_min"}
    assert torch_entry["accuracy_paired"]["reference"] and torch_entry["latency_ratio"] is None
    paired = onnx_entry["accuracy_paired"]
    assert paired["n"] == 359 and paired["method"] == "tango-score"
    assert paired["drop_ci"][0] <= paired["drop"] <= paired["drop_ci"][1]
    ratio = onnx_entry["latency_ratio"]["p99"]
    assert ratio["ci"][0] <= ratio["ratio"] <= ratio["ci"][1] and ratio["verdict"] in ("faster", "slower",
                                                                                       "not distinguishable")
    assert report["gate"]["decision"] == "confident" and report["data"]["smallest_certifiable_drop"] > 1.0
    # The ONNX file of the same weights: (almost) no image differs, yet 359 images cannot show a 0.5-point red
    # line, so the confident gate releases the baseline and says what it would take.
    assert report["gate"]["release"] == "train.model"
    assert any("export.onnx" in r and "test images" in r for r in report["gate"]["reasons"])
    md = (folder / "report.md").read_text()
    assert "p99 CI blocks" in md and "drop points [95% CI]" in md and "## Run-to-run spread" in md
    assert "## Latency against the baseline (block-paired)" in md and "decision: confident" in md


def test_predictions_are_kept_per_image_and_pair_with_the_report(bench_run):
    from serve_bench.accuracy.predictions import hits, load_predictions

    _, _, run_dir = bench_run
    folder = run_dir / "bench" / "report"
    report = json.loads((folder / "report.json").read_text())
    predictions = load_predictions(folder)  # numpy arrays only, read with allow_pickle=False
    assert predictions.test_digest == report["data"]["test_digest"]
    assert set(predictions.topk) == {"train.model", "export.onnx", *on_openvino()} and predictions.topk["export.onnx"].shape == (359, 5)
    for art in report["artifacts"]:
        top1 = hits(predictions.topk[art["name"]], predictions.labels, "top1")
        assert 100 * top1.mean() == pytest.approx(art["accuracy"]["top1"], abs=1e-3)
    base = hits(predictions.topk["train.model"], predictions.labels, "top1")
    onnx = hits(predictions.topk["export.onnx"], predictions.labels, "top1")
    paired = report["artifacts"][1]["accuracy_paired"]
    assert (int((base & ~onnx).sum()), int((~base & onnx).sum())) == (paired["baseline_only"], paired["artifact_only"])


def test_gate_decision_can_be_chosen_at_the_command_line(bench_run, capsys):
    _, _, run_dir = bench_run
    assert main(["gate", str(run_dir), "--decision", "point", "--max-drop", "0.5"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "export.onnx is within the red line on the point estimate" in out  # said, though it passed
    # Only the ONNX file may ship: on points it passes, at 95% the test set is too small (exit 1, with why).
    report = run_dir / "bench" / "report" / "report.json"
    data = json.loads(report.read_text())
    data["artifacts"] = data["artifacts"][1:]
    only_onnx = report.parent.parent / "only_onnx.json"
    only_onnx.write_text(json.dumps(data))
    assert main(["gate", str(only_onnx), "--decision", "point"]) == 0
    assert main(["gate", str(only_onnx), "--decision", "confident"]) == 1
    assert "test images" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["gate", str(run_dir), "--decision", "maybe"])


@pytest.mark.parametrize("flag,value,rule", [("--max-drop", "-1", "greater than or equal to 0"),
                                              ("--max-drop", "150", "less than or equal to 100"),
                                              ("--p99-ms", "-5", "greater than 0"), ("--p99-ms", "0", "greater than 0")])
def test_a_limit_outside_its_domain_is_bad_input_not_a_verdict(bench_run, capsys, flag, value, rule):
    """The same values in a pipeline file are refused by validation; on the command line they were judged
    (exit 1, "drop -0.20 points > red line -1")."""
    _, _, run_dir = bench_run
    assert main(["gate", str(run_dir), flag, value]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{flag} {float(value):g}" in err and rule in err and "pipeline file" in err


def test_compare_pairs_runs_on_the_same_test_split_and_refuses_others(bench_run, tmp_path, capsys):
    _, path, run_dir = bench_run
    other = copy.deepcopy(TINY)
    other["data"] = {"name": "digits", "split_seed": 1}
    other_path = tmp_path / "other.yaml"
    other_path.write_text(yaml.safe_dump(other))
    assert main(["run", str(other_path), "--run-dir", str(tmp_path / "other")]) == 0
    out = tmp_path / "cmp"
    assert main(["compare", str(run_dir), str(run_dir), "--artifact", "train.model", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    first, second = report["artifacts"]
    assert first["name"] == "run:train.model" and second["name"] == "run-2:train.model"
    assert second["accuracy_paired"]["discordant"] == 0 and second["accuracy_drop"] == 0.0  # the same file
    assert second["latency_ratio"]["p99"]["rounds"] >= 4
    assert "## Comparison of runs" in (out / "report.md").read_text()
    assert (out / "predictions.npz").is_file()
    refused = tmp_path / "cmp2"
    assert main(["compare", str(run_dir), str(tmp_path / "other"), "--artifact", "train.model",
                 "--out", str(refused)]) == 0
    report = json.loads((refused / "report.json").read_text())
    assert report["artifacts"][1]["accuracy_drop"] is None
    assert "another test split" in report["artifacts"][1]["accuracy_paired"]["unpaired"]
    assert [r["paired"] for r in report["comparison"]["runs"]] == [True, False]
    captured = capsys.readouterr()
    assert "pairing refused" in " ".join((captured.out + captured.err).split())
    assert main(["compare", str(run_dir), str(tmp_path / "other"), "--out", str(refused)]) == 2  # exists: never
    assert "a comparison never overwrites one" in capsys.readouterr().err                    # overwritten
    assert main(["compare", str(run_dir), str(tmp_path / "other"), "--out", str(tmp_path / "c3")]) == 2
    assert "no bench report" in capsys.readouterr().err  # the other run released nothing: name an artifact


@pytest.mark.openvino
def test_compare_measures_the_candidates_the_bench_does_and_takes_a_file_released_on_another_runtime(bench_run,
                                                                                                     tmp_path):
    """The bench stage and compare go through one measurement path: the same file on every runtime the bench
    measures it on, the same flags; a run whose gate released ``file@openvino`` is compared by that candidate."""
    _, _, run_dir = bench_run
    bench = json.loads((run_dir / "bench" / "report" / "report.json").read_text())
    own = [a["name"] for a in bench["artifacts"] if a["artifact"] == "export.onnx"]
    released = own[-1]  # export.onnx@openvino where OpenVINO runs here
    released_run = tmp_path / "released-on-openvino"
    shutil.copytree(run_dir, released_run)
    report_path = released_run / "bench" / "report" / "report.json"
    stored = json.loads(report_path.read_text())
    stored["gate"]["release"] = released  # as a gate that picked it would have written
    report_path.write_text(json.dumps(stored))
    out = tmp_path / "cmp-runtimes"
    assert main(["compare", str(released_run), str(run_dir), "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    theirs = bench["gate"]["release"]  # the second run's own pick: what its gate released
    second = [a["name"] for a in bench["artifacts"] if a["artifact"] == theirs.split("@")[0]]
    label = released_run.name
    assert [a["name"] for a in report["artifacts"]] == [f"{label}:{n}" for n in own] + [f"run:{n}" for n in second]
    assert report["comparison"]["reference"] == f"{label}:{released}" == report["baseline"]
    assert [r["candidate"] for r in report["comparison"]["runs"]] == [released, theirs]
    if released.endswith("@openvino"):  # the pick runs with the hint and precision its own run configured
        assert report["comparison"]["runs"][0]["options"] == {"hint": "LATENCY", "inference_precision": "f32"}
    assert {a["runtime"] for a in report["artifacts"][:len(own)]} == {a["runtime"] for a in bench["artifacts"]
                                                                      if a["artifact"] == "export.onnx"}
    assert report["gate"]["limits"] == bench["gate"]["limits"]  # judged by the pipeline's limits, by one name
    independence = [f for f in bench["flags"] if f.startswith("†")]
    assert [f for f in report["flags"] if f.startswith("†")] == independence


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
    ort = env["runtimes"]["onnxruntime"]  # each runtime's own view, from its runner's fingerprint
    assert ort["version"] and "CPUExecutionProvider" in ort["providers"] and env["runtimes"]["torch"]["version"]
    line = f"instruction set: {env['isa_summary']}"
    html = (folder / "report.html").read_text()
    header = html[html.index("<h1>"): html.index("<table")]  # above the first table, not in the footer
    assert line in header and f"int8 dot product: {isa['int8_dot_product']}" in header
    assert line in (folder / "report.md").read_text().split("| artifact |")[0]
    assert f"onnxruntime {ort['version']} (" in header and "CPUExecutionProvider" in header


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
    assert main(["gate", str(run_dir), "--max-drop", "-5"]) == 2  # outside the red line's domain: bad input
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
    assert not report["gate"]["passed"] and report["gate"]["limits"]["p99_budget_ms"] == 0.000001


def test_bench_settings_are_validated(tmp_path, tiny_config, write_pipeline, capsys):
    tiny_config["stages"].append({"name": "bench", "kind": "bench", "min_iters": 100})
    assert main(["validate", str(write_pipeline(tiny_config))]) == 2
    assert "min_iters 100 is below min_samples 1000" in capsys.readouterr().err


def test_the_baseline_is_measured_even_when_not_listed(tmp_path, capsys):
    config = copy.deepcopy(TINY)
    config["stages"] += [{"name": "export", "kind": "export", "parity": {"samples": 32}},
                         dict(FAST_BENCH, artifacts=["export.onnx"], concurrency=2, runtimes=["onnxruntime"])]
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
                         dict(FAST_BENCH, name="bench_all", runtimes=["onnxruntime"])]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(config))
    run_dir = tmp_path / "run"
    assert main(["run", str(path), "--run-dir", str(run_dir)]) == 0
    first = json.loads((run_dir / "bench_torch" / "report" / "report.json").read_text())
    last = json.loads((run_dir / "bench_all" / "report" / "report.json").read_text())
    # no ONNX file among them: the baseline exported as it is is still a candidate (never less than exporting it)
    names = [a["name"] for a in first["artifacts"]]
    assert names[:2] == ["train.model", "export-alone:train.model"]
    assert all(n.startswith("export-alone:train.model@") for n in names[2:])  # on each other ONNX runtime measured
    assert [a["name"] for a in last["artifacts"]] == ["train.model", "export.onnx"]
    assert not (run_dir / "report").exists()  # nothing outside the stages' own folders
    capsys.readouterr()
    assert main(["gate", str(run_dir)]) == 0
    assert "bench_all" in capsys.readouterr().out.replace("\n", "")


def test_a_runtime_asked_for_but_unusable_is_refused_by_name(monkeypatch):
    from compress.errors import ConfigError
    from compress.stages import runtime_choice

    monkeypatch.setattr(runtime_choice, "runtime_status", lambda device: {
        "onnxruntime": None, "openvino": "OpenVINO is not installed: pip install 'compress[cpu]'"})
    with pytest.raises(ConfigError, match=r"stages\.bench\.runtimes: openvino cannot run here .*not installed"):
        runtime_choice.onnx_runtimes(["openvino", "onnxruntime"], "cpu", "stages.bench.runtimes")
    assert runtime_choice.onnx_runtimes(["onnxruntime", "onnxruntime"], "cpu", "f") == ["onnxruntime"]
    monkeypatch.setattr(runtime_choice, "usable_onnx_runtimes", lambda device: ["onnxruntime"])
    assert runtime_choice.onnx_runtimes(None, "cpu", "f") == ["onnxruntime"]


def test_leave_out_takes_a_name_from_the_default_set_and_refuses_one_no_stage_makes(tmp_path):
    from compress.errors import ConfigError
    from compress.pipeline.input_wiring import input_refs
    from compress.pipeline.pipeline_file import load_pipeline

    config = copy.deepcopy(TINY)
    config["stages"] += [{"name": "prune", "kind": "prune", "target": {"macs": 0.7}, "deployed_latency": {"enabled": False}},
                         {"name": "export", "kind": "export"}, dict(FAST_BENCH, leave_out=["prune.model"])]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(config))
    measured = set(input_refs(load_pipeline(path))["bench"].values())
    assert {"train.model", "export.onnx"} <= measured and "prune.model" not in measured
    config["stages"][-1]["leave_out"] = ["prune.modle"]
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError, match=r"stages.bench.leave_out: prune.modle is not made by an earlier stage"):
        input_refs(load_pipeline(path))
    config["stages"][-1].update(leave_out=["prune.model"], artifacts=["export.onnx"])
    path.write_text(yaml.safe_dump(config))
    assert main(["validate", str(path)]) == 2  # a list and a leave-out together: one of them is not what was meant


def test_the_report_is_typed_versioned_and_an_older_one_is_read_a_newer_one_refused(bench_run, tmp_path, capsys,
                                                                                   caplog):
    """report.json fits its model (checked when written, schema beside it); a version-1 report (limits under their
    old names) and a version-3 one (an entry's runtime called backend) are read in today's names, with a warning; a
    newer version, or a report missing what readers rely on, is refused with the version or the field named."""
    from serve_bench.report_model import REPORT_VERSION, SCHEMA_FILE, Report, ReportVersionError, checked

    _, _, run_dir = bench_run
    folder = run_dir / "bench" / "report"
    report = json.loads((folder / "report.json").read_text())
    assert report["report_version"] == REPORT_VERSION
    assert json.loads((folder / SCHEMA_FILE).read_text()) == Report.model_json_schema()
    Report.model_validate(report)

    old = copy.deepcopy(report)
    del old["report_version"]
    limits = old["gate"].pop("limits")
    old["gate"].update(max_accuracy_drop=limits["max_drop"], p99_budget_ms=limits["p99_budget_ms"])
    (tmp_path / "v1.json").write_text(json.dumps(old))
    assert main(["gate", str(tmp_path / "v1.json")]) == (0 if report["gate"]["passed"] else 1)
    from compress.pipeline.bench_report import load_report

    read, _ = load_report(tmp_path / "v1.json")
    assert read.gate.limits.model_dump() == limits and read.upgraded_from == 1
    assert "red line" not in capsys.readouterr().err  # read, not refused

    # version 3 named an entry's runtime "backend" (and a variant repeated it as "runtime"): read as one runtime, said
    v3 = copy.deepcopy(report)
    v3["report_version"] = 3
    for entry in v3["artifacts"]:
        entry["backend"] = entry.pop("runtime")
        entry["runner"]["backend"] = entry["runner"].pop("runtime")
    v3["artifacts"][0]["runtime"] = v3["artifacts"][0]["backend"]
    (tmp_path / "v3.json").write_text(json.dumps(v3))
    with caplog.at_level(logging.WARNING, logger="serve_bench.report_model"):
        read, _ = load_report(tmp_path / "v3.json")
    assert [(e.runtime, e.runner["runtime"]) for e in read.artifacts] == [
        (e["runtime"], e["runner"]["runtime"]) for e in report["artifacts"]]
    assert read.upgraded_from == 3 and "backend" not in read.document()["artifacts"][0]
    assert "a report of version 3, read in today's names" in caplog.text

    newer = {**report, "report_version": REPORT_VERSION + 1}
    (tmp_path / "v9.json").write_text(json.dumps(newer))
    assert main(["gate", str(tmp_path / "v9.json")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"report_version {REPORT_VERSION + 1} was written by a newer compress" in err and "versions 1 to" in err

    broken = copy.deepcopy(report)
    del broken["artifacts"][0]["latency_ms"]["p99"]
    with pytest.raises(ReportVersionError, match=r"artifacts\.0\.latency_ms\.p99"):
        checked(broken)


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["onnx", "and-compiled"])  # the compiled one compiles (seconds per batch size)
def test_the_unpruned_model_exported_alone_is_a_candidate_the_gate_judges_and_a_release_ships(tmp_path, compiled):
    """train → prune → export → bench: the baseline exported to fp32 ONNX as it is stands beside the candidates on
    each runtime, each ONNX candidate has its latency over it on the same runtime, and the gate judges it like any
    other file. It is the bench stage's output ``bench.export_alone`` (labelled as every ONNX file the pipeline
    writes), so ``compress release`` bundles it and ``compress verify`` checks it. Where the bench already measures an
    fp32 ONNX of the baseline, none is added. With inductor among the runtimes, the baseline compiled alone is a
    reference too, and every candidate on another runtime has its latency over it: what a PyTorch user gains over
    what they would deploy without compressing."""
    config = copy.deepcopy(TINY)
    config["red_line"] = {"metric": "top1", "max_drop": 100.0, "collapse_margin": None}
    if compiled and InductorRunner.unavailable() is not None:
        pytest.skip(f"Inductor cannot compile here: {InductorRunner.unavailable()}")
    runtimes = {"runtimes": ["onnxruntime", "inductor"], "inductor": {"bf16": "off"}} if compiled else {}
    config["stages"] += [{"name": "prune", "kind": "prune", "target": {"macs": 0.7}, "importance": "magnitude",
                          "deployed_latency": {"enabled": False},
                          "sparsity": {"epochs": 0}, "finetune": {"epochs": 1, "amp": "off"}},
                         {"name": "export", "kind": "export"}, dict(FAST_BENCH, leave_out=["prune.model"], **runtimes)]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["run", str(path), "--run-dir", str(tmp_path / "run")]) in (0, 1)
    report = json.loads((tmp_path / "run" / "bench" / "report" / "report.json").read_text())
    entries = {a["name"]: a for a in report["artifacts"]}
    alone = entries["export-alone:train.model"]
    assert (alone["role"], alone["format"], alone["precision"], alone["source_model"]) == (
        "reference", "onnx", "fp32", "train.model")
    assert alone["macs"] == entries["train.model"]["macs"] and abs(alone["accuracy_drop"]) < 0.5  # the same weights
    ratio = entries["export.onnx"]["vs_export_alone"]
    assert ratio["reference"] == "export-alone:train.model" and ratio["p50"]["ci"][0] <= ratio["p50"]["ratio"]
    assert "vs_export_alone" not in alone and "vs_export_alone" not in entries["train.model"]
    gate = report["gate"]
    judged = [gate["release"]] + [r.split(": ", 1)[0] for r in gate["reasons"]]
    assert alone["name"] in judged or gate["passed"]  # released, refused with its reason, or passed and slower
    assert alone["artifact"] == "bench.export_alone"
    record = json.loads((tmp_path / "run" / "manifest.json").read_text())["artifacts"]["bench.export_alone"]
    assert (record["kind"], record["made_from"], record["meta"]["source_model"]) == ("onnx", ["train.model"],
                                                                                   "train.model")
    bundle = tmp_path / "bundle"
    anyway = [] if gate["release"] == alone["name"] else ["--anyway"]
    assert main(["release", str(tmp_path / "run"), "--to", str(bundle), "--artifact", alone["name"], *anyway]) == 0
    card = json.loads((bundle / "model_card.json").read_text())
    assert (card["released"]["artifact"], card["released"]["sha256"]) == ("bench.export_alone", record["sha256"])
    assert card["released"]["candidate"] == alone["name"] and card["input"]["mean"]
    assert main(["verify", str(bundle)]) in (0, 1)  # 1: bundled --anyway, which verify reports; the files check
    markdown = (tmp_path / "run" / "bench" / "report" / "report.md").read_text()
    assert "## Compression alone: against the unpruned model exported" in markdown
    assert points_outside_intervals(report) == []
    if compiled:
        alone = entries["train.model@inductor"]
        assert (alone["role"], alone["runtime"], alone["artifact"]) == ("reference", "inductor", "train.model")
        assert set(alone["runner"]["compile_s"]) >= {"batch 1"}  # a candidate: the gate may release it too
        assert alone["runtime_parity"]["reference"] == "train.model"  # the same file, eager and compiled
        for name in ("export.onnx", "train.model"):
            assert entries[name]["vs_compile_alone"]["reference"] == "train.model@inductor"
        assert "vs_compile_alone" not in alone and "compile alone" in markdown


def test_no_export_alone_where_the_bench_measures_the_baselines_fp32_onnx_already(bench_run):
    _, _, run_dir = bench_run  # train → export → bench: export.onnx is the baseline exported
    report = json.loads((run_dir / "bench" / "report" / "report.json").read_text())
    assert not any(a["name"].startswith("export-alone") for a in report["artifacts"])
