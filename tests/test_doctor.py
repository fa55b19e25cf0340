"""``compress doctor``: the facts it reports, absent and failing runtimes, and ``--gpu`` without a GPU.

The tiny model is exported once for the module (the exporter's first call takes seconds); the runs that
only change which runtime is absent or failing reuse it.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from compress.cli import main
from compress.doctor import gpu_check
from compress.doctor import smoke as smoke_module
from compress.doctor.machine import isa_limits, torch_level_of

ROOT = Path(__file__).resolve().parents[1]
def _imports(module: str) -> bool:
    try:
        importlib.import_module(module)
        return True
    except ImportError:
        return False


HAS_OPENVINO = _imports("openvino")
RUNTIME_ROWS = {"torch", "onnxruntime", "openvino", "tensorrt", "inductor", "nncf", "mlperf_loadgen"}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The smoke model through the real path (fixed seed, saved artifact, export_onnx), made once."""
    return smoke_module.prepare(tmp_path_factory.mktemp("smoke"))


@pytest.fixture
def reuse_export(monkeypatch, prepared):
    from compress.doctor import checkup, runtimes

    monkeypatch.setattr(smoke_module, "prepare", lambda folder: prepared)
    monkeypatch.setattr(smoke_module, "MAX_SECONDS", 0.3)  # these runs check the verdict, not the speed
    # their verdicts concern other runtimes: torch.compile's smoke run (a compile, seconds) is its own slow test
    monkeypatch.setattr(checkup, "runtime_names", lambda: [n for n in runtimes.runtime_names() if n != "inductor"])


def _doctor(folder, prepared):
    """``compress doctor --json`` run in ``folder``: (exit code, console output, the JSON, its folder)."""
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        mp.setattr(smoke_module, "prepare", lambda _: prepared)
        mp.setattr(smoke_module, "MAX_SECONDS", 0.5)
        code = main(["doctor", "--json", str(folder / "doctor.json")])
    return code, out.getvalue(), json.loads((folder / "doctor.json").read_text()), folder


@pytest.fixture(scope="module")
def doctor_run(tmp_path_factory, prepared):
    """One full ``compress doctor --json`` on this machine, torch.compile's smoke run (a compile) left out: (exit
    code, console output, the JSON, its folder)."""
    from compress.doctor import checkup, runtimes

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(checkup, "runtime_names", lambda: [n for n in runtimes.runtime_names() if n != "inductor"])
        return _doctor(tmp_path_factory.mktemp("doctor"), prepared)


def _row(report: dict, name: str) -> dict:
    return next(r for r in report["runtimes"] if r["name"] == name)


def _smoke(report: dict, runtime: str) -> dict:
    return next(r for r in report["smoke"]["results"] if r["runtime"] == runtime)


def test_json_has_the_isa_facts_and_a_row_per_runtime(doctor_run):
    from train.hardware import isa_facts
    from train.precision import choose_amp

    code, out, report, folder = doctor_run
    assert code == 0 and report["exit_code"] == 0
    machine, here = report["machine"], isa_facts()
    for key in ("avx2", "avx512_f", "avx512_vnni", "avx512_bf16", "amx_tile", "torch_cpu_capability"):
        assert machine["isa"][key] == here[key]
    assert machine["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert machine["native_bf16"] == here["native_bf16"] and machine["int8_dot_product"] == here["int8_dot_product"]
    assert machine["physical_cores"] >= 1 and machine["logical_cores"] >= machine["physical_cores"]
    assert {r["name"] for r in report["runtimes"]} == RUNTIME_ROWS
    assert _row(report, "torch")["status"] == "ok" and _row(report, "torch")["version"] == torch.__version__
    amp = next(c for c in report["defaults"] if c["setting"] == "train amp: auto (CPU)")
    assert amp["choice"] == choose_amp("auto", torch.device("cpu")).name
    int8 = next(c for c in report["defaults"] if c["setting"] == "quantize: CPU INT8 file")
    assert "cpu_weights: 7bit" in int8["choice"]
    assert ("VNNI is present" if machine["int8_dot_product_native"] else "VNNI is absent") in int8["why"]
    for title in ("Machine", "Runtimes", "What the defaults will choose here", "Smoke run"):
        assert title in out
    assert [p.name for p in folder.iterdir()] == ["doctor.json"]  # written through a temp file, nothing left over


def test_onnxruntime_answers_like_torch(doctor_run):
    _, _, report, _ = doctor_run
    ort, torch_run = _smoke(report, "onnxruntime"), _smoke(report, "torch")
    assert torch_run["status"] == "PASS" and torch_run["max_abs_diff"] == 0.0  # saved artifact rebuilt exactly
    assert ort["status"] == "PASS" and ort["max_abs_diff"] < 1e-3 and ort["p50_ms"] > 0


@pytest.mark.slow  # the smoke run compiles
def test_every_runtime_of_the_registry_has_a_row_and_a_smoke_run_inductor_included(tmp_path, prepared):
    """The doctor asks the runner registry which runtimes exist: torch.compile is listed, and its smoke run compiles
    the tiny model and answers as torch does, within its runner's tolerance."""
    from serve_bench.runners import RUNNERS, InductorRunner

    _, out, report, _ = _doctor(tmp_path, prepared)
    assert {r["runtime"] for r in report["smoke"]["results"]} == {n for n, r in RUNNERS.items() if r.formats}
    row, run = _row(report, "inductor"), _smoke(report, "inductor")
    if InductorRunner.unavailable() is not None:
        assert row["status"] == "unusable here" and run["status"] == "SKIP"
        return
    assert row["status"] == "ok" and row["version"] == torch.__version__ and "C++ compiler" in row["detail"]
    assert run["status"] == "PASS" and run["max_abs_diff"] < 1e-3 and run["p50_ms"] > 0
    assert "inductor" in out


@pytest.mark.skipif(not HAS_OPENVINO, reason="openvino is not importable here: its row and smoke run are not made")
def test_openvino_row_and_smoke_run(doctor_run):
    _, _, report, _ = doctor_run
    row = _row(report, "openvino")
    assert row["status"] == "ok" and any(d.startswith("CPU: ") for d in row["devices"])
    ov = _smoke(report, "openvino")
    assert ov["status"] == "PASS" and ov["max_abs_diff"] < 1e-3


def test_an_absent_library_is_a_row_not_a_crash(monkeypatch, reuse_export, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "openvino", None)  # every `import openvino` now fails, as uninstalled
    monkeypatch.setitem(sys.modules, "nncf", None)
    assert main(["doctor", "--json", str(tmp_path / "d.json")]) == 0
    report, out = json.loads((tmp_path / "d.json").read_text()), capsys.readouterr().out
    for name in ("openvino", "nncf"):
        assert _row(report, name)["status"] == "not installed"
        assert _row(report, name)["detail"] == "not installed: pip install 'compress[cpu]'"
    assert _smoke(report, "openvino")["status"] == "SKIP"
    bench = next(c for c in report["defaults"] if c["setting"].startswith("bench runtimes"))
    assert bench["choice"] == "onnxruntime" and "openvino: " in bench["why"] and "not installed" in bench["why"]
    assert "not installed: pip install 'compress[cpu]'" in out


def test_a_failing_runtime_gives_exit_3_and_its_error(monkeypatch, reuse_export, capsys, tmp_path):
    import serve_bench.runners as runners

    real = runners.make_runner

    def failing_onnxruntime(runtime, path, **kwargs):
        runner = real(runtime, path, **kwargs)
        if runtime == "onnxruntime":
            def infer(x):
                raise RuntimeError("simulated kernel failure: no Conv kernel for this CPU")
            runner.infer = infer
        return runner

    monkeypatch.setattr(runners, "make_runner", failing_onnxruntime)
    assert main(["doctor", "--json", str(tmp_path / "d.json")]) == 3
    out, report = capsys.readouterr().out, json.loads((tmp_path / "d.json").read_text())
    assert "FAIL onnxruntime: RuntimeError: simulated kernel failure: no Conv kernel for this CPU" in out
    assert "doctor: FAILED: onnxruntime (exit 3)" in out
    assert _smoke(report, "onnxruntime")["status"] == "FAIL" and report["exit_code"] == 3
    assert _smoke(report, "torch")["status"] == "PASS"  # the command went on with the other runtimes


def test_an_installed_but_broken_runtime_fails_the_doctor(monkeypatch, reuse_export, capsys):
    from compress.doctor import runtimes

    real = runtimes.import_optional

    def broken_openvino(module):
        if module == "openvino":
            raise OSError("libopenvino.so.2026: cannot open shared object file")
        return real(module)

    monkeypatch.setattr(runtimes, "import_optional", broken_openvino)
    assert main(["doctor"]) == 3
    out = capsys.readouterr().out
    assert ("FAIL openvino: installed but does not import: OSError: libopenvino.so.2026: cannot open shared object "
            "file") in out


def test_the_tensorrt_smoke_run_builds_an_fp32_engine_from_the_smoke_file(monkeypatch, prepared, tmp_path):
    import export.tensorrt_engine as trt_engine

    built = {}
    monkeypatch.setattr(trt_engine, "build_engine", lambda *args: built.update(args=args))
    from serve_bench.runners import TensorRTRunner

    path, device = TensorRTRunner.smoke_file(prepared.model_dir, prepared.onnx_path, tmp_path)
    onnx_path, out_dir, settings, input_name, chw = built["args"]
    assert (path, device) == (tmp_path / "engine", "cuda") and out_dir == path and onnx_path == prepared.onnx_path
    assert settings.precision == "fp32" and settings.max_batch == 1 and (input_name, chw) == ("input", (3, 32, 32))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the branch for machines without a CUDA device")
def test_gpu_without_a_gpu_says_why_and_exits_0(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(gpu_check.subprocess, "run", lambda *a, **k: pytest.fail("nothing may run without a GPU"))
    assert main(["doctor", "--gpu", "--json", str(tmp_path / "g.json")]) == 0
    out, report = capsys.readouterr().out, json.loads((tmp_path / "g.json").read_text())
    assert report["gpu_check"]["gpu"] is None and report["gpu_check"]["steps"] == []
    assert f"no GPU: {gpu_check.no_gpu_reason()}" in out
    reason = report["gpu_check"]["reason"]
    assert "no CUDA device visible" in reason if torch.version.cuda else "built without CUDA" in reason
    monkeypatch.setattr(torch.version, "cuda", None)
    assert "is built without CUDA" in gpu_check.no_gpu_reason()


def test_gpu_commands_run_the_gpu_tests_then_an_int8_engine_and_a_cuda_bench():
    from compress.pipeline.pipeline_file import apply_override

    (_, tests, tests_pass), (_, run, run_passes) = gpu_check.gpu_commands("python")
    assert tests == ["python", "-m", "pytest", "-m", "gpu", "-q"] and tests_pass == (0,)
    assert run_passes == (0, 1)  # 1: the pipeline ran and its release gate said no
    assert run[:6] == ["python", "-m", "compress", "run", gpu_check.PIPELINE, "--run-dir"]
    assert run[6] == gpu_check.RUN_DIR and run[-len(gpu_check.OVERRIDES):] == list(gpu_check.OVERRIDES)
    assert run[7:11] == ["--force", "export", "--force", "bench"]
    raw = yaml.safe_load((ROOT / gpu_check.PIPELINE).read_text())
    for override in gpu_check.OVERRIDES:
        apply_override(raw, override)  # each names a stage the quickstart has
    stages = {s["name"]: s for s in raw["stages"]}
    assert stages["export"]["formats"] == ["onnx", "tensorrt"]
    assert stages["export"]["tensorrt"] == {"precision": "int8", "required": True}
    assert stages["bench"]["device"] == "cuda"


def test_gpu_steps_decide_the_exit_code(monkeypatch, capsys):
    """With a (pretended) GPU: a gate's no (exit 1) is a run that worked; any other failure is exit 3."""
    codes = {}
    monkeypatch.setattr(gpu_check, "no_gpu_reason", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "Pretend GPU")
    monkeypatch.setattr(gpu_check, "engine_summary", lambda run_dir: (True, "export.tensorrt: int8 engine"))
    monkeypatch.setattr(gpu_check.subprocess, "run", lambda argv, **_: subprocess.CompletedProcess(
        argv, codes["pytest" if "pytest" in argv else "run"]))
    codes.update(pytest=0, run=1)
    assert main(["doctor", "--gpu"]) == 0
    assert "the release gate said no (exit 1); export.tensorrt: int8 engine" in capsys.readouterr().out
    codes.update(pytest=1, run=0)
    assert main(["doctor", "--gpu"]) == 3
    assert "doctor: FAILED: GPU tests (pytest -m gpu) (exit 3)" in capsys.readouterr().out


def test_an_emulated_isa_is_named():
    avx512 = {"avx": True, "avx2": True, "avx512_f": True, "avx512_bw": True, "avx512_vl": True, "avx512_dq": True,
              "avx512_vnni": True}
    limits, notes = isa_limits({"torch_cpu_capability": "AVX2", "aten_cpu_capability_env": "avx2",
                                "onednn_max_cpu_isa": "avx2"}, avx512)
    assert limits == ["torch runs AVX2 kernels on a CPU whose flags allow AVX512 (ATEN_CPU_CAPABILITY=avx2)",
                      "oneDNN is capped at avx2 (ONEDNN_MAX_CPU_ISA) below the CPU's avx512_core_vnni"]
    avx2 = {"avx": True, "avx2": True}
    assert torch_level_of(avx2) == "AVX2"
    limits, notes = isa_limits({"torch_cpu_capability": "AVX2", "aten_cpu_capability_env": "avx2",
                                "onednn_max_cpu_isa": "avx2"}, avx2)
    assert limits == [] and len(notes) == 2 and all("changes nothing here" in n for n in notes)


def test_the_quickstart_step_passes_only_with_an_int8_engine_in_the_manifest(tmp_path):
    from compress.pipeline.manifest import ArtifactRecord, Manifest

    assert gpu_check.engine_summary(tmp_path) == (False, f"no manifest in {tmp_path}")
    manifest = Manifest(pipeline="quickstart")
    record = {"kind": "tensorrt", "path": "export/tensorrt", "sha256": "0" * 64, "size_bytes": 1, "stage": "export"}
    manifest.artifacts["export.tensorrt"] = ArtifactRecord(name="export.tensorrt", meta={"precision": "fp16"}, **record)
    manifest.save(tmp_path)
    assert gpu_check.engine_summary(tmp_path) == (False, "export.tensorrt: fp16 engine")
    manifest.artifacts["export.tensorrt"] = ArtifactRecord(name="export.tensorrt", meta={"precision": "int8"}, **record)
    manifest.save(tmp_path)
    assert gpu_check.engine_summary(tmp_path) == (True, "export.tensorrt: int8 engine")
