"""Every runtime by name, and what the rest of the project asks of them: which runtime loads a kind of file, which
can run here and why not, their versions. Adding a runtime is a runner module (or folder) plus one line here."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from serve_bench.runners.base import Runner, RunnerError
from serve_bench.runners.inductor import InductorRunner
from serve_bench.runners.onnxruntime_runner import OnnxRuntimeRunner
from serve_bench.runners.openvino_runner import OpenVinoRunner
from serve_bench.runners.simulated import SimulatedRunner
from serve_bench.runners.tensorrt_runner import TensorRTRunner
from serve_bench.runners.torch_runner import TorchRunner

logger = logging.getLogger(__name__)

# in the order reports and the doctor list them; for a kind of file, the first that loads it is its home runtime
RUNNERS: dict[str, type[Runner]] = {r.runtime: r for r in (TorchRunner, OnnxRuntimeRunner, OpenVinoRunner,
                                                          TensorRTRunner, InductorRunner, SimulatedRunner)}
RUNNER_OF_KIND: dict[str, str] = {}
for _name, _runner in RUNNERS.items():
    for _kind in _runner.formats:
        RUNNER_OF_KIND.setdefault(_kind, _name)
FORMER_KINDS: dict[str, str] = {old: new for r in RUNNERS.values() for old, new in r.former_kinds.items()}
# the runtimes that run an ONNX file, in the bench's order (the first keeps a file's own name)
ONNX_RUNTIMES = tuple(name for name, r in RUNNERS.items() if "onnx" in r.formats)


def make_runner(runtime: str, path: str | Path, **kwargs: Any) -> Runner:
    if runtime not in RUNNERS:
        raise RunnerError(f"unknown runtime {runtime!r}; known: {', '.join(RUNNERS)}")
    return RUNNERS[runtime](path, **kwargs)


def runtime_title(runtime: str) -> str:
    """The runtime's name as messages write it (its runner's ``title``, else its registry name)."""
    runner = RUNNERS.get(runtime)
    return (runner.title if runner is not None else "") or runtime


def current_kind(kind: str, where: str) -> str:
    """``kind`` under its current name: a former one (a manifest or card written before a rename) is read as today's,
    and said in the log, naming ``where`` it was read."""
    if kind not in FORMER_KINDS:
        return kind
    logger.warning("%s: artifact kind %r is a former name of %r (deprecated); read as %r", where, kind,
                   FORMER_KINDS[kind], FORMER_KINDS[kind])
    return FORMER_KINDS[kind]


def runtimes_of_kind(kind: str) -> list[str]:
    """Every runtime that loads this kind of file, its home runtime first."""
    home = RUNNER_OF_KIND.get(kind)
    return ([home] if home else []) + [n for n, r in RUNNERS.items() if kind in r.formats and n != home]


def format_of_kind(kind: str) -> str:
    """How reports name a kind of file's format (``torch``, ``onnx``, ``engine``): its home runtime's word."""
    home = RUNNER_OF_KIND.get(kind)
    return RUNNERS[home].formats[kind] if home else kind


def runtime_status(device: str = "cpu", names: tuple[str, ...] = ONNX_RUNTIMES) -> dict[str, str | None]:
    """Each runtime named → None where it runs files on ``device`` here, else the reason it does not."""
    return {name: RUNNERS[name].unavailable(device) for name in names}


def runtime_versions(names: list[str]) -> dict[str, str | None]:
    """The installed version of each runtime named (None where it does not import): what a cached check ran on."""
    return {name: RUNNERS[name].version() if name in RUNNERS else None for name in names}


def usable_onnx_runtimes(device: str = "cpu") -> list[str]:
    """The runtimes the bench measures each ONNX file on by default, in order (onnxruntime first)."""
    status = runtime_status(device)
    for name, reason in status.items():
        if reason:
            logger.info("%s is not measured: %s", name, reason)
    return [name for name in ONNX_RUNTIMES if status[name] is None and RUNNERS[name].measured_by_default]
