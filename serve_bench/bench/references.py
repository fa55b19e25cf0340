"""Which candidate each candidate is compared with, besides the baseline: its fp32 file, the unpruned model's on
the same runtime (export alone), the unpruned model under torch.compile (compile alone)."""
from __future__ import annotations

from serve_bench.bench.specs import ArtifactSpec
from serve_bench.runners import RUNNERS


def fp32_reference(spec: ArtifactSpec, specs: list[ArtifactSpec]) -> ArtifactSpec | None:
    """The fp32 file of the model an INT8 file was quantized from, on the same runtime (its fp32 ONNX; for a torch
    INT8 file, the torch model compiled)."""
    if spec.precision != "int8" or not spec.source_model:
        return None
    return next((r for r in specs if r.precision == "fp32" and r.runtime == spec.runtime
                 and r.source_model == spec.source_model and r.extra.get("role") != "reference"
                 and r.extra.get("run") == spec.extra.get("run")), None)  # compare: the same run's


def reference_on_runtime(spec: ArtifactSpec, specs: list[ArtifactSpec]) -> ArtifactSpec | None:
    """The reference-only candidate (``extra.role: reference``, the unpruned model's fp32 ONNX) on ``spec``'s
    runtime: its latency ratio to it is what compression earned there."""
    if spec.extra.get("role") == "reference":
        return None
    same = [r for r in specs if r.extra.get("role") == "reference" and r.runtime == spec.runtime]
    # the one run the same way where there are several (torch.compile's fp32 and bf16 compile alone)
    return next((r for r in same if r.extra.get("variant") == spec.extra.get("variant")), same[0] if same else None)


def traffic_pairs(specs: list[ArtifactSpec]) -> dict[str, dict[str, str]]:
    """The file each INT8 file's server runs are paired with, round by round: its fp32 file (what the gate asks)."""
    return {spec.name: {"fp32": r.name} for spec in specs for r in [fp32_reference(spec, specs)] if r}


def compile_alone_of(spec: ArtifactSpec, specs: list[ArtifactSpec]) -> ArtifactSpec | None:
    """The unpruned model's fp32 reference on a compiling runtime (torch.compile), for every candidate on another
    runtime: its latency over it is the speed-up a PyTorch user gets from compression and the runtime together,
    over what they would deploy without either (on that compiling runtime, ``reference_on_runtime`` says it)."""
    if spec.extra.get("role") == "reference":
        return None
    return next((r for r in specs if r.extra.get("role") == "reference" and r.format == "torch"
                 and r.precision == "fp32" and r.runtime != spec.runtime
                 and not RUNNERS[r.runtime].measured_by_default), None)
