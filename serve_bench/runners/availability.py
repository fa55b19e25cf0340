"""Which runtimes can run here, and why not: the bench's default runtimes and ``compress doctor`` read it.

Each check imports the library and asks it for a device, because an installed wheel is not a working
runtime (onnxruntime-gpu without CUDA libraries, OpenVINO without a CPU plugin).
"""
from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

ONNX_RUNTIMES = ("onnxruntime", "openvino")  # the runtimes that run an ONNX file, in the bench's order
INSTALL_HINT = {"onnxruntime": "pip install 'compress[cpu]' (or [gpu])", "openvino": "pip install 'compress[cpu]'"}


def _onnxruntime(device: str) -> str | None:
    try:
        import onnxruntime as ort
    except ImportError:
        return f"onnxruntime is not installed: {INSTALL_HINT['onnxruntime']}"
    wanted = "CPUExecutionProvider" if device == "cpu" else "CUDAExecutionProvider"
    if wanted not in ort.get_available_providers():
        return f"onnxruntime has no {wanted} here (providers: {', '.join(ort.get_available_providers())})"
    return None


def _openvino(device: str) -> str | None:
    if device != "cpu":
        return "the openvino runner runs on the CPU only"
    try:
        import openvino as ov
    except ImportError:
        return f"OpenVINO is not installed: {INSTALL_HINT['openvino']}"
    try:
        devices = ov.Core().available_devices
    except RuntimeError as exc:  # a plugin that fails to load
        return f"OpenVINO cannot list its devices: {str(exc).splitlines()[0]}"
    return None if "CPU" in devices else f"OpenVINO sees no CPU device (devices: {', '.join(devices) or 'none'})"


def runtime_status(device: str = "cpu") -> dict[str, str | None]:
    """Every ONNX runtime → None where it runs ONNX files on ``device`` here, else the reason it does not."""
    return {"onnxruntime": _onnxruntime(device), "openvino": _openvino(device)}


def runtime_versions(names: list[str]) -> dict[str, str | None]:
    """The installed version of each runtime named (None where it does not import): what a cached check ran on."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            if name == "openvino":
                import openvino

                out[name] = openvino.get_version()
            elif name == "onnxruntime":
                import onnxruntime

                out[name] = onnxruntime.__version__
            else:
                out[name] = None
        except ImportError:
            out[name] = None
    return out


def usable_onnx_runtimes(device: str = "cpu") -> list[str]:
    """The runtimes the bench measures each ONNX file on by default, in order (onnxruntime first)."""
    status = runtime_status(device)
    for name, reason in status.items():
        if reason:
            logger.info("%s is not measured: %s", name, reason)
    return [name for name in ONNX_RUNTIMES if status[name] is None]
