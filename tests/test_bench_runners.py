"""Runners behind one interface, the provider-fallback refusal, and interleaved measurement in workers."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from export.onnx_export import export_onnx
from serve_bench.latency.harness import HarnessSettings, measure_interleaved
from serve_bench.runners import OnnxRuntimeRunner, RunnerError, TorchRunner, make_runner, physical_cores
from serve_bench.latency.worker import BenchWorker, WorkerError
from train.model_io import describe, save_model
from train.models import build_model


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("artifacts")
    torch.manual_seed(0)
    model = build_model("resnet20", 10, 1, {"width": 4}).eval()
    save_model(model, folder / "model", describe("resnet20", 10, 1, {"width": 4}, {}))
    export_onnx(model, torch.randn(2, 1, 8, 8), folder / "model.onnx")
    images = np.random.default_rng(0).standard_normal((64, 1, 8, 8)).astype(np.float32)
    return folder, images


def test_torch_and_onnxruntime_runners_agree(artifacts):
    folder, images = artifacts
    with TorchRunner(folder / "model", threads=1) as torch_runner, OnnxRuntimeRunner(folder / "model.onnx") as ort:
        a, b = torch_runner.infer(images[:4]), ort.infer(images[:4])
        assert a.shape == b.shape == (4, 10)
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
        assert ort.info()["providers"] == ["CPUExecutionProvider"] and ort.info()["threads"] == physical_cores()
    with pytest.raises(RunnerError, match=r"call load\(\)"):
        torch_runner.infer(images[:1])


def test_runner_refuses_bad_input_and_unknown_runtimes(artifacts):
    folder, images = artifacts
    with OnnxRuntimeRunner(folder / "model.onnx") as runner:
        with pytest.raises(RunnerError, match=r"expects N×C×H×W images, got shape \(1, 8, 8\)"):
            runner.infer(images[0])
    with pytest.raises(RunnerError, match=r"unknown runtime 'tflite'"):
        make_runner("tflite", folder)


def test_a_gpu_provider_that_falls_back_to_cpu_is_refused(artifacts, monkeypatch):
    import onnxruntime

    folder, _ = artifacts
    with pytest.raises(RunnerError, match=r"has no CUDAExecutionProvider"):
        OnnxRuntimeRunner(folder / "model.onnx", device="cuda").load()
    # onnxruntime-gpu without CUDA libraries lists the provider, then silently runs on the CPU.
    monkeypatch.setattr(onnxruntime, "get_available_providers",
                        lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    with pytest.warns(UserWarning), pytest.raises(RunnerError, match=r"fell back to CPUExecutionProvider although "
                                                                     r"CUDAExecutionProvider was asked for"):
        OnnxRuntimeRunner(folder / "model.onnx", device="cuda").load()


def test_interleaved_measurement_in_worker_processes(artifacts):
    folder, images = artifacts
    settings = HarnessSettings(warmup_iters=5, warmup_s=0.0, min_iters=300, min_duration_s=0.05, block_iters=50,
                               block_s=0.0, settle_s=0.0)
    rounds = []
    with BenchWorker("torch", "torch", str(folder / "model"), {"threads": 1}, images, 1) as torch_worker, \
            BenchWorker("onnx", "onnxruntime", str(folder / "model.onnx"), {"threads": 1}, images, 1) as ort_worker:
        result = measure_interleaved({"torch": torch_worker, "onnx": ort_worker}, settings, progress=rounds.append)
        logits = ort_worker.call("predict", images, 16)
    assert set(result) == {"torch", "onnx"}
    for m in result.values():
        assert m.requests >= 300 and len(m.latencies_ms) == m.requests and (m.latencies_ms > 0).all()
    # one block each per round (interleaved, not one after the other); progress after each round, up to done
    assert result["torch"].blocked.rounds == result["onnx"].blocked.rounds == list(range(len(rounds)))
    assert 0 < rounds[0] < 1 and rounds == sorted(rounds) and rounds[-1] == 1.0
    assert logits.shape == (64, 10)


def test_a_worker_that_cannot_load_reports_why(tmp_path):
    with pytest.raises(WorkerError, match=r"broken: .*"):
        BenchWorker("broken", "onnxruntime", str(tmp_path / "missing.onnx"), {}, np.zeros((1, 1, 8, 8), np.float32), 1)


def test_harness_check_reports_both_loops(artifacts, capsys):
    import json

    from serve_bench.latency.check_harness import main as check_main

    folder, _ = artifacts
    assert check_main([str(folder / "model.onnx"), "--rounds", "2", "--block", "50", "--threads", "1"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["requests_each"] == 100
    assert {"p50", "p99"} <= set(result["harness"]) and {"p50", "p99"} <= set(result["minimal"])
    assert result["p50_ratio"] > 0 and "overhead_pct_of_median" in result


@pytest.mark.parametrize("runtime", ["torch", "onnxruntime"])
def test_device_only_timing_starts_from_a_staged_input_and_leaves_the_output_on_the_device(artifacts, runtime):
    """What device-only times, alike for every runner: the input is on the device before the clock
    starts and the result stays there (torch: a tensor; onnxruntime: an I/O binding; TensorRT, on a
    GPU machine, a CUDA tensor), so no runner's figure includes a copy the others leave out."""
    folder, images = artifacts
    path = folder / ("model" if runtime == "torch" else "model.onnx")
    with make_runner(runtime, path, threads=1) as runner:
        staged = runner.prepare(images[:4])
        if runtime == "torch":
            assert isinstance(staged, torch.Tensor) and staged.device.type == runner.device
        else:
            assert staged.value.device_name() == runner.device  # an OrtValue, copied once
        out = runner.run_prepared(staged)
        assert not isinstance(out, np.ndarray)  # not copied back to the host inside the timed call
        np.testing.assert_allclose(runner._to_host(out), runner.infer(images[:4]), rtol=1e-5, atol=1e-6)


def test_device_only_inputs_shared_by_client_threads_give_each_its_own_result(artifacts):
    import threading

    folder, images = artifacts
    batches = [images[i:i + 4] for i in range(0, 32, 4)]
    with OnnxRuntimeRunner(folder / "model.onnx", threads=1) as runner:
        staged = [runner.prepare(b) for b in batches]
        expected = [runner.infer(b) for b in batches]
        wrong: list[int] = []

        def client(c: int) -> None:
            for i in range(40):  # every client walks the same staged inputs, as the harness's clients do
                k = (c + i) % len(staged)
                if not np.allclose(runner._to_host(runner.run_prepared(staged[k])), expected[k], atol=1e-5):
                    wrong.append(k)

        threads = [threading.Thread(target=client, args=(c,)) for c in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not wrong


def test_per_thread_state_is_one_per_client_thread():
    import threading

    from serve_bench.runners import PerThread

    made = iter(range(100))
    state = PerThread(lambda: {"context": next(made)})
    seen: dict[str, list] = {}

    def client(name: str) -> None:
        seen[name] = [id(state.get()) for _ in range(5)]

    threads = [threading.Thread(target=client, args=(f"c{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(len(set(ids)) == 1 for ids in seen.values())  # a thread keeps its own
    assert len({ids[0] for ids in seen.values()}) == 4 and len(state.made) == 4  # no two threads share one


def test_a_runtimes_knowledge_lives_in_its_runner():
    """No code outside serve_bench/runners/ names a runtime: what a runtime knows about itself (the files it loads,
    its availability and install hint, its profiler, its smoke run, what the fingerprint and the bundle record of
    it) is asked of its runner class through the registry, by the bench, the doctor, the export and quantize
    stages, the release and the fingerprint alike. Only the algorithms that make a runtime's file format
    (compress/quantization/, export/) may name it, and the places listed below, each for the reason given."""
    import re
    from pathlib import Path

    from serve_bench.runners import RUNNERS

    root = Path(__file__).resolve().parents[1]
    named = re.compile(r"""(?<!format == )(?<!format != )(["'])(%s|trt)\1""" % "|".join(RUNNERS))
    found = [f"{path.relative_to(root)}:{i}: {line.strip()}"
             for folder in ("serve_bench", "compress") for path in sorted((root / folder).rglob("*.py"))
             if path.relative_to(root).parts[:2] not in (("serve_bench", "runners"), ("compress", "quantization"))
             for i, line in enumerate(path.read_text().splitlines(), 1) if named.search(line)]
    assert found == []  # the engine's one name is export.tensorrt_engine.ENGINE_KIND, the flavours' the flavour table
