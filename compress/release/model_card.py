"""The model card of a release: what a deployer must know to feed the file and to trust it.

Every figure comes from the run's report, the one the gate decided on, with its interval and
the machine it was measured on: a card without the interval would let a reader take a
1,000-image accuracy for a population figure, and a latency without its machine says nothing.
"""
from __future__ import annotations

import json

from export.tensorrt_engine import ENGINE_KIND
from serve_bench.report_model import Entry, Environment, Interval, Report, ServerRun
from serve_bench.servers.deployment import served_sweep_choice

CARD_FORMAT = "compress-model-card/3"  # 2: the gate's limits under the pipeline file's names; 3: a record names its
# runtime ``runtime`` (``backend`` before)
READABLE_CARD_FORMATS = ("compress-model-card/1", "compress-model-card/2", CARD_FORMAT)  # verify reads them all:
# it reads no limit, and a runtime under its old name with a warning
LATENCY_KEYS = ("p50", "p90", "p95", "p99", "p99.9", "mean", "max")
LATENCY_INTERVALS = ("p50_ci", "p99_ci", "p50_ci_blocks", "p99_ci_blocks")


def build_card(*, report: Report, entry: Entry, released: dict, input_spec: dict, classes: list[str],
               tensorrt: list[dict], tensorrt_withheld: list[dict], pipeline: dict, lineage: list[dict],
               anyway: bool, created: str, version: str, servers: dict | None = None) -> dict:
    """``entry``: the released artifact's row of the report; ``released``: what the bundle holds of it;
    ``tensorrt``: the engines of the same model it ships, ``tensorrt_withheld`` those it does not, with why;
    ``servers``: the model servers' files the bundle holds for it (serve_bench.servers.deployment)."""
    gate = report.gate
    return {"format": CARD_FORMAT, "name": report.pipeline, "created": created, "compress_version": version,
            "released": released, "released_anyway": anyway,
            "gate": {"passed": gate.passed, "release": gate.release, "decision": gate.decision,
                     "confidence": gate.confidence, "limits": gate.limits.model_dump(), "reasons": gate.reasons,
                     "notes": gate.notes},
            "input": input_spec, "classes": classes, "accuracy": accuracy_of(report, entry),
            "latency": latency_of(report, entry), "serving": serving_of(entry, report.gate.limits.p99_budget_ms), "servers": servers,
            "runtime": runtime_of(entry, report.environment), "size_bytes": entry.size_bytes, "params": entry.params,
            "macs": entry.macs, "quantization": entry.quantization.written() if entry.quantization else None,
            ENGINE_KIND: tensorrt, f"{ENGINE_KIND}_withheld": tensorrt_withheld, "pipeline": pipeline,
            "lineage": lineage, "flags": report.flags, "report": "report/report.json"}


def accuracy_of(report: Report, entry: Entry) -> dict:
    """The released file's accuracy on the test split, with its intervals and the drop against the baseline."""
    data, metric, paired = report.data, report.metric, entry.accuracy_paired
    return {"metric": metric, "data": data.name, "split": "test", "test_images": data.test_images,
            "test_digest": data.test_digest, "meaningful": data.meaningful_accuracy,
            **{k: v for k, v in entry.accuracy.items() if k.startswith(("top", "map", "miou", "pixel_acc"))},
            **({"per_class_iou": entry.per_class_iou, "per_class_loss": entry.per_class_loss}
               if entry.per_class_iou else {}),
            # a detector's intervals are bootstrap percentiles over test images, a classifier's Wilson
            "interval": "bootstrap" if paired is not None and paired.method == "paired-bootstrap" else "wilson",
            **({"nms": report.settings.get("nms")} if metric in ("map", "map50") else {}),
            **{f"{k}_ci": _listed(v) for k, v in entry.accuracy_ci.items()},
            "baseline": report.baseline, "drop": entry.accuracy_drop,
            "drop_ci": _listed(paired.drop_ci) if paired is not None else None,
            "eval_batch": entry.eval_batch or report.settings.get("eval_batch", 64),
            # where the model came from outside the run: what the test split's independence rests on
            "test_independence": data.test_independence.written() if data.test_independence else None,
            # the answers at the batch the serving section recommends, where the runtime's answers depend on it
            "at_serving_batch": entry.accuracy_at_serving_batch}


def latency_of(report: Report, entry: Entry) -> dict:
    """The released file's closed-loop latency as recorded (a percentile the bench did not record stays absent),
    with the runner and the machine it was measured on."""
    figures = entry.latency_ms.written()  # by the report's names: p99.9
    return {"batch_size": report.settings.get("batch_size", 1),
            **{k: figures[k] for k in LATENCY_KEYS if k in figures},
            **{k: figures[k] for k in LATENCY_INTERVALS if k in figures},
            "samples": entry.latency_ms.n, "throughput_per_s": entry.throughput, "runner": entry.runner,
            "environment": report.environment.written()}


def runtime_of(entry: Entry, environment: Environment) -> dict:
    """The runtime the gate released the file on, with its version: the same bytes run faster or slower, and can
    answer differently, in another runtime, so the card's figures hold for this one."""
    runner = entry.runner
    runtime = entry.runtime or runner.get("runtime")
    described = getattr(environment, runtime, None) if runtime else None  # a runtime the environment describes apart
    version = (runner.get("version") or environment.packages.get(runtime)
               or (described.get("version") if isinstance(described, dict) else None))
    settings = {k: runner[k] for k in ("device", "threads", "providers", "hint", "inference_precision") if runner.get(k)}
    if runner.get("threads_used"):  # what OpenVINO actually ran with, which its hint may lower
        settings["threads"] = runner["threads_used"]
    return {"name": runtime, "version": version, **settings}


def serving_of(entry: Entry, budget_ms: float | None = None) -> dict | None:
    """How the released file should be served, from the bench's traffic measurement: the scenario the gate read
    (and its figures), and the serving configuration that carried the most traffic within the budget: through
    its server where the gate read the served run (the one its server files ship, if any), else in process."""
    traffic = entry.traffic
    if traffic is None:
        return None
    run = traffic.at_target
    if traffic.measured_at == "served":
        best = served_sweep_choice(entry, budget_ms)
    else:
        best = traffic.sweep.best if traffic.sweep is not None else None
    return {"scenario": traffic.scenario, "target_qps": traffic.target_qps,
            "measured_at": traffic.measured_at or "in_process",
            "at_target": None if run is None else _at_target(run),
            "served": _served(traffic.served),
            "best_configuration": None if best is None else {
                "serving": best.serving.written(), "label": best.label, "capacity_qps": best.capacity.qps,
                "capacity_ci": _listed(best.capacity.ci)}}


def _at_target(run: ServerRun) -> dict:
    """The server run at the pipeline's arrival rate, as the card states it."""
    return {"serving": run.serving.written() if run.serving else None, "p50_ms": run.latency("p50"),
            "p99_ms": run.latency("p99"), "p99_ci": _listed(run.p99_ci),
            "loadgen_valid": run.loadgen.valid if run.loadgen is not None else None, "queue_mean_ms": (run.queue_ms or {}).get("mean"), "model_mean_ms": (run.compute_ms or {}).get("mean")}


def _served(served) -> dict | None:
    """The file measured through its model server, beside itself in process in the same rounds: both p99s, their
    paired ratio (what the server multiplies the p99 by) and where a served query's time went."""
    if served is None:
        return None
    if served.run is None:
        return {"server": served.server, "failed": served.failed}
    ratio = (served.run.paired or {}).get("in_process")
    split = served.split
    best = served.sweep.best if served.sweep is not None else None
    return {"server": served.server, "settings": served.settings,
            "capacity": None if best is None or best.capacity is None or best.capacity.qps is None else {
                "label": best.label, "qps": best.capacity.qps, "ci": _listed(best.capacity.ci)},
            "served": {"p50_ms": served.run.latency("p50"), "p99_ms": served.run.latency("p99"),
                       "p99_ci": _listed(served.run.p99_ci), "sustainable": served.run.sustainable},
            "in_process": {"p50_ms": served.in_process.latency("p50"), "p99_ms": served.in_process.latency("p99"),
                           "p99_ci": _listed(served.in_process.p99_ci)} if served.in_process is not None else None,
            "p99_ratio": None if ratio is None else {"ratio": ratio.ratio, "ci": _listed(ratio.ci)},
            "split_mean_ms": None if split is None else {"server_queue": split.queue_mean_ms,
                                                         "model": split.compute_mean_ms, "rest": split.rest_mean_ms,
                                                         "refused": split.refused}}


def _listed(interval: Interval | tuple | None) -> list | None:
    """An interval as the card's JSON holds it (the model reads it as a tuple)."""
    return None if interval is None else list(interval)


def _serving_lines(serving: dict | None) -> list[str]:
    if not serving:
        return []
    lines = ["", "## Serving", ""]
    run, best = serving.get("at_target"), serving.get("best_configuration")
    if run:
        lines.append(f"- at {serving['target_qps']:g} queries/s (Poisson arrivals, MLPerf LoadGen server scenario), "
                     f"serving {json.dumps(run['serving'])}: p50 {run['p50_ms']} ms, p99 {run['p99_ms']} ms"
                     f"{_interval(run.get('p99_ci'))}; LoadGen {'VALID' if run['loadgen_valid'] else 'INVALID'}; "
                     f"mean {run['queue_mean_ms']} ms queued, {run['model_mean_ms']} ms in the model")
    served = serving.get("served")
    if served and served.get("failed"):
        lines.append(f"- through its model server ({served['server']}): not measured: {served['failed']}")
    elif served:
        out, inside, ratio = served["served"], served["in_process"] or {}, served["p99_ratio"]
        split = served["split_mean_ms"] or {}
        settings = served.get("settings") or {}
        lines.append(f"- through its model server ({served['server']}, {json.dumps(settings)}): p50 {out['p50_ms']} "
                     f"ms, p99 {out['p99_ms']} ms{_interval(out.get('p99_ci'))} against p99 {inside.get('p99_ms')} ms "
                     f"in process in the same rounds"
                     + (f": ×{ratio['ratio']:.2f}{_interval(ratio.get('ci'))} at 99%, paired by round" if ratio
                        else ": not paired (too few queries in complete busy periods)")
                     + f"; mean {split.get('server_queue')} ms in the server's queue, {split.get('model')} ms in the "
                       f"model, {split.get('rest')} ms in HTTP and the server's hops"
                     + ("" if serving.get("measured_at") != "served" else "; the gate read the served p99"))
        if served.get("capacity"):
            cap = served["capacity"]
            lines.append(f"- through its model server, the most traffic within the p99 budget: {cap['qps']:,.1f} "
                         f"queries/s{_interval(cap.get('ci'))} ({cap['label']}, the sweep run on the server's own "
                         "batcher)")
    if best:
        through = " through its model server" if serving.get("measured_at") == "served" else ""
        lines.append(f"- serve it as: {best['label']} ({json.dumps(best['serving'])}): the most traffic within the "
                     f"p99 budget{through}, {best['capacity_qps']:,.1f} queries/s{_interval(best.get('capacity_ci'))}")
    return lines


def _server_file_lines(servers: dict | None) -> list[str]:
    """Where the model servers' files are, what they were written from, and what does not carry over."""
    if not servers:
        return []
    folder, settings = servers["folder"], servers["settings"]
    limit = settings.get("max_queue")
    lines = [f"- model servers: `{folder}/{servers['triton_repository']}/` is a Triton model repository "
             f"(`{folder}/{servers['triton_config']}`) and `{folder}/{servers['ovms_config']}` an OpenVINO Model "
             f"Server config, written from {settings.get('measured') or 'the given settings'}: batches of up to "
             f"{settings['max_batch']}, {settings['max_queue_delay_us']} µs queue delay, {settings['instances']} "
             f"cop{'y' if settings['instances'] == 1 else 'ies'} × {settings.get('threads') or 'default'} threads, "
             f"queue limit {limit or 'none'}; "
             f"`compress serve` serves it so"]
    lines += [f"  - {note}" for note in servers.get("notes") or []]
    return lines


def _served_batch_lines(acc: dict, metric: str) -> list[str]:
    """The accuracy at the batch the serving section recommends, where it was measured apart (OpenVINO answers
    differently at another batch); the figure above is at the batch the file was judged at."""
    served = acc.get("at_serving_batch")
    if not served:
        return []
    head = (f"- the serving section below recommends batches of up to {served['batch']}; the figure above was "
            f"measured at batch {acc.get('eval_batch')}, and this runtime answers differently at another batch")
    if served.get("not_measured"):
        return [f"{head}: not measured at {served['batch']} ({served['not_measured']})"]
    return [f"{head}. At batch {served['batch']}: {metric} {served[metric]}%{_interval(served.get('ci'))}, "
            f"{served['difference']:+g} points, {served['changed_answers']:,} of {served['n']:,} top-1 answers "
            "changed"]


def _count(value) -> str:
    return f"{value:,}" if isinstance(value, int) else "not recorded"


def _interval(ci) -> str:
    return f" [{ci[0]:g}, {ci[1]:g}]" if ci else ""


def _interval_name(acc: dict) -> str:
    return ("95% bootstrap percentile interval over the test images" if acc.get("interval") == "bootstrap"
            else "95% Wilson interval")


def _output_line(card: dict, acc: dict) -> str:
    names = ", ".join(f"{i} `{c}`" for i, c in enumerate(card["classes"][:50])) + (" …" if len(card["classes"]) > 50
                                                                                   else "")
    if acc["metric"] in ("miou", "pixel_acc"):
        return (f"- output: N×C×H×W class logits at the input's resolution, {len(card['classes'])} classes ({names}); "
                f"the argmax over C is the mask (pixels equal to the data's ignore_index were never scored)")
    if acc["metric"].startswith("map"):
        nms = acc.get("nms") or {}
        how = ", ".join(f"{k} {v}" for k, v in nms.items()) or "not recorded"
        return (f"- output: N×A×(4+C): per cell or anchor, a box (x1, y1, x2, y2 in the input's pixels) then "
                f"{len(card['classes'])} class scores in 0..1 ({names}); no NMS inside: the figures below are after "
                f"NMS with {how}")
    return f"- output: one score per class, {len(card['classes'])} classes: {names}"


def render_markdown(card: dict, environment_line: str) -> str:
    acc, lat, gate, rel, spec = card["accuracy"], card["latency"], card["gate"], card["released"], card["input"]
    metric = acc["metric"]
    lines = [f"# Model card: {card['name']} — `{rel['artifact']}`", ""]
    if card["released_anyway"]:
        lines += ["> **NOT PASSED BY THE RELEASE GATE.** This bundle was made with `compress release --anyway`. "
                  "Reasons the gate gave: " + ("; ".join(gate["reasons"]) or "none recorded"), ""]
    lines += [f"Made by compress {card['compress_version']} on {card['created']} from pipeline `{card['name']}`. "
              f"Check it with `sha256sum -c SHA256SUMS` or `compress verify .`.", "",
              "## The file", "",
              f"- `{rel['file']}`: {rel['kind']} ({rel['precision']}), {rel['size_bytes']:,} bytes, "
              f"sha256 `{rel['sha256']}`",
              f"- parameters {_count(card['params'])}, MACs per image {_count(card['macs'])}"]
    runtime = card.get("runtime") or {}
    if runtime.get("name"):
        how = ", ".join(f"{k} {runtime[k]}" for k in ("hint", "inference_precision", "threads") if runtime.get(k))
        lines.append(f"- released to run on **{runtime['name']} {runtime.get('version') or '(version not recorded)'}**"
                     f"{f' ({how})' if how else ''}: every figure below was measured there, and another runtime "
                     "can be faster, slower or answer differently")
    if card["quantization"]:
        q = card["quantization"]
        if q.get("method"):  # made by another tool (NNCF's post-training quantization)
            lines.append(f"- INT8: {q['method']}" + "".join(f", {k} {q[k]}" for k in ("nncf_version", "preset", "samples")
                                                             if q.get(k) is not None))
        else:
            lines.append(f"- INT8: rung `{q.get('rung')}`, {q.get('flavour')} flavour, layers kept in float: "
                         f"{', '.join(q.get('float_layers') or []) or 'none'}")
    for engine in card[ENGINE_KIND]:
        lines.append(f"- TensorRT engine `{engine['file']}` ({engine.get('precision')}), built for "
                     f"{engine.get('gpu_name')} with TensorRT {engine.get('tensorrt_version')}: it runs only there")
    for engine in card.get(f"{ENGINE_KIND}_withheld") or []:
        lines.append(f"- TensorRT engine `{engine['artifact']}` ({engine.get('precision')}) of the same model is not "
                     f"shipped: {engine['reason']}")
    lines += ["", "## Intended input", "",
              f"- one {spec['layout']} float32 tensor, {spec['channels']}×{spec['height']}×{spec['width']} "
              f"({spec['color']}), any batch size",
              f"- resize: {spec['resize']}",
              f"- {spec['formula']}; pixel_divisor {spec['pixel_divisor']}, mean {spec['mean']}, std {spec['std']}",
              _output_line(card, acc), "",
              "## Accuracy", "",
              f"- {metric} **{acc[metric]}{'' if metric.startswith(('map', 'miou', 'pixel')) else '%'}**"
              f"{_interval(acc.get(f'{metric}_ci'))} ({_interval_name(acc)}) on the "
              f"{acc['test_images']} images of the `{acc['split']}` split of `{acc['data']}` "
              f"(digest `{(acc['test_digest'] or '?')[:16]}…`), judged on this very file",
              f"- drop vs `{acc['baseline']}`: {acc['drop']} points{_interval(acc.get('drop_ci'))} (paired, 95%)"]
    if acc.get("per_class_iou"):
        lines.append("- IoU per class: " + ", ".join(f"`{c}` {v if v is not None else '—'}"
                                                     for c, v in acc["per_class_iou"].items()))
        if acc.get("per_class_loss"):
            lines.append("- loses the most against the baseline: " + ", ".join(
                f"`{x['class']}` −{x['drop']} points" for x in acc["per_class_loss"]))
    lines += _served_batch_lines(acc, metric)
    if not acc["meaningful"]:
        lines.append("- the labels of this data are random: the accuracy means nothing")
    independence = acc.get("test_independence")
    if independence:
        lines.append(("- **training data unknown**: " if independence["status"] == "unknown" else "- test images: ")
                     + independence["note"])
    lines += ["", "## Latency", "",
              f"Batch {lat['batch_size']}, {lat['samples']} timed requests, runner {json.dumps(lat['runner'])}.", "",
              "| " + " | ".join(f"{k} ms" for k in LATENCY_KEYS if k in lat) + " |",
              "|" + "---:|" * sum(k in lat for k in LATENCY_KEYS),
              "| " + " | ".join(f"{lat[k]:.4g}" for k in LATENCY_KEYS if k in lat) + " |", "",
              f"- p50 95% interval{_interval(lat.get('p50_ci'))} ms; p99{_interval(lat.get('p99_ci'))} ms "
              f"(across blocks: p99{_interval(lat.get('p99_ci_blocks'))} ms)",
              f"- measured on: {environment_line}", *_serving_lines(card.get("serving")),
              *_server_file_lines(card.get("servers")), "",
              "## Limits it was released under", "",
              f"- red line: at most {gate['limits']['max_drop']} points of {metric} below `{acc['baseline']}`; "
              f"p99 budget: {gate['limits']['p99_budget_ms']} ms; decision rule: {gate['decision']}",
              f"- gate: {'PASSED' if gate['passed'] else 'FAILED'}, release `{gate['release']}`"]
    lines += [f"  - {reason}" for reason in gate["reasons"]]
    lines += [f"- flag: {flag}" for flag in card["flags"]]
    pipe = card["pipeline"]
    lines += ["", "## How it was made", "",
              f"- pipeline `{pipe['file']}` (sha256 `{pipe['sha256']}`), data split digest `{pipe['data_split_digest']}`",
              "- stages: " + ", ".join(f"{s['name']} ({s['kind']}, key `{s['cache_key'][:12]}`)" for s in pipe["stages"]),
              "- lineage, newest first:"]
    lines += [f"  - `{a['artifact']}` ({a['kind']}) sha256 `{a['sha256']}`" for a in card["lineage"]]
    lines += ["", f"The full report is in `{card['report']}`."]
    return "\n".join(lines) + "\n"
