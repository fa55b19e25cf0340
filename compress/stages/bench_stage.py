"""``kind: bench``: latency and accuracy of every deployable artifact, the report and the gate."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from compress.config import StageConfig
from compress.errors import ArtifactError, ConfigError
from compress.stages.base import InputArtifact, Output, Stage, StageContext, StageResult
from compress.stages.measurement import (EXPORT_ALONE_ROLE, bench_settings, candidates_of, compile_alone, export_alone, measure_and_judge, summary_table,
                                        test_set_of)
from compress.stages.provenance import test_independence
from train.tasks import task_of
from serve_bench.latency.harness import HarnessSettings
from serve_bench.latency.traffic import TrafficSettings, wanted
from serve_bench.report.files import write_report
from serve_bench.runners import RUNNERS
from serve_bench.runners.inductor import InductorSettings
from serve_bench.runners.openvino_runner import OpenVinoSettings


class BenchConfig(StageConfig, HarnessSettings):
    kind: Literal["bench"] = Field("bench", description="measure every deployable file's latency and accuracy, "
                                                        "then the release gate")
    artifacts: list[str] | None = Field(None, description="artifact names; default: every earlier deployable one")
    leave_out: list[str] = Field(default_factory=list, description="artifact names left out of the default set "
                                 "(every earlier deployable one), e.g. an intermediate torch model; the baseline "
                                 "is measured all the same")
    baseline: str | None = Field(None, description="default: the first train stage's model, else the brought "
                                                   "model (model.model)")
    batch_size: int | None = Field(None, ge=1, description="default: the pipeline's latency.batch_size")
    threads: int | None = Field(None, ge=1, description="intra-op threads; default: physical cores")
    inter_op_threads: int = Field(1, ge=1, description="onnxruntime inter-op threads")
    runtimes: list[str] | None = Field(
        None, min_length=1, description="the runtimes each file is measured on, among those that load its kind, each "
                                        "(file, runtime) its own candidate (the first keeps the file's name, others "
                                        "are <file>@<runtime>); a torch model is always measured in torch eager too. "
                                        "Default: every ONNX runtime usable here (onnxruntime, and OpenVINO where "
                                        "installed; on cuda onnxruntime alone) and torch eager. inductor "
                                        "(torch.compile) is measured where named")
    openvino: OpenVinoSettings = Field(default_factory=OpenVinoSettings,
                                       description="how OpenVINO compiles each file (performance hint, precision)")
    inductor: InductorSettings = Field(default_factory=InductorSettings,
                                       description="how torch.compile compiles each torch file (mode, freezing, bf16)")
    torch_compile: bool = Field(False, description="deprecated: name inductor in runtimes instead (this adds it, "
                                                   "with a note)")
    device: Literal["cpu", "cuda"] = Field("cpu", description="where the files are timed")
    device_only: bool = Field(False, description="time the computation only, input staged on the device and "
                                                 "output left there")
    min_samples: int = Field(1000, ge=1, description="a p99 from fewer samples is refused")
    per_class: bool = Field(False, description="also report each class's accuracy")
    repeats: int = Field(1, ge=1, le=20, description="repeat the whole interleaved measurement this many times and "
                                                      "report each percentile's spread across repeats")
    traffic: TrafficSettings = Field(default_factory=TrafficSettings,
                                     description="latency under traffic: LoadGen at the pipeline's scenario, the "
                                                 "serving configuration, the sweep for the highest load in budget")
    profile_iters: int = Field(20, ge=0, description="runs of each artifact under its runtime's profiler, for the "
                                                     "per-operator table (0: no profile)")
    export_alone: bool = Field(True, description="also measure the baseline torch model exported to fp32 ONNX as "
                               "it is, on each runtime: a candidate the gate judges like any other (so a run never "
                               "releases less than exporting the model by hand), and what compression earned apart "
                               "from what the runtime gave (torch eager is often a slow path at small sizes)")

    @field_validator("runtimes")
    @classmethod
    def _known_runtimes(cls, value: list[str] | None) -> list[str] | None:
        known = [name for name, runner in RUNNERS.items() if runner.formats]
        unknown = [name for name in value or [] if name not in known]
        if unknown:
            raise ValueError(f"unknown runtime {', '.join(map(repr, unknown))}; known: {', '.join(known)}")
        return value

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
    produces = ("report", EXPORT_ALONE_ROLE)  # the baseline exported as it is: a candidate the gate may release
    uses = ("seed", "data", "model", "red_line", "latency", "gate")
    keyed_on_environment = True

    def run(self, ctx: StageContext, inputs: dict[str, InputArtifact]) -> StageResult:
        cfg: BenchConfig = self.config  # type: ignore[assignment]
        data, pipeline = ctx.data, ctx.pipeline
        if pipeline.latency.scenario == "server" and cfg.traffic.loadgen is False:
            raise ConfigError(f"stages.{ctx.name}.traffic.loadgen: false, but latency.scenario is server: the gate "
                              "reads the p99 at latency.target_qps, which only the LoadGen test measures; drop "
                              "`loadgen: false` or gate on the single-stream scenario")
        task = task_of(data)
        if task.pipeline_settings is not None and wanted(cfg.traffic, pipeline.latency.scenario):
            raise ConfigError(f"stages.{ctx.name}.traffic: latency under traffic is not built for task: {task.name} "
                              f"yet (its serving copies would answer without the {task.pipeline_settings} that follows "
                              "the model); use latency.scenario: single-stream and drop the traffic settings")
        if cfg.torch_compile:
            ctx.log(f"stages.{ctx.name}.torch_compile is deprecated: name inductor in stages.{ctx.name}.runtimes; "
                    "measured here as if it were named", style="yellow")
        unique = {a.name: a for a in inputs.values()}  # the baseline input is also one of the collected artifacts
        specs = [s for a in unique.values() for s in candidates_of(a, cfg)]
        if not specs:
            raise ArtifactError(f"stage {ctx.name!r} found no deployable artifact to measure; add a train stage first")
        # the red line's baseline, the runner's "baseline" input: the first train stage's model, else the model the
        # user brought (measured first where a train stage fine-tunes it); inputs given by path: the first torch model
        red_line_baseline = inputs["baseline"].name if "baseline" in inputs else None
        baseline = cfg.baseline or red_line_baseline or next((s.name for s in specs if s.format == "torch"), None)
        if baseline not in {s.name for s in specs}:
            raise ArtifactError(f"stage {ctx.name!r}: baseline {baseline!r} is not among the measured artifacts "
                                f"({', '.join(s.name for s in specs)})")
        alone = export_alone(ctx, cfg, specs, unique.get(baseline))
        specs = compile_alone(specs, baseline) + alone.specs
        batch = cfg.batch_size or pipeline.latency.batch_size
        test = test_set_of(data)
        if len(test.labels) < batch:
            raise ConfigError(f"stages.{ctx.name}.batch_size: {batch} is more than the {len(test.labels)} test images")
        settings = bench_settings(cfg, pipeline, batch)
        ctx.log(f"measuring {len(specs)} artifacts interleaved (batch {batch}, ≥{cfg.min_iters} requests and "
                f"≥{cfg.min_duration_s:g}s each{f', {cfg.repeats} repeats' if cfg.repeats > 1 else ''}), "
                f"baseline {baseline}")
        judged = measure_and_judge(
            specs, baseline, test, settings, data_name=data.name, meaningful=data.meaningful_accuracy,
            environment=ctx.environment,  # the runner's fingerprint, the same one the stage record names
            independence=test_independence(pipeline.model, pipeline.data, pipeline.stages),
            run_dir_of=lambda entry: ctx.run_dir, class_names=data.class_names,
            say=ctx.log)
        result, gate, flags = judged.result, judged.report["gate"], judged.report["flags"]
        report = {"pipeline": pipeline.name, **judged.report,
                  "settings": {**cfg.model_dump(mode="json"), "batch_size": batch,
                               **({task.pipeline_settings: getattr(pipeline, task.pipeline_settings).model_dump(
                                   mode="json")} if task.pipeline_settings is not None else {})}}
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
                                           meta={"passed": gate["passed"]}),
                                    *([alone.output] if alone.output is not None else [])],
                           metrics=metrics)
