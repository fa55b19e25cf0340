"""One row per runtime: installed or not, its version, and the devices it sees here.

An installed wheel is not a working runtime (onnxruntime-gpu without its CUDA libraries, OpenVINO
without a CPU plugin, TensorRT without a GPU), so each row imports the library and asks it for its
devices. Every import happens here, inside the probe, so ``compress --help`` and the rest of the
command line never load these libraries; an absent one is a row with the command that installs it,
never a crash, and one that is installed but fails to import is a row saying how it failed.
"""
from __future__ import annotations

import importlib
import logging
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Callable

logger = logging.getLogger(__name__)

INSTALL = {
    "torch": "pip install compress (torch is a core dependency)",
    "onnxruntime": "pip install 'compress[cpu]' (or 'compress[gpu]' on a GPU machine)",
    "openvino": "pip install 'compress[cpu]'",
    "tensorrt": "pip install 'compress[tensorrt]' (on a machine with an NVIDIA GPU)",
    "nncf": "pip install 'compress[cpu]'",
    "mlperf_loadgen": "pip install mlcommons-loadgen (a core dependency of compress)",
}

OK, ABSENT, UNUSABLE, BROKEN = "ok", "not installed", "unusable here", "broken"


@dataclass
class RuntimeRow:
    name: str  # the import name (torch, onnxruntime, openvino, tensorrt, nncf, mlperf_loadgen)
    status: str  # ok | not installed | unusable here | broken
    version: str | None = None
    devices: list[str] = field(default_factory=list)
    detail: str = ""  # why not usable, how to install, or what else is worth knowing

    def as_dict(self) -> dict:
        return asdict(self)


def import_optional(module: str) -> Any | None:
    """The module, or None when it is not installed; raises when it is installed but fails to import
    (a missing dependency of its own, a shared library that does not load)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == module.split(".")[0]:
            return None
        raise


def _torch(torch) -> RuntimeRow:
    devices = ["cpu"]
    if torch.cuda.is_available():
        devices += [f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())]
    build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU-only build"
    return RuntimeRow("torch", OK, torch.__version__, devices,
                      f"{build}; CUDA device visible: {'yes' if torch.cuda.is_available() else 'no'}")


def _onnxruntime(ort) -> RuntimeRow:
    providers = list(ort.get_available_providers())
    detail = f"device {ort.get_device()}"
    if "CPUExecutionProvider" not in providers:
        return RuntimeRow("onnxruntime", UNUSABLE, ort.__version__, providers, f"{detail}; no CPUExecutionProvider")
    return RuntimeRow("onnxruntime", OK, ort.__version__, providers, detail)


def _openvino(ov) -> RuntimeRow:
    core = ov.Core()
    devices = []
    for device in core.available_devices:
        try:
            devices.append(f"{device}: {core.get_property(device, 'FULL_DEVICE_NAME')}")
        except RuntimeError as exc:  # a plugin that lists a device but cannot describe it
            devices.append(f"{device}: (name unreadable: {str(exc).splitlines()[0]})")
    status = OK if "CPU" in core.available_devices else UNUSABLE
    return RuntimeRow("openvino", status, ov.get_version(), devices, "" if status == OK else "no CPU device")


def _tensorrt(trt) -> RuntimeRow:
    from export.tensorrt_engine import unavailable_reason

    reason = unavailable_reason()
    return RuntimeRow("tensorrt", UNUSABLE if reason else OK, trt.__version__, [] if reason else ["cuda"],
                      reason or "engines build and run on this GPU")


def _nncf(nncf) -> RuntimeRow:
    return RuntimeRow("nncf", OK, nncf.__version__, [], "post-training quantization for OpenVINO")


def _loadgen(lg) -> RuntimeRow:
    try:
        found = version("mlcommons-loadgen")
    except PackageNotFoundError:
        found = None
    return RuntimeRow("mlperf_loadgen", OK, found, [], "MLPerf LoadGen: the latency-under-traffic scenarios")


PROBES: dict[str, Callable[[Any], RuntimeRow]] = {
    "torch": _torch, "onnxruntime": _onnxruntime, "openvino": _openvino, "tensorrt": _tensorrt, "nncf": _nncf,
    "mlperf_loadgen": _loadgen,
}


def probe(name: str) -> RuntimeRow:
    """The row of one runtime; whatever the library raises becomes the row, never the command's failure."""
    try:
        module = import_optional(name)
        if module is None:
            return RuntimeRow(name, ABSENT, detail=f"not installed: {INSTALL[name]}")
        return PROBES[name](module)
    except Exception as exc:  # a broken install raises anything (OSError, RuntimeError...): report, go on
        logger.info("%s is installed but broken", name, exc_info=True)
        return RuntimeRow(name, BROKEN, detail=f"{type(exc).__name__}: {_first_line(exc)}")


def runtime_rows() -> list[RuntimeRow]:
    return [probe(name) for name in PROBES]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "(no message)"
