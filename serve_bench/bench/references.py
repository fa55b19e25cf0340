"""Which candidate each candidate is compared with, besides the baseline: its fp32 file, the unpruned model's on
the same runtime (export alone), the unpruned model under torch.compile (compile alone)."""
from __future__ import annotations

from serve_bench.bench.specs import ArtifactSpec
from serve_bench.runners import RUNNERS


def fp32_reference(spec: ArtifactSpec, specs: list[ArtifactSpec]) -> ArtifactSpec | None:
    """The fp32 file of the model an INT8 file was quantized from, on the same runtime (its fp32 ONNX; for a torch
    INT8 file, the torch model compiled). Where that runtime has no such file, the baseline's own file there, made as
    it is (export alone, compile alone): an INT8 file of the baseline in a pipeline with no export stage, PyTorch's
    own INT8 file of the baseline or of a pruned model whose fp32 file is not measured compiled. One rule for every
    INT8 file, whichever stage made its float counterpart: shown no faster than the float file the user could ship
    instead, quantization buys nothing."""
    if spec.precision != "int8" or not spec.source_model:
        return None
    run = spec.extra.get("run")  # compare: the same run's
    same = [r for r in specs if r.precision == "fp32" and r.runtime == spec.runtime and r.extra.get("run") == run
            and r.extra.get("role") != "reference" and r.source_model == spec.source_model]
    as_is = [r for r in specs if r.precision == "fp32" and r.runtime == spec.runtime and r.extra.get("run") == run
             and r.extra.get("role") == "reference" and not r.extra.get("variant")]
    own = [r for r in as_is if r.source_model == spec.source_model]  # the baseline's INT8 file: its own reference
    return (same or own or as_is or [None])[0]


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
