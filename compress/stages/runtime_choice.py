"""Which runtimes a stage runs ONNX files on: the ones a pipeline names, each checked usable here, else every
usable one. The bench measures each file on them and the quantize ladder checks the CPU file's accuracy on them,
from this one rule, so the runtime a file is released on is always one its red line was checked on."""
from __future__ import annotations

from compress.errors import ConfigError
from serve_bench.runners import (ONNX_RUNTIMES, RUNNER_OF_KIND, RUNNERS, InductorRunner, runtime_status,
                                 runtime_versions, usable_onnx_runtimes)


def onnx_runtimes(requested: list[str] | None, device: str, field: str) -> list[str]:
    """The ONNX runtimes among ``requested`` in its order (the first keeps a file's own name in the bench), or every
    usable one."""
    if requested is None or not any(r in ONNX_RUNTIMES for r in requested):
        return usable_onnx_runtimes(device)
    return _usable([r for r in requested if r in ONNX_RUNTIMES], device, field)


def _usable(requested: list[str], device: str, field: str) -> list[str]:
    status = {**runtime_status(device),
              **{r: RUNNERS[r].unavailable(device) for r in requested if r not in ONNX_RUNTIMES}}
    for runtime in requested:
        if status.get(runtime):
            raise ConfigError(f"{field}: {runtime} cannot run here ({status[runtime]}); install it or leave it out "
                              f"(usable here: {', '.join(usable_onnx_runtimes(device)) or 'none'})")
    return list(dict.fromkeys(requested))


def bench_runtimes(cfg) -> list[str]:
    """Every runtime a bench stage measures files on: its ONNX runtimes (:func:`onnx_runtimes`), then the others it
    names (each checked usable here), and inductor where the deprecated ``torch_compile`` asks for it."""
    field = f"stages.{cfg.name}.runtimes"
    others = [r for r in cfg.runtimes or [] if r not in ONNX_RUNTIMES]
    if getattr(cfg, "torch_compile", False) and InductorRunner.runtime not in others:  # the old switch, deprecated
        others.append(InductorRunner.runtime)
    return onnx_runtimes(cfg.runtimes, cfg.device, field) + _usable(others, cfg.device, field)


def runtimes_for_kind(kind: str, chosen: list[str]) -> list[str]:
    """The runtimes among ``chosen`` that load this kind of file; where none of them is measured by default (a
    torch model with only inductor named) it is added, and wherever it is measured it comes first, so torch eager
    keeps the model's own name (the baseline's) whatever order the runtimes are named in."""
    on = [r for r in chosen if kind in RUNNERS[r].formats]
    home = RUNNER_OF_KIND.get(kind)
    if home and (home in on or not any(RUNNERS[r].measured_by_default for r in on)):
        on = [home] + [r for r in on if r != home]  # the home runtime first: it keeps the file's name (the baseline)
    return on


def runtime_settings(cfg) -> dict[str, dict]:
    """Runtime → the runner options a bench stage's settings give it (the field named after the runtime, of its
    runner's ``settings`` class), as configured, not as a runtime resolved them on some machine."""
    return {name: getattr(cfg, name).runner_options() for name, runner in RUNNERS.items()
            if runner.settings is not None and getattr(cfg, name, None) is not None}


def bench_plan(stages: list[dict]) -> dict:
    """How the pipeline's bench stages run ONNX files: the runtimes they name (None where any bench takes the
    default, every usable one), their device, and the last bench's OpenVINO options and threads. The quantize
    stage checks its CPU file's red line the same way, so the check covers what the bench may release."""
    benches = [s for s in stages if s.get("kind") == "bench"]
    named = None if not benches or any(s.get("runtimes") is None for s in benches) else \
        list(dict.fromkeys(r for s in benches for r in s["runtimes"]))
    last = benches[-1] if benches else {}
    options = {name: runner.settings(**(last.get(name) or {})).runner_options()
               for name, runner in RUNNERS.items() if runner.settings is not None}
    return {"runtimes": named, "device": "cpu" if all(s.get("device", "cpu") == "cpu" for s in benches) else "cuda",
            **options, "threads": last.get("threads")}


def cpu_check_plan(requested: list[str] | None, stages: list[dict], serve_batch: int, field: str) -> dict:
    """The runtimes besides onnxruntime the quantize stage runs its CPU file through (``requested``, else what the
    bench stages measure on), with the options, threads, batch and library versions that make the check: all of it
    is in the stage's cache key, so installing OpenVINO or changing its settings re-checks."""
    plan = bench_plan(stages)
    if requested is not None:
        runtimes = onnx_runtimes(requested, "cpu", field)
    else:
        runtimes = onnx_runtimes(plan["runtimes"], plan["device"], f"{field} (default: the bench stages' runtimes)")
    others = [r for r in runtimes if r != RUNNER_OF_KIND["onnx"]]
    return {"runtimes": others, "versions": runtime_versions(others), "serve_batch": serve_batch,
            "threads": plan["threads"], "options": {r: plan[r] for r in others if r in plan}}
