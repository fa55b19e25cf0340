"""``kind: bench``: latency and accuracy of every deployable artifact, the report and the gate."""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from rich.table import Table

from compress.config import PipelineConfig, StageConfig
from compress.errors import ArtifactError, ConfigError
from compress.stages.base import InputArtifact, Output, Stage, StageContext, StageResult
from compress.stages.provenance import independence_flag, test_independence
from compress.stages.runtime_choice import onnx_runtimes
from serve_bench.bench import ArtifactSpec, BenchSettings, TestSet, on_runtimes, run_benchmark
from serve_bench.gate import evaluate, quantized_not_faster
from serve_bench.harness import HarnessSettings, short_of_floors_flag
from serve_bench.latency_intervals import too_few_blocks
from serve_bench.load.traffic import TrafficSettings
from serve_bench.machine_load import busy_machine_flag
from serve_bench.profile_report import profile_failures, unfused_qdq_flags
from serve_bench.report import test_set_facts, write_report
from serve_bench.report_tables import main_table
from serve_bench.runtime_parity import runtime_choice_note
from serve_bench.runners.openvino_runner import OpenVinoSettings
from compress.stages.training_run import is_detection
from serve_bench.detection_accuracy import thin_classes
from serve_bench.load.traffic import wanted
from train.data import BatchStream, DataBundle

BACKENDS = {"torch-model": "torch", "onnx": "onnxruntime", "trt-engine": "tensorrt"}


class BenchConfig(StageConfig, HarnessSettings):
    kind: Literal["bench"] = "bench"
    artifacts: list[str] | None = Field(None, description="artifact names; default: every earlier deployable one")
    leave_out: list[str] = Field(default_factory=list, description="artifact names left out of the default set "
                                 "(every earlier deployable one), e.g. an intermediate torch model; the baseline "
                                 "is measured all the same")
    baseline: str | None = Field(None, description="default: the first train stage's model, else the brought "
                                                   "model (model.model)")
    batch_size: int | None = Field(None, ge=1, description="default: the pipeline's latency.batch_size")
    threads: int | None = Field(None, ge=1, description="intra-op threads; default: physical cores")
    inter_op_threads: int = Field(1, ge=1, description="onnxruntime inter-op threads")
    runtimes: list[Literal["onnxruntime", "openvino"]] | None = Field(
        None, min_length=1, description="the runtimes each ONNX file is measured on, each (file, runtime) its own "
                                        "candidate (the first keeps the file's name, others are <file>@<runtime>); default: every one usable here (onnxruntime, and OpenVINO "
                                        "where installed; on cuda onnxruntime alone)")
    openvino: OpenVinoSettings = Field(default_factory=OpenVinoSettings,
                                       description="how OpenVINO compiles each file (performance hint, precision)")
    torch_compile: bool = Field(False, description="torch.compile the torch artifacts before timing them")
    device: Literal["cpu", "cuda"] = "cpu"
    device_only: bool = Field(False, description="time the computation only, input staged on the device and "
                                                 "output left there")
    min_samples: int = Field(1000, ge=1, description="a p99 from fewer samples is refused")
    per_class: bool = False
    repeats: int = Field(1, ge=1, le=20, description="repeat the whole interleaved measurement this many times and "
                                                      "report each percentile's spread across repeats")
    traffic: TrafficSettings = Field(default_factory=TrafficSettings,
                                     description="latency under traffic: LoadGen at the pipeline's scenario, the "
                                                 "serving configuration, the sweep for the highest load in budget")
    profile_iters: int = Field(20, ge=0, description="runs of each artifact under its runtime's profiler, for the "
                                                     "per-operator table (0: no profile)")

    @model_validator(mode="after")
    def _floor(self) -> "BenchConfig":
        if self.artifacts is not None and self.leave_out:
            raise ValueError("give artifacts (the list measured) or leave_out (names taken from the default set), "
                             "not both")
        if self.min_iters < self.min_samples:
            raise ValueError(f"min_iters {self.min_iters} is below min_samples {self.min_samples}: "
                             "the p99 would be refused; raise min_iters")
        return self


class BenchStage(Stage):
    kind = "bench"
    Config = BenchConfig
    collects_deployable = True
    input_roles = ("baseline",)  # also among the measured artifacts; named so the default is the red line's
    produces = ("report",)
    uses = ("seed", "data", "model", "red_line", "latency", "gate")
    keyed_on_environment = True

    def run(self, ctx: StageContext, inputs: dict[str, InputArtifact]) -> StageResult:
        cfg: BenchConfig = self.config  # type: ignore[assignment]
        data, pipeline = ctx.data, ctx.pipeline
        if pipeline.latency.scenario == "server" and cfg.traffic.loadgen is False:
            raise ConfigError(f"stages.{ctx.name}.traffic.loadgen: false, but latency.scenario is server: the gate "
                              "reads the p99 at latency.target_qps, which only the LoadGen test measures; drop "
                              "`loadgen: false` or gate on the single-stream scenario")
        if is_detection(data) and wanted(cfg.traffic, pipeline.latency.scenario):
            raise ConfigError(f"stages.{ctx.name}.traffic: latency under traffic is not built for task: detection yet "
                              "(its serving copies would answer without NMS); use latency.scenario: single-stream "
                              "and drop the traffic settings")
        unique = {a.name: a for a in inputs.values()}  # the baseline input is also one of the collected artifacts
        runtimes = onnx_runtimes(cfg.runtimes, cfg.device, f"stages.{ctx.name}.runtimes")
        specs = [s for a in unique.values() for s in on_runtimes(artifact_spec(a, cfg), runtimes,
                                                                 {"openvino": cfg.openvino.runner_options()})]
        for spec in specs:  # the red line a file was checked on is per runtime
            spec.refused = _refusal(unique[spec.artifact].meta, spec.backend)
        if not specs:
            raise ArtifactError(f"stage {ctx.name!r} found no deployable artifact to measure; add a train stage first")
        # the red line's baseline, the runner's "baseline" input: the first train stage's model, else the model the
        # user brought (measured first where a train stage fine-tunes it); inputs given by path: the first torch model
        red_line_baseline = inputs["baseline"].name if "baseline" in inputs else None
        baseline = cfg.baseline or red_line_baseline or next((s.name for s in specs if s.backend == "torch"), None)
        if baseline not in {s.name for s in specs}:
            raise ArtifactError(f"stage {ctx.name!r}: baseline {baseline!r} is not among the measured artifacts "
                                f"({', '.join(s.name for s in specs)})")
        batch = cfg.batch_size or pipeline.latency.batch_size
        test = test_set_of(data)
        if len(test.labels) < batch:
            raise ConfigError(f"stages.{ctx.name}.batch_size: {batch} is more than the {len(test.labels)} test images")
        settings = bench_settings(cfg, pipeline, batch)
        metric, max_drop = pipeline.red_line.metric, pipeline.red_line.max_drop
        ctx.log(f"measuring {len(specs)} artifacts interleaved (batch {batch}, ≥{cfg.min_iters} requests and "
                f"≥{cfg.min_duration_s:g}s each{f', {cfg.repeats} repeats' if cfg.repeats > 1 else ''}), "
                f"baseline {baseline}")
        result = run_benchmark(specs, baseline, test, settings, metric, max_drop, say=ctx.log)
        for entry in result.entries:
            entry["path"] = run_relative(entry["path"], ctx.run_dir)
        gate = evaluate(result.entries, pipeline.latency.p99_budget_ms, max_drop,
                        accuracy_meaningful=data.meaningful_accuracy, decision=pipeline.gate.decision)
        env = ctx.environment  # the runner's fingerprint, the same one the stage record names
        flags = quantized_not_faster(result.entries, env["isa"])
        flags += [f for f in (too_few_blocks(result.entries), short_of_floors_flag(result.entries),
                              busy_machine_flag(result.entries)) if f]
        independence = test_independence(pipeline.model, pipeline.data, pipeline.stages)
        flags += [f for f in (independence_flag(independence),) if f]
        flags += unfused_qdq_flags(result.entries)
        if is_detection(data):
            flags += [f for f in (thin_classes(test.targets, data.class_names),) if f]
        gate["notes"] += profile_failures(result.entries)
        gate["notes"] += [n for n in (runtime_choice_note(result.entries, gate["release"]),) if n]
        report = {"pipeline": pipeline.name, "baseline": baseline, "metric": metric, "artifacts": result.entries,
                  "gate": gate, "flags": flags, "environment": env, "traffic": result.traffic,
                  "settings": {**cfg.model_dump(mode="json"), "batch_size": batch,
                               **({"nms": pipeline.nms.model_dump(mode="json")} if is_detection(data) else {})},
                  "data": {**test_set_facts(data.name, test, data.meaningful_accuracy),
                           "test_independence": independence}}
        with ctx.atomic_output_dir("report") as folder:
            write_report(folder, report, result.latencies, result.predictions)
        ctx.console.print(summary_table(report))
        verdict = "passed" if gate["passed"] else "FAILED"
        ctx.log(f"gate {verdict}: release {gate['release']}" + "".join(f"\n  - {r}" for r in gate["reasons"]))
        for note in gate["notes"]:
            ctx.log(f"note: {note}", style="yellow")
        for flag in flags:
            ctx.log(f"flag: {flag}", style="yellow")
        metrics = {"gate_passed": gate["passed"], "release": gate["release"], "gate_reasons": gate["reasons"],
                   "gate_decided_on": gate["decided_on"], "gate_decision": gate["decision"], "flags": flags,
                   "summary": f"gate {verdict}, release {gate['release']}"}
        return StageResult(outputs=[Output("report", "report", ctx.stage_dir / "report",
                                           meta={"passed": gate["passed"]})],
                           metrics=metrics)


def bench_settings(cfg: BenchConfig, pipeline: PipelineConfig, batch: int | None = None,
                   repeats: int | None = None) -> BenchSettings:
    """How a bench measures, from its stage settings and the pipeline's latency section (the scenario and the
    traffic the gate reads, the budget and decision rule the capacity search judges by): one place, so the
    bench stage, ``compress compare`` and a search's benches measure alike."""
    harness = HarnessSettings(**cfg.model_dump(include=set(HarnessSettings.model_fields)))
    latency = pipeline.latency
    return BenchSettings(harness=harness, batch_size=batch or cfg.batch_size or latency.batch_size,
                         threads=cfg.threads, device=cfg.device, device_only=cfg.device_only,
                         min_samples=cfg.min_samples, per_class=cfg.per_class,
                         repeats=cfg.repeats if repeats is None else repeats, traffic=cfg.traffic,
                         scenario=latency.scenario, target_qps=latency.target_qps, budget_ms=latency.p99_budget_ms,
                         decision=pipeline.gate.decision, profile_iters=cfg.profile_iters,
                         nms=pipeline.nms.model_dump() if pipeline.task == "detection" else None)


def test_set_of(data: DataBundle) -> TestSet:
    """The test split as the arrays every artifact is judged on, in a fixed order (so results pair)."""
    images, labels = next(BatchStream(data.test, data, len(data.test), shuffle=False, drop_last=False).epoch(0))
    if is_detection(data):  # the digest covers the boxes too (the bundle's split digest does)
        return TestSet(images.numpy(), labels.numpy(), digest=f"detection:{data.digest()}",
                       targets=data.split_targets("test"), num_classes=data.num_classes)
    return TestSet(images.numpy(), labels.numpy())


def run_relative(path: str | Path, run_dir: Path) -> str:
    """A report's artifact path as the manifest writes it, relative to the run directory, so a moved run
    directory or a report read from elsewhere still points at the file; absolute where the file is outside
    the run (an input given by path)."""
    try:
        return Path(path).resolve().relative_to(Path(run_dir).resolve()).as_posix()
    except ValueError:
        return str(Path(path).resolve())


def artifact_spec(artifact: InputArtifact, cfg: BenchConfig) -> ArtifactSpec:
    backend = BACKENDS.get(artifact.kind)
    if backend is None:
        raise ArtifactError(f"{artifact.name} is a {artifact.kind!r}, which no benchmark runner can load "
                            f"(runners: {', '.join(BACKENDS)})")
    meta = artifact.meta
    path = artifact.path / meta["file"] if backend == "onnxruntime" and artifact.path.is_dir() else artifact.path
    if backend == "tensorrt":
        from export.tensorrt_engine import EngineMismatch, check_compatible, current_platform, unavailable_reason

        reason = unavailable_reason()
        if reason:
            raise ArtifactError(f"{artifact.name} is a TensorRT engine but {reason}")
        try:
            check_compatible(meta, current_platform())
        except EngineMismatch as exc:
            raise ArtifactError(f"{artifact.name}: {exc}") from exc
    return ArtifactSpec(name=artifact.name, stage=artifact.name.split(".", 1)[0], backend=backend, path=str(path),
                        format={"torch": "torch", "onnxruntime": "onnx", "tensorrt": "engine"}[backend],
                        precision=meta.get("precision", "fp32"), size_bytes=artifact.size_bytes,
                        params=meta.get("params"), macs=meta.get("macs"), max_batch=(meta.get("profile") or {}).get("max"),
                        options={"compile": cfg.torch_compile} if backend == "torch" else
                        {"inter_op_threads": cfg.inter_op_threads} if backend == "onnxruntime" else {},
                        source_model=meta.get("source_model") or (artifact.name if backend == "torch" else None),
                        refused=_refusal(meta, backend), quantization=meta.get("quantization"))


def _refusal(meta: dict, backend: str) -> str | None:
    """Why the gate must not release this file on ``backend``, from the quantize stage's red-line check."""
    red = meta.get("red_line")
    if not red:
        return None
    drops = {"onnxruntime": red.get("test_drop"), **(red.get("test_drop_on") or {})}
    if red.get("within") is False:
        return ("the quantize stage found no rung within the red line on every runtime it checked (test drop "
                + ", ".join(f"{r} {d}" for r, d in drops.items()) + " points); refused")
    if backend == "openvino" and backend not in drops:  # a file quantized before the check, or without it
        return (f"the quantize stage checked its red line on {', '.join(drops)} only, not on {backend} (its runtimes "
                f"setting); refused here: re-run the quantize stage with {backend} among its runtimes")
    return None


CONSOLE_COLUMNS = ("artifact", "% [95% CI]", "drop points [95% CI]", "p50 ms", "p99 ms", "p99 CI blocks",
                   "speed-up p99 [CI]")


def summary_table(report: dict) -> Table:
    """The report's main table, the columns the gate decides on."""
    head, rows = main_table(report)
    keep = [i for i, h in enumerate(head) if any(h.endswith(c) for c in CONSOLE_COLUMNS)]
    gate = report["gate"]
    table = Table(title=f"benchmark — gate {'passed' if gate['passed'] else 'FAILED'} "
                        f"({gate.get('decision', 'point')}), release {gate['release']}")
    for i in keep:
        table.add_column(head[i], justify="left" if head[i] in ("artifact", "backend") else "right")
    for row in rows:
        table.add_row(*(row[i] for i in keep), style="bold green" if row[0] == gate["release"] else None)
    return table
