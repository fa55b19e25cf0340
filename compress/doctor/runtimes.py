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

# libraries the doctor lists beside the runtimes (each runtime's own hint is on its runner)
INSTALL = {
    "nncf": "pip install 'compress[cpu]'",
    "mlperf_loadgen": "pip install mlcommons-loadgen (a core dependency of compress)",
}

OK, ABSENT, UNUSABLE, BROKEN = "ok", "not installed", "unusable here", "broken"


@dataclass
class RuntimeRow:
    name: str  # a runtime's name in the registry, or a library's import name (nncf, mlperf_loadgen)
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


def _nncf(nncf) -> RuntimeRow:
    return RuntimeRow("nncf", OK, nncf.__version__, [], "post-training quantization for OpenVINO")


def _loadgen(lg) -> RuntimeRow:
    try:
        found = version("mlcommons-loadgen")
    except PackageNotFoundError:
        found = None
    return RuntimeRow("mlperf_loadgen", OK, found, [], "MLPerf LoadGen: the latency-under-traffic scenarios")


PROBES: dict[str, Callable[[Any], RuntimeRow]] = {"nncf": _nncf, "mlperf_loadgen": _loadgen}


def runtime_names() -> list[str]:
    """Every runtime a pipeline can measure files on, in the registry's order (the harness's simulated one aside)."""
    from serve_bench.runners import RUNNERS

    return [name for name, runner in RUNNERS.items() if runner.formats]


def _runtime(name: str) -> RuntimeRow:
    """A runtime's row, from what its runner says of this machine."""
    from serve_bench.runners import RUNNERS

    runner = RUNNERS[name]
    if import_optional(runner.library) is None:
        return RuntimeRow(name, ABSENT, detail=f"not installed: {runner.install_hint}")
    facts = runner.here()
    return RuntimeRow(name, UNUSABLE if facts["unusable"] else OK, facts["version"], list(facts["devices"]),
                      facts["detail"])


def probe(name: str) -> RuntimeRow:
    """The row of one runtime or library; whatever the library raises becomes the row, never the command's
    failure."""
    try:
        if name not in PROBES:
            return _runtime(name)
        module = import_optional(name)
        if module is None:
            return RuntimeRow(name, ABSENT, detail=f"not installed: {INSTALL[name]}")
        return PROBES[name](module)
    except Exception as exc:  # a broken install raises anything (OSError, RuntimeError...): report, go on
        logger.info("%s is installed but broken", name, exc_info=True)
        return RuntimeRow(name, BROKEN, detail=f"{type(exc).__name__}: {_first_line(exc)}")


def runtime_rows() -> list[RuntimeRow]:
    return [probe(name) for name in [*runtime_names(), *PROBES]]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "(no message)"
