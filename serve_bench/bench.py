"""Measure a set of deployed artifacts against the baseline, in one run: latency and accuracy.

Every artifact, the fp32 torch baseline included, runs in its own worker process; latency
blocks are interleaved across them, then each computes its own predictions on the test split
through the same runner that was timed, so the numbers describe the file that ships. Each
number a release is gated on leaves here with its interval: accuracy (Wilson), the drop against the baseline
(paired, image by image), each percentile (over single requests and whole blocks), each latency ratio (over
shared rounds).

Three notions of speed leave here, each answering another question (see :func:`speed_figures`):
- ``latency_ms`` — service time of one request on a quiet machine: percentiles, their intervals,
  and ``latency_ms.throughput`` = batch / mean service time (what one idle worker could sustain);
- ``throughput`` — items per second of wall time (with ``concurrency`` > 1 the clients' rate, not 1 / latency);
- ``speedup_p99`` and ``latency_ratio`` — this artifact against the baseline, both from the
  same rounds (the harness runs every artifact in every round) and the same estimator:
  ``speedup_p99`` is exactly 1 / ``latency_ratio.p99.ratio`` and ``speedup_p99_ci`` its interval
  inverted, so the main table and the ratio table always agree.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace

import numpy as np

from serve_bench.accuracy.classification import accuracy, accuracy_intervals
from serve_bench.latency.harness import HarnessSettings, measure_interleaved
from serve_bench.latency.machine_load import load_summary
from serve_bench.latency.traffic import TrafficSettings, measure_traffic, wanted
from serve_bench.limits import Limits
from serve_bench.runners import RUNNERS
from serve_bench.runners.channel_widths import widths_against
from serve_bench.stats.latency_intervals import BlockedSamples, Ratio, block_bootstrap_ci, paired_ratio, repeat_spread
from serve_bench.stats.paired import paired_counts, paired_summary
from serve_bench.accuracy.predictions import Predictions, digest_of_test_split, hits, top_k
from serve_bench.accuracy.runtime_parity import runtime_parity, same_file_pairs
from serve_bench.stats.summary import PERCENTILES, bootstrap_ci, summarize
from serve_bench.accuracy.detection import detection_entries
from serve_bench.latency.worker import BenchWorker, WorkerError, all_ready
from train.detection.postprocess import NmsSettings
from train.progress import LiveBar


@dataclass
class ArtifactSpec:
    name: str
    stage: str
    backend: str  # torch | onnxruntime | openvino | tensorrt
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

    def __post_init__(self) -> None:
        self.artifact = self.artifact or self.name


def on_runtimes(spec: ArtifactSpec, runtimes: list[str], options: dict[str, dict] | None = None) -> list[ArtifactSpec]:
    """One candidate per runtime for an ONNX file ("file on runtime"), else the spec itself.

    The file on the first runtime keeps the artifact's own name (so gates, releases and comparisons made
    before another runtime existed still read the same names); on any other it is ``<artifact>@<runtime>``.
    ``options``: runtime → runner options for that runtime's candidates."""
    if spec.format != "onnx" or not runtimes:
        return [spec]
    out = []
    for i, runtime in enumerate(runtimes):
        name = spec.name if i == 0 else f"{spec.name}@{runtime}"
        extra = {**spec.extra, "runtime": runtime}
        opts = spec.options if runtime == spec.backend else dict((options or {}).get(runtime, {}))
        out.append(replace(spec, name=name, backend=runtime, options=opts, extra=extra, artifact=spec.artifact))
    return out


@dataclass
class TestSet:
    """The images an artifact is judged on; ``digest`` says whether two sets pair image by image."""

    images: np.ndarray
    labels: np.ndarray
    digest: str = ""
    targets: list[dict] | None = None  # a detector's test set: boxes, classes and crowd flags per image
    num_classes: int | None = None

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
    limits: Limits | None = None  # what the gate judges by: the capacity search reads its budget and rule
    profile_iters: int = 0  # per-operator profile of each artifact over this many runs (0: none)
    nms: dict | None = None  # a detector's NmsSettings: every timed request ends after NMS


@dataclass
class BenchResult:
    entries: list[dict]
    latencies: dict[str, BlockedSamples]
    predictions: Predictions  # on the baseline's test split
    infos: dict[str, dict]
    unpaired: dict[str, str]  # artifact → why its accuracy could not be paired with the baseline's
    traffic: dict | None = None  # report-level facts of the traffic measurement (the harness overhead)


def _pool(test: TestSet, batch_size: int) -> np.ndarray:
    return test.images[: max(batch_size * 64, 256)]


def _measure(workers: dict[str, BenchWorker], settings: BenchSettings, progress) -> tuple[dict, list[dict]]:
    """Every repeat's samples pooled per artifact (rounds kept distinct) and each repeat's percentiles."""
    pooled: dict[str, BlockedSamples] = {}
    walls = {name: [0.0, 0] for name in workers}
    short: set[str] = set()
    loads: dict[str, list] = {name: [] for name in workers}
    per_repeat: list[dict] = []
    next_round = 0
    # A bar with an ETA on a terminal (nothing in a log or CI) unless the caller follows the progress itself.
    with LiveBar(f"measuring {len(workers)} files", 100.0, live=None if progress is None else False) as bar:
        for repeat in range(settings.repeats):
            def step(done: float, repeat: int = repeat) -> None:  # the whole measurement's share done, 0 to 1
                share = (repeat + done) / settings.repeats
                progress(share) if progress is not None else bar.update(100.0 * share)

            measured = measure_interleaved(workers, settings.harness, step, first_round=next_round)
            next_round = 1 + max(max(m.blocked.rounds) for m in measured.values())
            per_repeat.append({name: {k: float(np.percentile(m.latencies_ms, q)) for k, q in PERCENTILES.items()}
                               for name, m in measured.items()})
            for name, m in measured.items():
                old = pooled.get(name)
                pooled[name] = m.blocked if old is None else BlockedSamples(old.blocks + m.blocked.blocks,
                                                                            old.rounds + m.blocked.rounds)
                walls[name][0] += m.wall_s
                walls[name][1] += m.requests
                loads[name] += m.other_load
                if m.short_of_floors:
                    short.add(name)
    return {"blocked": pooled, "walls": walls, "loads": loads, "short": short}, per_repeat


def _latency(blocked: BlockedSamples, settings: BenchSettings) -> dict:
    flat = blocked.flat
    summary = summarize(flat, settings.batch_size, settings.min_samples)
    out = summary.as_dict()
    out["p50_ci"] = [round(v, 6) for v in bootstrap_ci(flat, 50.0)]
    out["p50_ci_blocks"] = [round(v, 6) for v in block_bootstrap_ci(blocked, 50.0)]
    out["p99_ci_blocks"] = [round(v, 6) for v in block_bootstrap_ci(blocked, 99.0)]
    out["blocks"] = len(blocked.blocks)
    return out


def _ratios(a: BlockedSamples, b: BlockedSamples) -> dict[str, Ratio]:
    """``a``'s p50 and p99 over ``b``'s, round-paired (below 1: ``a`` is faster)."""
    return {key: paired_ratio(a, b, PERCENTILES[key]) for key in ("p50", "p99")}


def speed_figures(name: str, baseline: str, blocked: dict[str, BlockedSamples], wall_s: float, requests: int,
                  batch_size: int) -> dict:
    """The report keys of an artifact's speed besides its service time (``latency_ms``):

    - ``throughput``: items per measured wall-clock second;
    - ``latency_ratio``: its p50 and p99 over the baseline's, with round-paired (expanded percentile) intervals;
    - ``speedup_p99``: the baseline's p99 over its own, i.e. 1 / ``latency_ratio.p99.ratio`` from the same
      rounds, and ``speedup_p99_ci`` that ratio's interval inverted (a speed-up's low end is the ratio's high).
    """
    out = {"throughput": round(batch_size * requests / wall_s, 2)}
    if name == baseline:
        return {**out, "speedup_p99": 1.0, "speedup_p99_ci": [1.0, 1.0], "latency_ratio": None}
    ratios = _ratios(blocked[name], blocked[baseline])
    p99 = ratios["p99"]
    return {**out, "speedup_p99": round(1 / p99.ratio, 4),
            "speedup_p99_ci": [round(1 / p99.ci[1], 4), round(1 / p99.ci[0], 4)],
            "latency_ratio": {key: r.as_dict() for key, r in ratios.items()}}


def eval_batch_of(spec: ArtifactSpec, settings: BenchSettings) -> int:
    """The batch an artifact's test-split predictions are made in. OpenVINO's answers depend on it (with 2 threads,
    measured here on an INT8 file: logits of batches of 8 differ from batch 1 by up to 0.64, while batch 1 matched
    across thread counts), so its accuracy is measured at the batch it serves, the latency batch; the other
    runtimes answer alike at any batch and use ``eval_batch``, capped by what the file accepts."""
    if RUNNERS[spec.backend].answers_depend_on_batch:
        return settings.batch_size
    return min(settings.eval_batch, spec.max_batch or settings.eval_batch)


def served_batch(spec: ArtifactSpec, traffic: dict | None, measured_at: int) -> int | None:
    """The largest batch the sweep's recommended serving configuration forms for an OpenVINO file, where it is
    larger than the batch its accuracy was measured at (None otherwise). OpenVINO answers differently at another
    batch (see :func:`eval_batch_of`), so the card that recommends batching must state the accuracy at it."""
    if not RUNNERS[spec.backend].answers_depend_on_batch or not traffic:
        return None
    best = (traffic.get("sweep") or {}).get("best") or {}
    served = [best.get("serving"), (traffic.get("at_target") or {}).get("serving")]  # recommended, and gated
    batch = max(int((s or {}).get("max_batch") or 1) for s in served)
    return batch if batch > measured_at else None


def served_batch_accuracy(batch: int, served: np.ndarray, reference: np.ndarray, labels: np.ndarray,
                          metric: str, baseline_hits: np.ndarray | None = None, max_drop: float | None = None) -> dict:
    """The accuracy of the same test images answered in batches of ``batch``, with its Wilson interval, and how
    many of its top-1 answers differ from those the report's accuracy came from. Dynamic batching forms batches
    of every size up to the largest, so the largest is the one furthest from the measured batch."""
    acc = accuracy(served, labels)
    changed = int(np.count_nonzero(served.argmax(axis=1) != reference.argmax(axis=1)))
    out = {"batch": batch, metric: acc[metric], "ci": accuracy_intervals(acc)[metric], "n": acc["n"],
           "changed_answers": changed, "difference": round(acc[metric] - accuracy(reference, labels)[metric], 4)}
    if baseline_hits is not None:  # its drop against the baseline at that batch, paired image by image
        out["paired"] = paired_summary(paired_counts(baseline_hits, hits(top_k(served), labels, metric)), max_drop)
    return out


def _fp32_reference(spec: ArtifactSpec, specs: list[ArtifactSpec]) -> ArtifactSpec | None:
    """The fp32 ONNX of the model an INT8 file was quantized from, on the same runtime."""
    if spec.precision != "int8" or not spec.source_model:
        return None
    return next((r for r in specs if r.format == "onnx" and r.precision == "fp32" and r.backend == spec.backend
                 and r.source_model == spec.source_model and r.extra.get("role") != "reference"
                 and r.extra.get("run") == spec.extra.get("run")), None)  # compare: the same run's


def _reference_on_runtime(spec: ArtifactSpec, specs: list[ArtifactSpec]) -> ArtifactSpec | None:
    """The reference-only candidate (``extra.role: reference``, the unpruned model's fp32 ONNX) on ``spec``'s
    runtime: its latency ratio to it is what compression earned there."""
    if spec.extra.get("role") == "reference":
        return None
    return next((r for r in specs if r.extra.get("role") == "reference" and r.backend == spec.backend), None)


def _traffic_pairs(specs: list[ArtifactSpec]) -> dict[str, dict[str, str]]:
    """The file each INT8 file's server runs are paired with, round by round: its fp32 file (what the gate asks)."""
    return {spec.name: {"fp32": r.name} for spec in specs for r in [_fp32_reference(spec, specs)] if r}


def run_benchmark(specs: list[ArtifactSpec], baseline: str, test: TestSet, settings: BenchSettings,
                  progress=None, own_tests: dict[str, TestSet] | None = None, say=None) -> BenchResult:
    """Measure ``specs`` interleaved and judge their accuracy against ``baseline`` by ``settings.limits`` (its
    metric and red line; without limits: top-1, no red line). ``own_tests`` gives an artifact another test set than ``test`` (a compared run made on other data):
    its accuracy is measured there, and not paired with the baseline's unless the digests match. ``say`` gets a
    line per traffic test (default: this module's log). ``progress``, where given, is called after each round of
    the latency measurement with the share of it done (0 to 1, over all repeats) instead of drawing a bar."""
    if baseline not in {s.name for s in specs}:
        raise ValueError(f"baseline {baseline!r} is not among the measured artifacts")
    limits = settings.limits
    metric, max_drop = (limits.metric, limits.max_drop) if limits else ("top1", None)
    tests = {s.name: (own_tests or {}).get(s.name, test) for s in specs}
    with contextlib.ExitStack() as stack:
        workers = {}
        for spec in specs:
            options = {"threads": settings.threads, "device": RUNNERS[spec.backend].fixed_device or settings.device,
                       **spec.options, **({"postprocess": settings.nms} if settings.nms is not None else {})}
            workers[spec.name] = stack.enter_context(BenchWorker(
                spec.name, spec.backend, spec.path, options, _pool(tests[spec.name], settings.batch_size),
                settings.batch_size, settings.device_only, wait=False))
        all_ready(workers)
        measured, per_repeat = _measure(workers, settings, progress)
        logits, eval_batches = {}, {spec.name: eval_batch_of(spec, settings) for spec in specs}
        for spec in specs:
            logits[spec.name] = workers[spec.name].call("predict", tests[spec.name].images, eval_batches[spec.name])
        infos = {name: worker.info for name, worker in workers.items()}
        traffic, traffic_facts = {}, None
        if wanted(settings.traffic, settings.scenario):
            expected = {name: float(np.percentile(b.flat, 50)) for name, b in measured["blocked"].items()}
            swept = settings.traffic if settings.traffic.sweep_artifacts is not None else settings.traffic.model_copy(
                update={"sweep_artifacts": [s.name for s in specs if s.extra.get("role") != "reference"]})
            traffic, traffic_facts = measure_traffic(
                workers, scenario=settings.scenario, target_qps=settings.target_qps,
                budget_ms=limits.p99_budget_ms if limits else None, decision=limits.decision if limits else "point",
                settings=swept, settle_s=settings.harness.settle_s,
                expected_ms=expected, null_pool=_pool(test, 1)[:16], progress=say, pairs=_traffic_pairs(specs))
        profiles = {name: operator_profile(worker, settings) for name, worker in workers.items()}
        served = {spec.name: batch for spec in specs
                  if (batch := served_batch(spec, traffic.get(spec.name), eval_batches[spec.name]))}
        served_logits = {name: workers[name].call("predict", tests[name].images, batch)
                         for name, batch in served.items() if tests[name].targets is None}

    blocked = measured["blocked"]
    base_test = tests[baseline]
    judged = None
    if base_test.targets is not None:  # a detector: mAP with bootstrap intervals, paired on the one test split
        if any(tests[s.name].digest != base_test.digest for s in specs):
            raise ValueError("detectors are judged on one test split; every artifact must share the baseline's")
        judged = detection_entries([s.name for s in specs], logits, base_test.targets, base_test.num_classes,
                                   baseline, metric, max_drop, NmsSettings(**(settings.nms or {})))
    predictions = Predictions(labels=base_test.labels, test_digest=base_test.digest)
    unpaired = {}
    for spec in specs:
        if judged is not None:
            continue
        if tests[spec.name].digest == base_test.digest:
            predictions.add(spec.name, logits[spec.name])
        else:
            unpaired[spec.name] = (f"judged on another test split (digest {tests[spec.name].digest[:12]}… vs the "
                                   f"baseline's {base_test.digest[:12]}…): its accuracy is its own, not paired")
    latency = {name: _latency(b, settings) for name, b in blocked.items()}
    for name in measured["short"]:
        latency[name]["short_of_floors"] = True
    if judged is None:
        base_hits = predictions.hits(baseline, metric)
        accuracies = {s.name: accuracy(logits[s.name], tests[s.name].labels, settings.per_class) for s in specs}
        base_acc = accuracies[baseline][metric]
    else:
        accuracies = {name: j["accuracy"] for name, j in judged.items()}
    parity_of = same_file_pairs(specs)
    entries = []
    for spec in specs:
        acc = accuracies[spec.name]
        lat, wall = latency[spec.name], measured["walls"][spec.name]
        entry = {
            "name": spec.name, "artifact": spec.artifact, "stage": spec.stage, "backend": spec.backend, "precision": spec.precision,
            "format": spec.format, "path": spec.path, "size_bytes": spec.size_bytes, "params": spec.params,
            "macs": spec.macs, "accuracy": acc,
            "accuracy_ci": accuracy_intervals(acc) if judged is None else judged[spec.name]["accuracy_ci"],
            "eval_batch": eval_batches[spec.name],
            "accuracy_drop": (judged[spec.name]["accuracy_drop"] if judged is not None else
                              round(base_acc - acc[metric], 4) if spec.name not in unpaired else None),
            "latency_ms": lat, **speed_figures(spec.name, baseline, blocked, wall[0], wall[1], settings.batch_size),
            "runner": infos[spec.name],
            "source_model": spec.source_model, "machine_load": load_summary(measured["loads"][spec.name]),
            **({"traffic": traffic[spec.name]} if spec.name in traffic else {}),
            **({"operator_profile": profiles[spec.name]} if profiles.get(spec.name) else {}),
            **spec.extra,
            **({"refused": spec.refused} if spec.refused else {}),
            **({"quantization": spec.quantization} if spec.quantization else {}),
        }
        if judged is not None:
            entry["accuracy_paired"] = judged[spec.name]["accuracy_paired"]
            entry["postprocess_ms"] = judged[spec.name]["postprocess_ms"]
        elif spec.name in unpaired:
            entry["accuracy_paired"] = {"unpaired": unpaired[spec.name]}
        elif spec.name == baseline:
            entry["accuracy_paired"] = {"reference": True, "n": len(base_hits), "baseline_only": 0, "artifact_only": 0,
                                        "discordant": 0, "drop": 0.0, "drop_ci": [0.0, 0.0]}
        else:
            entry["accuracy_paired"] = paired_summary(paired_counts(base_hits, predictions.hits(spec.name, metric)),
                                                      max_drop)
        if judged is None and spec.name in parity_of and tests[spec.name].digest == tests[parity_of[spec.name]].digest:
            other = parity_of[spec.name]
            entry["runtime_parity"] = {**runtime_parity(other, logits[other], logits[spec.name], tests[spec.name].labels,
                                                        metric),
                                       "latency_ratio": {k: r.as_dict() for k, r in _ratios(blocked[spec.name],
                                                                                            blocked[other]).items()}}
        alone = _reference_on_runtime(spec, specs)
        if alone is not None:
            entry["vs_export_alone"] = {"reference": alone.name,
                                        **{k: r.as_dict() for k, r in _ratios(blocked[spec.name],
                                                                              blocked[alone.name]).items()}}
            widths = widths_against(spec.path, alone.path, spec.backend)
            if widths:
                entry["channel_widths"] = widths
        reference = _fp32_reference(spec, specs)
        if reference is not None:
            entry["int8_vs_fp32"] = {"reference": reference.name,
                                     **{k: r.as_dict() for k, r in _ratios(blocked[spec.name],
                                                                           blocked[reference.name]).items()}}
        if spec.name in served:
            entry["accuracy_at_serving_batch"] = (
                served_batch_accuracy(served[spec.name], served_logits[spec.name], logits[spec.name],
                                      tests[spec.name].labels, metric,
                                      base_hits if spec.name not in unpaired else None, max_drop)
                if spec.name in served_logits else
                {"batch": served[spec.name], "not_measured": "a detector's mAP is measured at its latency batch only"})
        if settings.repeats > 1:
            runs = [r[spec.name] for r in per_repeat]
            entry["repeats"] = {"k": settings.repeats, "per_repeat": [{k: round(v, 6) for k, v in r.items()}
                                                                      for r in runs],
                                "spread": repeat_spread(runs)}
        entries.append(entry)
    return BenchResult(entries, blocked, predictions if judged is None else None, infos, unpaired, traffic_facts)


def operator_profile(worker: BenchWorker, settings: BenchSettings) -> dict | None:
    """Where the time goes in one artifact, or why it was not profiled (a runtime without a profiler here)."""
    if settings.profile_iters <= 0:
        return None
    try:
        return worker.call("profile", settings.profile_iters, settings.threads)
    except WorkerError as exc:
        return {"error": str(exc).splitlines()[0]}
