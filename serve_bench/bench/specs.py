"""What a bench measures and how: the candidates (a file on a runtime), the test set, the settings, the result."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from serve_bench.accuracy.predictions import Predictions, digest_of_test_split
from serve_bench.latency.harness import HarnessSettings
from serve_bench.latency.traffic import TrafficSettings
from serve_bench.limits import Limits
from serve_bench.report_model import Entry
from serve_bench.runners import RUNNERS
from serve_bench.stats.latency_intervals import BlockedSamples


@dataclass
class ArtifactSpec:
    name: str
    stage: str
    runtime: str  # torch | onnxruntime | openvino | tensorrt
    path: str
    format: str
    precision: str
    size_bytes: int
    params: int | None = None
    macs: int | None = None
    max_batch: int | None = None
    options: dict = field(default_factory=dict)
    source_model: str | None = None  # the float model a converted artifact came from
    refused: str | None = None  # why the gate must not release it, decided before measuring
    quantization: dict | None = None  # how an INT8 artifact was made (ladder rungs)
    extra: dict = field(default_factory=dict)  # report keys a caller adds (e.g. the run a compared artifact is from)
    artifact: str | None = None  # the manifest's name of the file (a candidate "file on runtime" has its own name)
    runtime_in_name: bool = False  # whether a name made from this candidate (a search's contender) says its runtime

    def __post_init__(self) -> None:
        self.artifact = self.artifact or self.name


def on_runtimes(spec: ArtifactSpec, runtimes: list[str], options: dict[str, dict] | None = None) -> list[ArtifactSpec]:
    """One candidate per runtime that loads the file's format ("file on runtime"), and per way that runtime runs it
    (its runner's ``variants``: torch.compile's bf16); the spec itself where none of ``runtimes`` loads it.

    The file on the first runtime keeps the artifact's own name (so gates, releases and comparisons made
    before another runtime existed still read the same names); on any other it is ``<artifact>@<runtime>``, and a
    variant adds its suffix (``@inductor-bf16``). ``options``: runtime → runner options for that runtime's
    candidates."""
    runtimes = [r for r in runtimes if spec.format in RUNNERS[r].formats.values()]
    if not runtimes:
        return [spec]
    out = []
    for i, runtime in enumerate(runtimes):
        # the runtime's settings from the bench, on its home runtime too (PyTorch's own INT8 file on inductor, as the
        # quantize stage judged it); the file's own options (an ONNX file's inter-op threads) over them
        opts = {**dict((options or {}).get(runtime, {})), **(spec.options if runtime == spec.runtime else {})}
        for suffix, variant, precision in RUNNERS[runtime].variants(spec.format, opts):
            name = spec.name if i == 0 and not suffix else f"{spec.name}@{runtime}{suffix}"
            # a name that may need its runtime: an ONNX file's (several runtimes load ONNX alike), any file away from
            # its own runtime; a torch model in torch eager stays as reports have always named it
            plain = spec.format != "onnx" and runtime == spec.runtime and not suffix
            extra = {**spec.extra, **({"variant": suffix} if suffix else {})}
            out.append(replace(spec, name=name, runtime=runtime, options=variant, precision=precision or spec.precision,
                               extra=extra, artifact=spec.artifact, runtime_in_name=not plain))
    return out


@dataclass
class TestSet:
    """The images an artifact is judged on; ``digest`` says whether two sets pair image by image."""

    images: np.ndarray
    labels: np.ndarray
    digest: str = ""
    targets: list[dict] | None = None  # a detector's test set: boxes, classes and crowd flags per image
    num_classes: int | None = None
    task: str = "classification"  # which judge scores the answers (serve_bench.accuracy.judges)
    ignore_index: int | None = None  # a segmenter's: the mask value never scored
    class_names: list[str] | None = None

    def __post_init__(self) -> None:
        self.digest = self.digest or digest_of_test_split(self.images, self.labels)


@dataclass
class BenchSettings:
    harness: HarnessSettings
    batch_size: int = 1
    threads: int | None = None
    device: str = "cpu"
    device_only: bool = False
    min_samples: int = 1000
    per_class: bool = False
    eval_batch: int = 64
    repeats: int = 1  # whole interleaved measurements, for the run-to-run spread of each percentile
    traffic: TrafficSettings | None = None  # latency under traffic (LoadGen); None: closed loop only
    scenario: str = "single-stream"  # the pipeline's latency scenario and the rate it must carry
    target_qps: float | None = None
    measured_at: str = "in_process"  # where the gated server p99 is measured: in_process, or served (its server)
    limits: Limits | None = None  # what the gate judges by: the capacity search reads its budget and rule
    profile_iters: int = 0  # per-operator profile of each artifact over this many runs (0: none)
    nms: dict | None = None  # a detector's NmsSettings: every timed request ends after NMS
    predict_as: str = "logits"  # what a worker hands back for accuracy: logits, or their argmax (a segmenter's mask)


@dataclass
class BenchResult:
    entries: list[Entry]  # the report's typed entries, built as such by the bench
    latencies: dict[str, BlockedSamples]
    predictions: Predictions  # on the baseline's test split
    infos: dict[str, dict]
    unpaired: dict[str, str]  # artifact → why its accuracy could not be paired with the baseline's
    traffic: dict | None = None  # report-level facts of the traffic measurement (the harness overhead)
