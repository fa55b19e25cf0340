"""The model servers' files for one released file, written together from the settings that were measured.

Layout (inside a release bundle's ``serving/``)::

    models/<model>/config.pbtxt     Triton's configuration of the model
    models/<model>/1/model.onnx     the served file (model.xml and .bin: OpenVINO's IR, for the OpenVINO runtime)
    config.json                     OpenVINO Model Server's configuration, base_path models/<model>

``models/`` is a Triton model repository and OVMS's model folder at once (OVMS reads only the numbered
version folders, Triton the config and the version folder), so the file is copied once. A file measured on
OpenVINO is saved as OpenVINO's IR, which both servers' OpenVINO paths read; its tensors keep the ONNX
file's names. What a server cannot take from the measured settings is said in ``notes``.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path

from pydantic import Field

from serve_bench.load.serving_loop import ServingSettings
from serve_bench.runners import RUNNERS
from serve_bench.servers.ovms.model_server_config import CONFIG_FILE as OVMS_CONFIG
from serve_bench.servers.ovms.model_server_config import check_config, model_server_config, write_config
from serve_bench.servers.tensors import ServedFileError, onnx_tensors
from serve_bench.servers.triton.model_repository import (CONFIG_FILE, VERSION, backends, check_model, config_text,
                                                         model_config)

log = logging.getLogger(__name__)

MODELS = "models"
SERVING_FOLDER = "serving"  # in a release bundle
CPU_SERVED = tuple(runtime for runtime, backend in backends().items() if backend.kind == "KIND_CPU")


class ServedSettings(ServingSettings):
    """The serving settings a deployment is written and served with: the bench's batcher and model copies as
    measured (serve_bench.load.serving_loop.ServingSettings), and the server's queue limit."""

    max_queue: int | None = Field(None, ge=1, description="requests waiting beyond which the server refuses more "
                                                          "(none: no limit)")
    measured: str = Field("", description="where these settings come from (the sweep's best, the at-target test)")


def model_name(artifact: str) -> str:
    """A model name both servers accept (letters, digits, '_' and '-')."""
    return re.sub(r"[^A-Za-z0-9_-]+", "_", artifact).strip("_") or "model"


def write_server_files(folder: Path, onnx_file: Path, runtime: str, settings: ServedSettings, name: str,
                       extra_files: list[Path] = ()) -> dict:
    """Write ``folder`` (which must not exist) for ``onnx_file`` measured on ``runtime``; its record for the
    model card. ``extra_files`` are the ONNX file's external-data files, copied beside it."""
    if runtime not in CPU_SERVED:
        raise ServedFileError(f"no CPU model-server configuration for {runtime!r} files; known: "
                              f"{', '.join(CPU_SERVED)}")
    inputs, outputs = onnx_tensors(onnx_file)
    model_dir = folder / MODELS / name
    version = model_dir / VERSION
    version.mkdir(parents=True)
    served = version / backends()[runtime].model_file
    RUNNERS[runtime].write_served_file(onnx_file, served, tuple(extra_files))
    config = model_config(name, runtime, inputs, outputs, max_batch=settings.max_batch,
                          queue_delay_us=settings.max_queue_delay_us, instances=settings.instances,
                          threads=settings.threads, max_queue=settings.max_queue)
    (model_dir / CONFIG_FILE).write_text(config_text(config))
    problems = check_model(model_dir, inputs, outputs)
    if problems:
        raise ServedFileError("; ".join(problems))
    write_config(folder / OVMS_CONFIG, model_server_config(name, f"{MODELS}/{name}", instances=settings.instances,
                                                           threads=settings.threads))
    notes = []
    if settings.max_batch > 1:
        notes.append(f"OpenVINO Model Server runs each request as it comes: the measured batching (up to "
                     f"{settings.max_batch}, {settings.max_queue_delay_us} µs) is Triton's only")
    if not RUNNERS[runtime].served_by_ovms:
        notes.append(f"OpenVINO Model Server runs this {runtime} file on OpenVINO, a runtime other than the one "
                     "measured")
    log.info("server files for %s: %s", name, folder)
    return {"model": name, "runtime": runtime, "triton_repository": MODELS, "triton_config":
            f"{MODELS}/{name}/{CONFIG_FILE}", "ovms_config": OVMS_CONFIG, "served_file":
            served.relative_to(folder).as_posix(), "settings": settings.model_dump(), "notes": notes}


def check_server_files(folder: Path, onnx_file: Path, record: dict) -> list[str]:
    """What would stop the servers loading ``folder`` as written, or make them answer other tensors than
    ``onnx_file``'s (the released file): Triton's schema and tensors, OVMS's schema and layout."""
    try:
        inputs, outputs = onnx_tensors(onnx_file)
    except ServedFileError as exc:
        return [str(exc)]
    model_dir = folder / MODELS / record["model"]
    return [*check_model(model_dir, inputs, outputs), *check_config(folder / record["ovms_config"])]


def queue_limit(budget_ms: float | None, service_ms: float | None, max_batch: int, instances: int) -> int | None:
    """The requests that may wait before the server refuses more: as many as the copies can finish within the p99
    budget, one closed-loop service time (batch 1, ``service_ms``) per batch of ``max_batch``. A request that finds
    more ahead of it would be answered past the budget, so a quick refusal (the client may retry elsewhere) serves
    it better than a late answer, and the queue cannot grow without bound. None without a budget or a time."""
    if not budget_ms or not service_ms or service_ms <= 0:
        return None
    return max(1, int(budget_ms // service_ms)) * max_batch * instances


def served_settings(entry, budget_ms: float | None) -> ServedSettings:
    """The serving settings to deploy ``entry`` (a report entry) with: those of what the gate read. Where it read
    the file's run through its server (``latency.measured_at: served``): the best configuration of the sweep
    through that server (:func:`served_sweep_choice`) with the queue limit it was served with, else that
    server's settings. Otherwise the in-process sweep's best configuration where a sweep ran, the at-target
    test's, or one copy unbatched."""
    traffic = entry.traffic
    served = traffic.served if traffic is not None else None
    if traffic is not None and traffic.measured_at == "served" and served is not None and served.run is not None:
        best = served_sweep_choice(entry, budget_ms)
        if best is not None:
            return ServedSettings(**best.serving.knobs(), max_queue=best.max_queue,
                                  measured=f"the served sweep's best configuration ({best.label}): the most load "
                                           "its server sustained within the budget")
        return ServedSettings(**{**served.settings, "measured": "the served run the gate read"})
    best = traffic.sweep.best if traffic is not None and traffic.sweep is not None else None
    run = traffic.at_target if traffic is not None else None
    if best is not None and best.serving is not None:
        serving, measured = best.serving, f"the serving sweep's best configuration ({best.label})"
    elif run is not None and run.serving is not None:
        serving, measured = run.serving, "the configuration of the test at the pipeline's traffic"
    else:
        serving, measured = None, "one copy, unbatched, the closed-loop threads: no traffic was measured"
    values = serving.knobs() if serving is not None else {"threads": (entry.runner or {}).get("threads")}
    settings = ServedSettings(**values, measured=measured)
    limit = queue_limit(budget_ms, entry.latency_ms.p50, settings.max_batch, settings.instances)
    return settings.model_copy(update={"max_queue": limit})



def served_sweep_choice(entry, budget_ms: float | None):
    """The configuration of ``entry``'s sweep through its server that ships, or None: the sweep's best, where it
    was judged against this budget (a report re-gated under another keeps the settings the gate read) and carried
    at least the pipeline's rate (the gated run was at that rate, with the at-target settings: a configuration
    shown to carry less does not replace them)."""
    traffic = entry.traffic
    sweep = traffic.served.sweep if traffic is not None and traffic.served is not None else None
    best = sweep.best if sweep is not None else None
    if best is None or best.serving is None or best.capacity is None or best.capacity.qps is None:
        return None
    if best.capacity.budget_ms != budget_ms or (traffic.target_qps and best.capacity.qps < traffic.target_qps):
        return None
    return next((c for c in sweep.configs if c.label == best.label), best)
