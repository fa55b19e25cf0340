"""What the numbers of a run were measured on, recorded once per run."""
from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version

PACKAGES = ("compress", "torch", "torchvision", "torch-pruning", "onnx", "onnxruntime", "onnxruntime-gpu",
            "torchao", "tensorrt", "numpy")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment() -> dict:
    import os

    import torch

    packages = {}
    for name in PACKAGES:
        try:
            packages[name] = version(name)
        except PackageNotFoundError:
            continue
    env = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
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
