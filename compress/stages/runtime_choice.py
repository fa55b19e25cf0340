"""Which runtimes a stage runs ONNX files on: the ones a pipeline names, each checked usable here, else every
usable one. The bench measures each file on them and the quantize ladder checks the CPU file's accuracy on them,
from this one rule, so the runtime a file is released on is always one its red line was checked on."""
from __future__ import annotations

from compress.errors import ConfigError
from serve_bench.runners import runtime_status, runtime_versions, usable_onnx_runtimes
from serve_bench.runners.openvino_runner import OpenVinoSettings


def onnx_runtimes(requested: list[str] | None, device: str, field: str) -> list[str]:
    """``requested`` in its order (the first keeps a file's own name in the bench), or every usable one."""
    if requested is None:
        return usable_onnx_runtimes(device)
    status = runtime_status(device)
    for runtime in requested:
        if status.get(runtime):
            raise ConfigError(f"{field}: {runtime} cannot run here ({status[runtime]}); install it or leave it out "
                              f"(usable here: {', '.join(usable_onnx_runtimes(device)) or 'none'})")
    return list(dict.fromkeys(requested))


def bench_plan(stages: list[dict]) -> dict:
    """How the pipeline's bench stages run ONNX files: the runtimes they name (None where any bench takes the
    default, every usable one), their device, and the last bench's OpenVINO options and threads. The quantize
    stage checks its CPU file's red line the same way, so the check covers what the bench may release."""
    benches = [s for s in stages if s.get("kind") == "bench"]
    named = None if not benches or any(s.get("runtimes") is None for s in benches) else \
        list(dict.fromkeys(r for s in benches for r in s["runtimes"]))
    last = benches[-1] if benches else {}
    return {"runtimes": named, "device": "cpu" if all(s.get("device", "cpu") == "cpu" for s in benches) else "cuda",
            "openvino": OpenVinoSettings(**(last.get("openvino") or {})).runner_options(), "threads": last.get("threads")}


def cpu_check_plan(requested: list[str] | None, stages: list[dict], serve_batch: int, field: str) -> dict:
    """The runtimes besides onnxruntime the quantize stage runs its CPU file through (``requested``, else what the
    bench stages measure on), with the options, threads, batch and library versions that make the check: all of it
    is in the stage's cache key, so installing OpenVINO or changing its settings re-checks."""
    plan = bench_plan(stages)
    if requested is not None:
        runtimes = onnx_runtimes(requested, "cpu", field)
    else:
        runtimes = onnx_runtimes(plan["runtimes"], plan["device"], f"{field} (default: the bench stages' runtimes)")
    others = [r for r in runtimes if r != "onnxruntime"]
    return {"runtimes": others, "versions": runtime_versions(others), "serve_batch": serve_batch,
            "threads": plan["threads"], "options": {r: plan[r] for r in others if r in plan}}
