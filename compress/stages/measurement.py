"""The one measurement path: which candidates (file × runtime) a bench measures, how, and how the result is
judged and flagged.

The bench stage, ``compress compare`` and the search's validation and final benches all go through
:func:`candidates_of` and :func:`measure_and_judge`, so they measure the same candidates on the same runtimes
(OpenVINO included where it is usable), judge them by the same ``Limits`` and raise the same flags. Written
three times, they drifted: a search scored its trials on onnxruntime alone while its bench could release the
OpenVINO candidate, and each place raised a different set of flags.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from compress.config import PipelineConfig
from compress.errors import ArtifactError
from compress.stages.base import InputArtifact, Output
from compress.stages.onnx_labels import label_onnx
from compress.stages.provenance import independence_flag
from compress.stages.quantize_record import ShippedFile
from compress.stages.runtime_choice import bench_runtimes, onnx_runtimes, runtime_settings, runtimes_for_kind
from serve_bench.bench import ArtifactSpec, BenchResult, BenchSettings, TestSet, on_runtimes, run_benchmark
from serve_bench.accuracy.judges import thin_flag
from serve_bench.gate import evaluate
from serve_bench.report.int8_flags import quantized_not_faster
from serve_bench.latency.harness import HarnessSettings, short_of_floors_flag
from serve_bench.stats.latency_intervals import too_few_blocks
from serve_bench.limits import Limits
from serve_bench import report_model
from serve_bench.latency.machine_load import busy_machine_flag
from serve_bench.report.profile import profile_failures, slower_than_unpruned_flags, unfused_qdq_flags
from serve_bench.report.files import test_set_facts
from serve_bench.report.traffic import drift_flags
from serve_bench.report.tables import main_table
from export.tensorrt_engine import ENGINE_KIND
from serve_bench.runners import RUNNER_OF_KIND, RUNNERS, format_of_kind
from serve_bench.accuracy.runtime_parity import runtime_choice_note
from train.data import BatchStream, DataBundle
from train.tasks import task_named, task_of



def limits_of(config: PipelineConfig) -> Limits:
    """The pipeline file's limits, under its own names: what every gate of a run, a compare or a search judges by."""
    return Limits(metric=config.red_line.metric, max_drop=config.red_line.max_drop,
                  p99_budget_ms=config.latency.p99_budget_ms, decision=config.gate.decision)


def bench_settings(cfg, pipeline: PipelineConfig, batch: int | None = None, repeats: int | None = None) -> BenchSettings:
    """How a bench measures, from its stage settings (``BenchConfig``) and the pipeline's latency section (the
    scenario and the traffic the gate reads) and limits (the budget and rule the capacity search judges by)."""
    harness = HarnessSettings(**cfg.model_dump(include=set(HarnessSettings.model_fields)))
    latency = pipeline.latency
    return BenchSettings(harness=harness, batch_size=batch or cfg.batch_size or latency.batch_size,
                         threads=cfg.threads, device=cfg.device, device_only=cfg.device_only,
                         min_samples=cfg.min_samples, per_class=cfg.per_class,
                         repeats=cfg.repeats if repeats is None else repeats, traffic=cfg.traffic,
                         scenario=latency.scenario, target_qps=latency.target_qps, measured_at=latency.measured_at,
                         limits=limits_of(pipeline),
                         profile_iters=cfg.profile_iters,
                         nms=_task_section(pipeline), predict_as=task_named(pipeline.task).predict_as)


def _task_section(pipeline: PipelineConfig) -> dict | None:
    """The pipeline section the task's scores depend on (a detector's NMS), as the bench takes it."""
    section = task_named(pipeline.task).pipeline_settings
    return getattr(pipeline, section).model_dump() if section is not None else None


def candidates_of(artifact: InputArtifact, cfg, runtime: str | None = None, on_test: bool = True
                  ) -> list[ArtifactSpec]:
    """The candidates a bench measures for one artifact: once per runtime the bench stage's settings give that loads
    its kind (``runtime``: that one only), and per way that runtime runs it (inductor's bf16). Each carries why the
    gate must refuse it on its runtime (the quantize stage's red-line check), decided before measuring.
    ``on_test`` False (a search's validation bench): a refusal that rests on the quantize stage's test-split drop
    is left out (that bench judges the drop on validation itself, and must not see test), one for a runtime the
    check never covered is kept."""
    made = ShippedFile.model_validate(artifact.meta)  # the quantize stage's record, read as it was written
    runtimes = runtimes_for_kind(artifact.kind, bench_runtimes(cfg))
    if made.runtimes:  # a file made for one runtime (the quantize stage's openvino file) runs there
        runtimes = [r for r in runtimes if r in made.runtimes]
        if not runtimes and runtime is None:
            return []  # none of its runtimes is measured here
    specs = on_runtimes(artifact_spec(artifact, cfg), runtimes, runtime_settings(cfg))
    if runtime is not None:
        specs = [s for s in specs if s.runtime == runtime and not s.extra.get("variant")]  # its own way of running
        if not specs:
            raise ArtifactError(f"{artifact.name} cannot be measured on {runtime}: the bench stage measures it on "
                                f"{', '.join(runtimes) or 'none of the runtimes it is made for'} here")
    for spec in specs:
        spec.refused = made.refusal(spec.runtime, on_test)
    return specs


def artifact_spec(artifact: InputArtifact, cfg) -> ArtifactSpec:
    runtime = RUNNER_OF_KIND.get(artifact.kind)
    if runtime is None:
        raise ArtifactError(f"{artifact.name} is a {artifact.kind!r}, which no benchmark runner can load "
                            f"(kinds: {', '.join(RUNNER_OF_KIND)})")
    meta, kind = artifact.meta, artifact.kind
    path = artifact.path / meta["file"] if kind == "onnx" and artifact.path.is_dir() else artifact.path
    if kind == ENGINE_KIND:
        from export.tensorrt_engine import EngineMismatch, check_compatible, current_platform, unavailable_reason

        reason = unavailable_reason()
        if reason:
            raise ArtifactError(f"{artifact.name} is a TensorRT engine but {reason}")
        try:
            check_compatible(meta, current_platform())
        except EngineMismatch as exc:
            raise ArtifactError(f"{artifact.name}: {exc}") from exc
    return ArtifactSpec(name=artifact.name, stage=artifact.name.split(".", 1)[0], runtime=runtime, path=str(path),
                        format=format_of_kind(kind), precision=meta.get("precision", "fp32"),
                        size_bytes=artifact.size_bytes, params=meta.get("params"), macs=meta.get("macs"),
                        max_batch=(meta.get("profile") or {}).get("max"),
                        options={"inter_op_threads": cfg.inter_op_threads} if kind == "onnx" else {},
                        source_model=meta.get("source_model") or (artifact.name if kind == "torch-model" else None),
                        quantization=meta.get("quantization"))  # refused per runtime by candidates_of


def compile_alone(specs: list[ArtifactSpec], baseline: str) -> list[ArtifactSpec]:
    """``specs`` with the baseline torch model's candidates on an optional compiling runtime (torch.compile) marked
    as the baseline's own files (role ``reference``, judged and releasable like any other): what a PyTorch user
    gets without compressing, which every candidate's latency is then also divided by (``vs_compile_alone``)."""
    for spec in specs:
        if spec.artifact == baseline and spec.format == "torch" and spec.name != baseline \
                and not RUNNERS[spec.runtime].measured_by_default:
            spec.extra = {**spec.extra, "role": "reference"}
    return specs


EXPORT_ALONE = "export-alone"
EXPORT_ALONE_ROLE = "export_alone"  # the bench stage's output: the manifest's <bench stage>.export_alone


@dataclass
class ExportedAlone:
    """The baseline exported as it is: its candidates (one per ONNX runtime) and the file as a stage output."""

    specs: list[ArtifactSpec]
    output: Output | None


def export_alone(ctx, cfg, specs: list[ArtifactSpec], baseline: InputArtifact | None) -> ExportedAlone:
    """The baseline torch model exported to fp32 ONNX, on each runtime the bench measures ONNX files on: a
    candidate the gate judges like any other (a run never releases less than exporting the model by hand), and the
    reference for what compression earned apart from what the runtime gave. At small input sizes torch eager runs a
    slow convolution path, so a speed-up over it mostly measures the runtime; over this file it measures the
    pruning and quantization. The file is the bench stage's output ``export_alone``, labelled as every ONNX file
    the pipeline writes (preprocessing, classes, lineage), so a release can ship it. Left out where the bench
    settings say so, for a detector (exported with its decoding by the export stage), and where an fp32 ONNX of the
    baseline is measured already."""
    base = next((s for s in specs if baseline is not None and s.name == baseline.name), None)
    none = ExportedAlone([], None)
    if (not cfg.export_alone or base is None or base.format != "torch" or not task_of(ctx.data).export_alone
            or any(s.format == "onnx" and s.precision == "fp32" and s.source_model == base.name for s in specs)):
        return none
    import torch

    from export.onnx_export import export_onnx
    from train.model_io import load_model

    try:  # with the exporter's defaults (opset 18, fp32, no simplification), whatever an export stage chose
        model, description = load_model(Path(base.path))
        with ctx.atomic_output_dir(EXPORT_ALONE) as folder:
            info = export_onnx(model.eval(), torch.zeros(2, *ctx.data.input_shape), folder / "model.onnx")
            label_onnx(info.path, ctx, baseline, description, data_identity=description.get("data"))
    except Exception as exc:  # an optional candidate: its export failing must not stop the bench of the rest
        ctx.log(f"{EXPORT_ALONE}: {base.name} could not be exported to ONNX ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:200]}); measured without it", style="yellow")
        return none
    folder = ctx.stage_dir / EXPORT_ALONE
    path = folder / "model.onnx"
    meta = {"file": "model.onnx", "files": info.files, "opset": info.opset, "precision": "fp32",
            "input_name": info.input_name, "output_name": info.output_name, "dynamic_batch": True,
            "preprocessing": description["preprocessing"], "num_classes": ctx.data.num_classes,
            "params": base.params, "macs": base.macs, "source_model": base.name, "made_as_it_is": True}
    spec = ArtifactSpec(name=f"{EXPORT_ALONE}:{base.name}", stage=ctx.name, runtime=RUNNER_OF_KIND["onnx"],
                        path=str(path), format="onnx", precision="fp32", size_bytes=path.stat().st_size,
                        params=base.params, macs=base.macs, options={"inter_op_threads": cfg.inter_op_threads},
                        source_model=base.name, extra={"role": "reference"},
                        artifact=f"{ctx.name}.{EXPORT_ALONE_ROLE}")
    runtimes = onnx_runtimes(cfg.runtimes, cfg.device, f"stages.{cfg.name}.runtimes")
    ctx.log(f"{spec.name}: {base.name} exported to fp32 ONNX as it is, measured on {', '.join(runtimes)}: a "
            "candidate like any other, and what compression is measured against")
    return ExportedAlone(on_runtimes(spec, runtimes, runtime_settings(cfg)),
                         Output(EXPORT_ALONE_ROLE, "onnx", folder, meta=meta, made_from=[base.name]))


def test_set_of(data: DataBundle) -> TestSet:
    """The test split as the arrays every artifact is judged on, in a fixed order (so results pair)."""
    images, labels = next(BatchStream(data.test, data, len(data.test), shuffle=False, drop_last=False).epoch(0))
    return TestSet(images.numpy(), labels.numpy(), task=task_of(data).name, **data.judging_facts("test"))


def run_relative(path: str | Path, run_dir: Path) -> str:
    """A report's artifact path as the manifest writes it, relative to the run directory, so a moved run
    directory or a report read from elsewhere still points at the file; absolute where the file is outside
    the run (an input given by path)."""
    try:
        return Path(path).resolve().relative_to(Path(run_dir).resolve()).as_posix()
    except ValueError:
        return str(Path(path).resolve())


@dataclass
class Judged:
    """A measurement judged: the report's shared part (the caller adds what names it: the pipeline, the settings,
    a comparison's runs, a search's key) and the raw result (latency samples, predictions)."""

    report: dict
    result: BenchResult


def measure_and_judge(specs: list[ArtifactSpec], baseline: str, test: TestSet, settings: BenchSettings, *,
                      data_name: str, meaningful: bool, environment: dict, independence: dict | None,
                      run_dir_of: Callable[[report_model.Entry], Path], own_tests: dict[str, TestSet] | None = None,
                      class_names: list[str] | None = None, say=None) -> Judged:
    """Measure ``specs`` interleaved, judge them by ``settings.limits`` and raise every flag, the same way
    wherever it is called. ``run_dir_of``: the run directory an entry's path is written relative to."""
    if settings.limits is None:
        raise ValueError("a judged measurement needs the limits it is judged by (BenchSettings.limits)")
    result = run_benchmark(specs, baseline, test, settings, own_tests=own_tests, say=say)
    for entry in result.entries:
        entry.path = run_relative(entry.path, run_dir_of(entry))
    gate = evaluate(result.entries, settings.limits, accuracy_meaningful=meaningful)
    gate["notes"] += profile_failures(result.entries)
    written = [e.written() for e in result.entries]
    gate["notes"] += [n for n in (runtime_choice_note(written, gate["release"]),) if n]
    report = {"baseline": baseline, "metric": settings.limits.metric, "artifacts": written, "gate": gate,
              "flags": flags_of(result, environment, independence, test, class_names, settings.limits),
              "environment": environment, "traffic": result.traffic,
              "data": {**test_set_facts(data_name, test, meaningful), "test_independence": independence}}
    return Judged(report, result)


def flags_of(result: BenchResult, environment: dict, independence: dict | None, test: TestSet,
             class_names: list[str] | None = None, limits: Limits | None = None) -> list[str]:
    """Every flag a judged measurement can raise, in one list: what a reader must know before trusting a figure."""
    judged = result.entries  # the baseline's own files too: the gate may release them
    entries = [e.written() for e in judged]
    flags = [f"{name}: {why}" for name, why in result.unpaired.items()]
    flags += quantized_not_faster(judged, environment.get("isa"))
    flags += [f for f in (too_few_blocks(entries), short_of_floors_flag(entries), busy_machine_flag(entries),
                          independence_flag(independence)) if f]
    flags += unfused_qdq_flags(judged)
    flags += slower_than_unpruned_flags(judged)
    flags += drift_flags(judged)
    if class_names is not None:
        flags += [f for f in (thin_flag(test, class_names),) if f]
    if limits is not None:
        flags += served_batch_flags(entries, limits.max_drop)
    return flags


def served_batch_flags(entries: list[dict], max_drop: float) -> list[str]:
    """A file judged at one batch whose answers at the batch its serving forms fall past the red line: the gate
    read the first; a deployer who batches as recommended gets the second."""
    out = []
    for entry in entries:
        served = entry.get("accuracy_at_serving_batch") or {}
        paired = served.get("paired") or {}
        if paired.get("drop") is not None and paired["drop"] > max_drop:
            low, high = paired["drop_ci"]
            out.append(f"{entry['name']}: in batches of {served['batch']}, as its serving recommendation forms them, "
                       f"its drop is {paired['drop']:g} points [{low:g}, {high:g}], past the red line {max_drop:g} "
                       f"(the gate judged it at batch {entry.get('eval_batch')})")
    return out


CONSOLE_COLUMNS = ("artifact", "% [95% CI]", "drop points [95% CI]", "p50 ms", "p99 ms", "p99 CI blocks",
                   "speed-up p99 [CI]")


def summary_table(report: dict | report_model.Report) -> Table:
    """The report's main table, the columns the gate decides on."""
    report = report_model.model_of(report)
    head, rows = main_table(report)
    keep = [i for i, h in enumerate(head) if any(h.endswith(c) for c in CONSOLE_COLUMNS)]
    gate = report.gate
    table = Table(title=f"benchmark — gate {'passed' if gate.passed else 'FAILED'} "
                        f"({gate.decision}), release {gate.release}")
    for i in keep:
        table.add_column(head[i], justify="left" if head[i] in ("artifact", "runtime") else "right")
    for row in rows:
        table.add_row(*(row[i] for i in keep), style="bold green" if row[0] == gate.release else None)
    return table
