"""``run_benchmark``: every candidate in its own worker, measured interleaved, judged against the baseline, each
step its own function: the workers' answers (:func:`_answers`), the accuracy judged (:func:`_accuracies`), one
report entry per candidate (:func:`_entry`) with its comparisons (:func:`_comparisons`)."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np

from serve_bench.accuracy.classification import accuracy, accuracy_intervals
from serve_bench.accuracy.judges import JUDGES
from serve_bench.accuracy.predictions import Predictions
from serve_bench.accuracy.runtime_parity import runtime_parity, same_file_pairs
from serve_bench.bench.batches import eval_batch_of, served_batch, served_batch_accuracy
from serve_bench.bench.measure import latency_of, measure_rounds, operator_profile, paired_ratios, pool_of, speed_figures
from serve_bench.bench.references import compile_alone_of, fp32_reference, reference_on_runtime, traffic_pairs
from serve_bench.bench.specs import ArtifactSpec, BenchResult, BenchSettings, TestSet
from serve_bench.latency.machine_load import load_summary
from serve_bench.latency.traffic import measure_traffic, wanted
from serve_bench.latency.worker import BenchWorker, all_ready
from serve_bench.report_model import Entry, entries
from serve_bench.runners import RUNNERS
from serve_bench.runners.channel_widths import widths_against
from serve_bench.stats.latency_intervals import repeat_spread
from serve_bench.stats.paired import paired_counts, paired_summary


@dataclass
class _Answers:
    """What the workers answered: latency rounds, predictions, runner facts, traffic, profiles."""

    measured: dict
    per_repeat: list[dict]
    logits: dict[str, np.ndarray]
    eval_batches: dict[str, int]
    infos: dict[str, dict]
    traffic: dict
    traffic_facts: dict | None
    profiles: dict
    served: dict[str, int]
    served_logits: dict[str, np.ndarray]


@dataclass
class _Judged:
    """The accuracy side: predictions paired on the baseline's split, or the entries a task's judge gave (a
    detector's, a segmenter's: paired image bootstrap)."""

    predictions: Predictions
    unpaired: dict[str, str]
    accuracies: dict[str, dict]
    judged: dict | None
    base_hits: np.ndarray | None
    base_acc: float | None


def run_benchmark(specs: list[ArtifactSpec], baseline: str, test: TestSet, settings: BenchSettings,
                  progress=None, own_tests: dict[str, TestSet] | None = None, say=None) -> BenchResult:
    """Measure ``specs`` interleaved and judge their accuracy against ``baseline`` by ``settings.limits`` (its
    metric and red line; without limits: top-1, no red line). ``own_tests`` gives an artifact another test set than
    ``test`` (a compared run made on other data): its accuracy is measured there, and not paired with the
    baseline's unless the digests match. ``say`` gets a line per traffic test (default: this module's log).
    ``progress``, where given, is called after each round of the latency measurement with the share of it done
    (0 to 1, over all repeats) instead of drawing a bar."""
    if baseline not in {s.name for s in specs}:
        raise ValueError(f"baseline {baseline!r} is not among the measured artifacts")
    tests = {s.name: (own_tests or {}).get(s.name, test) for s in specs}
    answers = _answers(specs, tests, test, settings, progress, say)
    metric, max_drop = (settings.limits.metric, settings.limits.max_drop) if settings.limits else ("top1", None)
    judged = _accuracies(specs, tests, baseline, answers.logits, settings, metric, max_drop)
    blocked = answers.measured["blocked"]
    latency = {name: latency_of(b, settings) for name, b in blocked.items()}
    for name in answers.measured["short"]:
        latency[name]["short_of_floors"] = True
    entries = [_entry(spec, specs, baseline, tests, settings, answers, judged, latency, metric, max_drop)
               for spec in specs]
    return BenchResult(entries, blocked, judged.predictions if judged.judged is None else None, answers.infos,
                       judged.unpaired, answers.traffic_facts)


def _answers(specs: list[ArtifactSpec], tests: dict[str, TestSet], test: TestSet, settings: BenchSettings,
             progress, say) -> _Answers:
    """Start a worker per candidate, then ask them in turn: latency rounds, predictions, traffic, profiles, and
    predictions at a serving batch where a runtime answers differently there."""
    limits = settings.limits
    with contextlib.ExitStack() as stack:
        workers = {}
        for spec in specs:
            options = {"threads": settings.threads, "device": RUNNERS[spec.runtime].fixed_device or settings.device,
                       **spec.options, **({"postprocess": settings.nms} if settings.nms is not None else {}),
                       **({"predict_as": settings.predict_as} if settings.predict_as != "logits" else {})}
            workers[spec.name] = stack.enter_context(BenchWorker(
                spec.name, spec.runtime, spec.path, options, pool_of(tests[spec.name], settings.batch_size),
                settings.batch_size, settings.device_only, wait=False))
        all_ready(workers)
        measured, per_repeat = measure_rounds(workers, settings, progress)
        eval_batches = {spec.name: eval_batch_of(spec, settings) for spec in specs}
        logits = {spec.name: workers[spec.name].call("predict", tests[spec.name].images, eval_batches[spec.name])
                  for spec in specs}
        infos = {name: worker.info for name, worker in workers.items()}
        traffic, traffic_facts = {}, None
        if wanted(settings.traffic, settings.scenario):
            expected = {name: float(np.percentile(b.flat, 50)) for name, b in measured["blocked"].items()}
            swept = settings.traffic  # every candidate, the baseline's own files too: each may be released
            if settings.measured_at == "served":  # the gate reads the served p99: every servable file is served
                swept = swept.model_copy(update={"served": True})
            traffic, traffic_facts = measure_traffic(
                workers, scenario=settings.scenario, target_qps=settings.target_qps,
                budget_ms=limits.p99_budget_ms if limits else None, decision=limits.decision if limits else "point",
                settings=swept, settle_s=settings.harness.settle_s,
                expected_ms=expected, null_pool=pool_of(test, 1)[:16], progress=say, pairs=traffic_pairs(specs),
                servable=servable_files(specs, settings), served_pool=pool_of(test, 1),
                measured_at=settings.measured_at)
        profiles = {name: operator_profile(worker, settings) for name, worker in workers.items()}
        served = {spec.name: batch for spec in specs
                  if (batch := served_batch(spec, traffic.get(spec.name), eval_batches[spec.name]))}
        served_logits = {name: workers[name].call("predict", tests[name].images, batch)
                         for name, batch in served.items() if tests[name].task not in JUDGES}  # top-k, paired by image
    return _Answers(measured, per_repeat, logits, eval_batches, infos, traffic, traffic_facts, profiles, served,
                    served_logits)


def servable_files(specs: list[ArtifactSpec], settings: BenchSettings) -> dict[str, dict]:
    """The files a model server here can run (an ONNX file on a CPU runtime), with the options the bench ran them
    with: the served scenario's candidates."""
    from serve_bench.servers.deployment import CPU_SERVED

    return {spec.name: {"runtime": spec.runtime, "path": spec.path,
                        "options": dict(spec.options)}
            for spec in specs if spec.format == "onnx" and spec.runtime in CPU_SERVED}


def _accuracies(specs: list[ArtifactSpec], tests: dict[str, TestSet], baseline: str, logits: dict[str, np.ndarray],
                settings: BenchSettings, metric: str, max_drop: float | None) -> _Judged:
    """Each candidate's accuracy, paired image by image with the baseline's where they share its test split (a
    detector: mAP with bootstrap intervals, on the one split every candidate must share)."""
    base_test = tests[baseline]
    judge = JUDGES.get(base_test.task)
    if judge is not None:
        if any(tests[s.name].digest != base_test.digest for s in specs):
            raise ValueError(f"a {base_test.task} model is judged on one test split; every artifact must share the "
                             "baseline's")
        judged = judge([s.name for s in specs], logits, base_test, baseline, metric, max_drop, settings.nms)
        return _Judged(Predictions(labels=base_test.labels, test_digest=base_test.digest), {},
                       {name: j["accuracy"] for name, j in judged.items()}, judged, None, None)
    predictions = Predictions(labels=base_test.labels, test_digest=base_test.digest)
    unpaired = {}
    for spec in specs:
        if tests[spec.name].digest == base_test.digest:
            predictions.add(spec.name, logits[spec.name])
        else:
            unpaired[spec.name] = (f"judged on another test split (digest {tests[spec.name].digest[:12]}… vs the "
                                   f"baseline's {base_test.digest[:12]}…): its accuracy is its own, not paired")
    accuracies = {s.name: accuracy(logits[s.name], tests[s.name].labels, settings.per_class) for s in specs}
    return _Judged(predictions, unpaired, accuracies, None, predictions.hits(baseline, metric),
                   accuracies[baseline][metric])


def _entry(spec: ArtifactSpec, specs: list[ArtifactSpec], baseline: str, tests: dict[str, TestSet],
           settings: BenchSettings, answers: _Answers, judged: _Judged, latency: dict, metric: str,
           max_drop: float | None) -> Entry:
    """One candidate's report entry, as the report's typed ``Entry`` (refused here, the field named, where a
    measurement does not fit it): what it is, its accuracy and latency, and its comparisons."""
    acc, task_judged = judged.accuracies[spec.name], judged.judged
    wall = answers.measured["walls"][spec.name]
    blocked = answers.measured["blocked"]
    profile = answers.profiles.get(spec.name)
    entry = {
        "name": spec.name, "artifact": spec.artifact, "stage": spec.stage, "runtime": spec.runtime,
        "precision": spec.precision, "format": spec.format, "path": spec.path, "size_bytes": spec.size_bytes,
        "params": spec.params, "macs": spec.macs, "accuracy": acc,
        "accuracy_ci": accuracy_intervals(acc) if task_judged is None else task_judged[spec.name]["accuracy_ci"],
        "eval_batch": answers.eval_batches[spec.name],
        "accuracy_drop": (task_judged[spec.name]["accuracy_drop"] if task_judged is not None else
                          round(judged.base_acc - acc[metric], 4) if spec.name not in judged.unpaired else None),
        "latency_ms": latency[spec.name], **speed_figures(spec.name, baseline, blocked, wall[0], wall[1],
                                                          settings.batch_size),
        "runner": answers.infos[spec.name],
        "source_model": spec.source_model, "machine_load": load_summary(answers.measured["loads"][spec.name]),
        **({"traffic": answers.traffic[spec.name]} if spec.name in answers.traffic else {}),
        **({"operator_profile": profile} if profile else {}),
        **spec.extra,
        **({"refused": spec.refused} if spec.refused else {}),
        **({"quantization": spec.quantization} if spec.quantization else {}),
    }
    if task_judged is not None:
        entry.update({k: v for k, v in task_judged[spec.name].items()
                      if k not in ("accuracy", "accuracy_ci", "accuracy_drop")})  # paired drop, per class, NMS time
    elif spec.name in judged.unpaired:
        entry["accuracy_paired"] = {"unpaired": judged.unpaired[spec.name]}
    elif spec.name == baseline:
        entry["accuracy_paired"] = {"reference": True, "n": len(judged.base_hits), "baseline_only": 0,
                                    "artifact_only": 0, "discordant": 0, "drop": 0.0, "drop_ci": [0.0, 0.0]}
    else:
        entry["accuracy_paired"] = paired_summary(
            paired_counts(judged.base_hits, judged.predictions.hits(spec.name, metric)), max_drop)
    entry.update(_comparisons(spec, specs, tests, answers, judged, metric, max_drop))
    if settings.repeats > 1:
        runs = [r[spec.name] for r in answers.per_repeat]
        entry["repeats"] = {"k": settings.repeats, "per_repeat": [{k: round(v, 6) for k, v in r.items()}
                                                                  for r in runs],
                            "spread": repeat_spread(runs)}
    return entries([entry])[0]


def _ratio_pair(blocked: dict, name: str, reference: ArtifactSpec) -> dict:
    return {"reference": reference.name, **{k: r.as_dict() for k, r in paired_ratios(blocked[name],
                                                                              blocked[reference.name]).items()}}


def _comparisons(spec: ArtifactSpec, specs: list[ArtifactSpec], tests: dict[str, TestSet], answers: _Answers,
                 judged: _Judged, metric: str, max_drop: float | None) -> dict:
    """The candidate against the same file on another runtime, the unpruned model exported alone and compiled
    alone, its fp32 file, and its accuracy at the batch its serving configuration forms."""
    out: dict = {}
    blocked, logits = answers.measured["blocked"], answers.logits
    other = same_file_pairs(specs).get(spec.name)
    if judged.judged is None and other is not None and tests[spec.name].digest == tests[other].digest:
        out["runtime_parity"] = {**runtime_parity(other, logits[other], logits[spec.name], tests[spec.name].labels,
                                                  metric),
                                 "latency_ratio": {k: r.as_dict() for k, r in paired_ratios(blocked[spec.name],
                                                                                      blocked[other]).items()}}
    alone = reference_on_runtime(spec, specs)
    if alone is not None:
        out["vs_export_alone"] = _ratio_pair(blocked, spec.name, alone)
        widths = widths_against(spec.path, alone.path, spec.runtime) if alone.format == spec.format == "onnx" else None
        if widths:
            out["channel_widths"] = widths
    compiled = compile_alone_of(spec, specs)
    if compiled is not None:
        out["vs_compile_alone"] = _ratio_pair(blocked, spec.name, compiled)
    reference = fp32_reference(spec, specs)
    if reference is not None:
        out["int8_vs_fp32"] = _ratio_pair(blocked, spec.name, reference)
    if spec.name in answers.served:
        batch = answers.served[spec.name]
        out["accuracy_at_serving_batch"] = (
            served_batch_accuracy(batch, answers.served_logits[spec.name], logits[spec.name],
                                  tests[spec.name].labels, metric,
                                  judged.base_hits if spec.name not in judged.unpaired else None, max_drop)
            if spec.name in answers.served_logits else
            {"batch": batch, "not_measured": f"a {tests[spec.name].task} model's {metric} is measured at its latency "
                                             "batch only"})
    return out
