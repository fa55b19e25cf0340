"""A search's own bench: artifacts of several run directories measured in one interleaved run against the
reference run's baseline, on a named split of the reference pipeline's data.

Two uses, two splits. Each trial (and the hand-set run) is scored on the **validation** split: its
deployable artifacts beside the reference baseline, so its drop is paired with the one baseline
every trial shares (a trial that trained its own is still judged against the reference's) and its
speed is a ratio to that baseline measured in the same run, which survives the machine's drift
between trials where an absolute p99 does not. The **test** split is touched once, by the final
bench of the finalists and the hand-set result: nothing is chosen on the figures it reports
except by the final gate, which corrects for choosing among several (see final_gate).
"""
from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import replace
from pathlib import Path

from compress.errors import ArtifactError
from compress.pipeline.fingerprint import environment, environment_key
from compress.pipeline.manifest import Manifest
from compress.pipeline.pipeline_data import load_section
from compress.pipeline.pipeline_file import Pipeline
from compress.pipeline.input_wiring import ARTIFACT_ROLE, input_refs
from compress.search.contenders import BASELINE, Contender
from serve_bench.limits import Limits
from compress.search.measure_env import MeasurementEnvironment
from compress.stages.base import InputArtifact
from compress.stages.bench_stage import BenchConfig
from compress.stages.data_match import check_same_data
from compress.stages.measurement import bench_settings, candidates_of, measure_and_judge
from compress.stages.provenance import test_independence
from compress.stages.runtime_choice import onnx_runtimes
from serve_bench.bench import BenchSettings, TestSet
from serve_bench.report.files import REPORT_JSON, save_samples, write_report
from serve_bench.report_model import Entry, Report, checked, read
from train.atomic_io import atomic_dir
from train.data import BatchStream, DataBundle

logger = logging.getLogger(__name__)

SPLITS = {"val": "validation", "test": "test"}
VALIDATION_BENCH = "validation-bench"  # the folder of a run's validation bench
FORMAT = "compress-search-bench/3"  # 2: keyed on the latency section and nms too; 3: a candidate per runtime,
# keyed on the runtimes resolved here


def bench_config(pipeline: Pipeline) -> BenchConfig:
    """The measurement protocol: the pipeline's last bench stage's settings (a search file is refused
    without one)."""
    return [s for s in pipeline.stages if s.kind == "bench"][-1]  # type: ignore[return-value]


def deployables(pipeline: Pipeline) -> list[str]:
    """The artifacts the pipeline's bench stage measures (the baseline among them), in its order."""
    refs = input_refs(pipeline)[bench_config(pipeline).name]
    return [name for role, name in refs.items() if role.startswith(ARTIFACT_ROLE)]


def baseline_of(pipeline: Pipeline, manifest: Manifest) -> str:
    """The artifact the bench stage takes as its baseline: the one it names, else the first torch model."""
    named = bench_config(pipeline).baseline
    if named:
        return named
    found = next((n for n in deployables(pipeline) if n in manifest.artifacts
                  and manifest.artifacts[n].kind == "torch-model"), None)
    if found is None:
        raise ArtifactError(f"{pipeline.source}: its bench stage has no torch model to take as the baseline; name one "
                            "with the bench stage's `baseline:`")
    return found


def split_set(data: DataBundle, split: str) -> TestSet:
    """A split as the arrays every artifact is judged on, in a fixed order (so results pair image by image)."""
    images, labels = next(BatchStream(getattr(data, split), data, len(getattr(data, split)), shuffle=False,
                                      drop_last=False).epoch(0))
    return TestSet(images.numpy(), labels.numpy())


def _settings(cfg: BenchConfig, pipeline: Pipeline) -> BenchSettings:
    return bench_settings(cfg, pipeline.config)


def _input(contender: Contender) -> InputArtifact:
    run_dir = Path(contender.run_dir)
    manifest = Manifest.load(run_dir)
    if manifest is None:
        raise ArtifactError(f"{run_dir}: no manifest.json, so no artifact {contender.artifact} to measure")
    record = manifest.artifacts.get(contender.artifact)
    problem = manifest.verify(run_dir, contender.artifact)
    if record is None or problem:
        raise ArtifactError(f"{run_dir}: artifact {contender.artifact}: {problem}; run that run's stages again")
    return InputArtifact(contender.artifact, record.kind, manifest.resolve_path(run_dir, record), record.meta,
                         record.size_bytes, record.sha256)


def _key(inputs: list[InputArtifact], contenders: list[Contender], cfg: BenchConfig, split: TestSet,
         limits: Limits, pipeline: Pipeline) -> str:
    """What a cached split bench stands for: the same files, protocol (the bench stage's settings and the
    pipeline's ``latency`` section: the batch size they may leave to it, the scenario and its arrival rate), the
    detector's ``nms``, images, limits and machine. A report measured at another target rate does not stand."""
    config = pipeline.config
    material = {"contenders": [[c.as_dict(), a.sha256] for c, a in zip(contenders, inputs)],
                "settings": cfg.model_dump(mode="json", exclude={"name"}),
                "batch_size": cfg.batch_size or config.latency.batch_size,
                "latency": config.latency.model_dump(mode="json"), "nms": config.nms.model_dump(mode="json"),
                "split": split.digest,
                # "every usable runtime" resolved here: a runtime that became usable makes another measurement
                "runtimes": onnx_runtimes(cfg.runtimes, cfg.device, f"stages.{cfg.name}.runtimes"),
                "limits": limits.as_dict(), "environment": environment_key(environment()), "format": FORMAT}
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()


def read_split_report(path: Path) -> Report:
    """A split bench's report.json read as the report model (``ReportVersionError``, a ``ValueError``, where it
    does not fit)."""
    return read(json.loads(path.read_text()), str(path))


def measured_before(out: Path, key: str) -> Report | None:
    """The report in ``out`` where it stands for ``key``; one that is unreadable or does not fit the model does not."""
    try:
        report = read_split_report(out / REPORT_JSON)
    except (OSError, ValueError):
        return None
    return report if report.key == key else None


def _prepare(contenders: list[Contender], pipeline: Pipeline, limits: Limits, split: str) -> tuple:
    """The data, the split's images, the bench settings, the contenders' files (checked to be made on this data)
    and the key a report of this measurement carries."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r}: one of {', '.join(SPLITS)}")
    data = load_section(pipeline.config.data, pipeline.source)
    images = split_set(data, split)
    cfg = bench_config(pipeline)
    inputs = [_input(c) for c in contenders]
    for contender, artifact in zip(contenders, inputs):
        check_same_data(artifact, data, source=f"the search's {SPLITS[split]} bench ({contender.label})",
                        independent=pipeline.config.data.independent_test)
    key = _key(inputs, contenders, cfg, images, limits, pipeline)
    return data, images, cfg, inputs, key


def still_stands(contenders: list[Contender], pipeline: Pipeline, limits: Limits, split: str, out: Path) -> bool:
    """Whether the report in ``out`` measured these very files with this protocol, on these images, under these
    limits, on this machine (a re-made reference, edited bench settings or another CPU: it does not)."""
    return measured_before(out, _prepare(contenders, pipeline, limits, split)[4]) is not None


def measure_split(contenders: list[Contender], pipeline: Pipeline, limits: Limits, split: str, out: Path,
                  reuse: bool = False) -> Report:
    """Measure ``contenders`` (the first is the baseline) on ``split`` of ``pipeline``'s data, with its bench
    stage's protocol, judged under ``limits``; the report is written to ``out`` and returned as it reads back
    from there (a fresh report and a cached one are the same model). ``reuse``: a report already in ``out`` for
    the same files, protocol, images, limits and machine stands."""
    data, images, cfg, inputs, key = _prepare(contenders, pipeline, limits, split)
    if reuse and (cached := measured_before(out, key)) is not None:
        return cached
    specs = []
    for contender, artifact in zip(contenders, inputs):
        # on every runtime the bench stage measures on (a trial is scored on the runtime that would ship it), or on
        # the one a finalist was chosen on
        # The quantize stage refuses a file whose *test* drop passed the line; a score on validation must not see
        # the test split, and this bench measures the drop on validation itself (a runtime that check never
        # covered stays refused). The baseline is the reference on its first runtime alone: a copy of it on
        # another runtime would stand as every trial's candidate.
        found = candidates_of(artifact, cfg, contender.runtime, on_test=split == "test")
        for spec in found[:1] if contender.role == BASELINE else found:
            who = replace(contender, runtime=spec.runtime if spec.runtime_in_name else None)
            spec.name = who.name
            spec.extra = {**spec.extra, "contender": who.as_dict(), "run": contender.run_dir,
                          "run_artifact": contender.artifact}
            specs.append(spec)
    settings = _settings(cfg, pipeline)
    settings.limits = limits  # the search's: those it is keyed on
    if split == "val":  # a trial's score: its per-operator profile would go in a report nobody reads
        settings.profile_iters = 0
    logger.info("measuring %s on the %s split (%d images), baseline %s", ", ".join(s.name for s in specs),
                SPLITS[split], len(images.labels), specs[0].name)
    judged = measure_and_judge(specs, specs[0].name, images, settings, data_name=pipeline.config.data.name,
                               meaningful=data.meaningful_accuracy, environment=environment(),
                               independence=test_independence(pipeline.config.model, pipeline.config.data,
                                                              pipeline.config.stages),
                               run_dir_of=lambda entry: Path(entry.run))
    result = judged.result
    report = {"format": FORMAT, "key": key, "split": split, "pipeline": pipeline.config.name, **judged.report,
              "limits": limits.as_dict(), "contenders": [c.as_dict() for c in contenders],
              "measured_in": MeasurementEnvironment.here().as_dict(),
              "settings": {**cfg.model_dump(mode="json"), "batch_size": settings.batch_size}}
    report["data"]["split"] = split
    with atomic_dir(out) as folder:
        if split == "test":
            write_report(folder, report, result.latencies, result.predictions)
        else:  # the figures a trial is scored by; the readable report of a search is the search report
            (folder / REPORT_JSON).write_text(json.dumps(checked(report), indent=2, default=str) + "\n")
            save_samples(folder, result.latencies)
    return read_split_report(out / REPORT_JSON)


def entry_of(report: Report, contender: Contender) -> Entry:
    """A contender's entry in a split bench report, found by its identity (never by parsing a name)."""
    for entry in report.artifacts:
        if entry.contender is not None and Contender.from_dict(entry.contender) == contender:
            return entry
    raise KeyError(f"{contender.name} was not measured in this bench")
