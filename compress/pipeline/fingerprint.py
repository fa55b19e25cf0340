"""What the numbers of a run were measured on, recorded once per run and in every report.

The CPU's model name alone does not explain a figure: two "AMD EPYC" machines here differ in
AVX-512, VNNI and native bf16, which decide the training precision and INT8 speed. So the
instruction-set facts and the runtimes' own view (each runner's ``fingerprint``: its version,
onnxruntime's providers) are recorded with them.
"""
from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version

from serve_bench.runners import RUNNERS
from train.hardware import cpu_model

# the libraries besides the runtimes' own (each runner names its distributions)
LIBRARIES = ("compress", "torchvision", "torch-pruning", "onnx", "torchao", "nncf", "numpy")


def packages_recorded() -> tuple[str, ...]:
    return tuple(dict.fromkeys([*LIBRARIES, *(p for runner in RUNNERS.values() for p in runner.packages)]))


def runtime_facts() -> dict[str, dict | None]:
    """Each runtime's fingerprint (None where it is not installed), from the runner registry."""
    return {name: runner.fingerprint() for name, runner in RUNNERS.items() if runner.formats}


def environment() -> dict:
    import os

    import torch

    from train.hardware import isa_facts, isa_words

    packages = {}
    for name in packages_recorded():
        try:
            packages[name] = version(name)
        except PackageNotFoundError:
            continue
    env = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "isa": (isa := isa_facts()),
        "isa_summary": isa_words(isa),
        "runtimes": runtime_facts(),
        "torch_threads": torch.get_num_threads(),
        "packages": packages,
        "cuda": torch.version.cuda,
        "gpu": None,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env["gpu"] = {"name": props.name, "capability": f"{props.major}.{props.minor}",
                      "memory_gb": round(props.total_memory / 2**30, 1)}
    return env


# What a measurement or an engine build depends on: a change in any of these makes cached latencies
# (and TensorRT's skip-or-build) describe another machine. The kernel string, thread defaults and
# core counts of the OS are left out (the bench sets its own threads; cores are in the ISA facts).
ENVIRONMENT_KEY = ("machine", "cpu", "isa", "runtimes", "packages", "cuda", "gpu", "python")


def environment_key(env: dict) -> dict:
    return {name: env.get(name) for name in ENVIRONMENT_KEY}
