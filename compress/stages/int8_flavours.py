"""Which INT8 files the quantize stage makes here, which runtime each one ships on, and what that runtime made of it.

One file per runtime, each made the way that runtime fuses it: ``cpu`` for onnxruntime (uint8 activations, the
only layout its x86 convolutions fuse), ``trt`` for TensorRT (symmetric int8), ``openvino`` quantized by NNCF,
which places its quantizers where OpenVINO's transformations turn them into int8 kernels (squeeze-excite blocks
left float, activations fused with their convolution). A runtime's file is judged, released and measured on that
runtime only; the CPU file is still checked on OpenVINO where no OpenVINO file is made.
"""
from __future__ import annotations

import logging
from typing import Literal

import numpy as np
from pydantic import Field

from compress.config import Strict
from compress.errors import ConfigError
from compress.quantization.flavours import CPU, FLAVOURS, ONNX_RUNTIME, ships_on
from compress.quantization.nncf_ptq import NNCFSettings, NNCFUnavailable, nncf_version
from compress.stages.runtime_choice import cpu_check_plan
from serve_bench.latency.operator_profile import profile_artifact
from serve_bench.runners import RunnerError, runtime_title
from serve_bench.runners.kernel_census import census_line

logger = logging.getLogger(__name__)

CENSUS_RUNS = 10  # profiled runs per file for the kernel census: the counts do not depend on the time


class OpenVinoFlavour(Strict):
    """How NNCF quantizes the OpenVINO file (its ONNX backend, on the stage's calibration images)."""

    preset: Literal["auto", "performance", "mixed"] = Field(
        "auto", description="auto: NNCF's own choice for the model type (performance, i.e. symmetric activations, "
                            "for CNNs; mixed for transformers); OpenVINO 2026.4 has no CPU kernel for some asymmetric "
                            "int8 layouts (measured: MobileNetV3 with mixed does not compile)")
    model_type: Literal["auto", "cnn", "transformer"] = Field(
        "auto", description="transformer: NNCF's scheme for attention networks; auto: where the graph has attention")

    def settings(self, samples: int) -> NNCFSettings:
        return NNCFSettings(preset=self.preset, samples=samples, model_type=self.model_type)


def flavour_plan(flavours: list[str], explicit: bool, runtimes: list[str] | None, stages: list[dict],
                 serve_batch: int, field: str) -> dict:
    """The flavours made here (a file for another runtime only where the bench measures on that runtime and what
    makes it is installed), those left out with why, and the runtimes besides onnxruntime the CPU file is checked
    on — with the options, threads, batch and versions of that check, all of it part of the stage's cache key."""
    plan = cpu_check_plan(runtimes, stages, serve_batch, f"{field}.runtimes")
    made, left_out, nncf = list(flavours), {}, None
    for name in flavours:
        flavour = FLAVOURS[name]
        if not flavour.ships or flavour.runtime == ONNX_RUNTIME:
            continue
        why = None
        if flavour.runtime not in plan["runtimes"]:
            why = f"{runtime_title(flavour.runtime)} is not usable here or not among the runtimes the bench measures on"
        elif flavour.made_by == "nncf":
            try:
                nncf = nncf_version()
            except NNCFUnavailable as exc:
                why = str(exc)
        if why and explicit:
            raise ConfigError(f"{field}.flavours: {name} cannot be made here: {why}; leave it out of the list")
        if why:
            made.remove(name)
            left_out[name] = why
    own_files = {FLAVOURS[f].runtime for f in made}  # a runtime with a file of its own no longer runs the CPU file
    checks = [r for r in plan["runtimes"] if r not in own_files] if CPU.name in made else []
    return {"flavours": made, "left_out": left_out, "runtimes": checks, "nncf": nncf,
            "versions": plan["versions"], "serve_batch": plan["serve_batch"], "threads": plan["threads"],
            "options": plan["options"]}


def kernel_census(files: dict[str, object], cpu_runtimes: list[str] | tuple[str, ...], sample: np.ndarray,
                  threads: int | None, options: dict) -> dict[str, dict]:
    """What each runtime made of each shipped file, from its own profile: ``{"cpu@onnxruntime": {integer, float,
    unfused_qdq, …}}``. A runtime that cannot profile the file here is recorded with its error."""
    out = {}
    for flavour, path in files.items():
        for runtime in ships_on(flavour, cpu_runtimes):
            try:
                profile = profile_artifact(runtime, str(path), sample[:1], threads=threads or 1, iters=CENSUS_RUNS,
                                           options=options.get(runtime))
            except RunnerError as exc:
                out[f"{flavour}@{runtime}"] = {"error": str(exc)}
                continue
            kernels = profile.get("kernels") or {}
            out[f"{flavour}@{runtime}"] = {**kernels, "unfused_qdq": len(profile.get("unfused_qdq") or []),
                                           "line": census_line(kernels, len(profile.get("unfused_qdq") or []))}
    return out
