"""Runs a pipeline's stages in order, skipping those whose cached results still hold.

A stage's cache key covers its kind, its resolved settings, the pipeline sections it
uses, the data split digest, the digests of its inputs, the bytes of every weights file and
user model module its settings name, the package version, and for stages whose results
depend on the machine (export, bench) the environment fingerprint. So a changed setting
re-runs that stage, and the changed artifacts it makes re-run exactly the stages after it
that consume them, and nothing else.
"""
from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from compress import __version__
from compress.config import DistributedSettings, StageConfig, check_metric_has_meaning
from compress.errors import ArtifactError, CompressError, ConfigError, from_library
from compress.pipeline.console_log import cli_console, to_console
from compress.pipeline.distributed_launch import launch_stage
from compress.pipeline.fingerprint import environment, environment_key
from compress.pipeline.input_wiring import ARTIFACT_ROLE, input_refs
from compress.pipeline.manifest import ArtifactRecord, Manifest, StageRecord, digest_path, now
from compress.pipeline.pipeline_data import load_section
from train.tasks import task_named, task_of
from compress.pipeline.pipeline_file import Pipeline
from compress.pipeline.preflight import preflight
from compress.pipeline.rerun_reason import why_rerun
from compress.pipeline.run_lock import RunLock, check_owner
from compress.pipeline.torch_threads import torch_threads
from compress.pipeline.tracking import tracked
from compress.pipeline.red_line_wiring import RedLineWiring
from compress.stages import registry
from compress.stages.base import InputArtifact, Output, StageContext
from compress.stages.data_match import check_same_data
from compress.stages.model_source import model_sources
from train.atomic_io import atomic_write_text
from train.data import DataBundle

logger = logging.getLogger(__name__)


@dataclass
class RunOptions:
    only: str | None = None
    from_stage: str | None = None
    force: set[str] = field(default_factory=set)
    external_inputs: dict[str, Path] = field(default_factory=dict)  # role -> path, for `compress stage`
    reuse_run_dir: bool = False  # let a pipeline of another name run into a run directory
    stages: list[str] | None = None  # run exactly these stages, in pipeline order (a search runs a trial in phases)


def _hash(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


# Where and how data is decoded, not which pixels: the split digest covers the pixels.
_DATA_LOCATION_FIELDS = ("decode_cache", "cache_dir", "decode_workers", "decode_cache_check")


def _without_locations(section: str, value: object) -> object:
    if section == "data" and isinstance(value, dict):
        return {k: v for k, v in value.items() if k not in _DATA_LOCATION_FIELDS}
    if section == "red_line" and isinstance(value, dict):  # the runner's wiring, keyed where it changes an input
        return {k: v for k, v in value.items() if k != "fall_back"}
    return value


def default_run_dir(pipeline: Pipeline) -> Path:
    return Path(pipeline.config.run_dir or Path("runs") / pipeline.config.name)


class Runner:
    def __init__(self, pipeline: Pipeline, run_dir: Path, console: Console | None = None,
                 options: RunOptions | None = None) -> None:
        self.pipeline, self.run_dir = pipeline, Path(run_dir)
        self.console = console or cli_console()
        self.options = options or RunOptions()
        self._data: DataBundle | None = None
        self._data_digest: str | None = None
        self.manifest: Manifest | None = None
        self._environment_digest: str | None = None
        self.selected_names: list[str] = []
        self.current_stage: str | None = None  # the stage running now (what an interruption stopped)
        self._config_file: str | None = None
        self._red_line = RedLineWiring(pipeline.config, pipeline.stages, self.run_dir, lambda: self.manifest,
                                       self._load_data)

    def _load_data(self) -> DataBundle:
        if self._data is None:
            self._data = load_section(self.pipeline.config.data, self.pipeline.source)
            section = task_of(self._data).pipeline_settings  # a detector's NMS: how every stage measures mAP
            if section is not None:
                setattr(self._data, section, getattr(self.pipeline.config, section))
            try:
                check_metric_has_meaning(self.pipeline.config.red_line.metric, self._data.num_classes)
            except ValueError as exc:
                raise ConfigError(f"{self.pipeline.source}: red_line.metric: {exc}") from exc
            self._data_digest = self._data.digest()
            assert self.manifest is not None
            self.manifest.data = {**self._data.summary(), "split_hash": self._data_digest}
        return self._data

    def _selected(self) -> list[int]:
        names = [s.name for s in self.pipeline.stages]
        for flag, name in (("--only", self.options.only), ("--from", self.options.from_stage),
                           *(("--force", f) for f in self.options.force),
                           *(("stages", s) for s in self.options.stages or [])):
            if name is not None and name not in names:
                raise ConfigError(f"{flag} {name}: no such stage in {self.pipeline.source}; stages: {', '.join(names)}")
        if self.options.only:
            return [names.index(self.options.only)]
        if self.options.stages is not None:
            return [i for i, name in enumerate(names) if name in self.options.stages]
        if self.options.from_stage:
            return list(range(names.index(self.options.from_stage), len(names)))
        return list(range(len(names)))

    def run(self) -> Manifest:
        selected = self._selected()
        self.selected_names = [self.pipeline.stages[i].name for i in selected]
        preflight(self.pipeline)  # what the file names exists: checked before anything is written
        self._check_node_rank()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with RunLock(self.run_dir), to_console(self.console), torch_threads(self.pipeline.config.threads), \
                tracked(self.pipeline.config, self.run_dir, self.pipeline.source,
                        lambda: (self.manifest, self.current_stage)) as tracking:
            self.manifest = Manifest.load(self.run_dir)
            check_owner(self.run_dir, self.manifest, self.pipeline.config.name, self.pipeline.source,
                        self.options.reuse_run_dir)
            if self.manifest is None:
                self.manifest = Manifest(pipeline=self.pipeline.config.name)
            self.manifest.pipeline = self.pipeline.config.name
            self.manifest.environment = environment()
            self._environment_digest = _hash(environment_key(self.manifest.environment))
            self.manifest.environments[self._environment_digest] = self.manifest.environment
            self._register_external_inputs()
            refs = input_refs(self.pipeline)
            for stage_refs in refs.values():
                stage_refs.update({role: f"external.{role}" for role in self.options.external_inputs})
            for index in selected:
                self.current_stage = self.pipeline.stages[index].name
                self._run_stage(index, refs[self.current_stage])
                tracking.stage_done(self.manifest, self.current_stage)
            self.current_stage = None
            if self._config_file is not None:  # nothing is written for a run whose every stage was cached
                self.manifest.save(self.run_dir)
        return self.manifest

    def _check_node_rank(self) -> None:
        """`compress run` is node 0; another machine's share of a stage is `compress join`."""
        for cfg in self.pipeline.stages:
            spread = self._distributed(cfg, registry.get(cfg.kind))
            if spread is not None and spread.node_rank != 0:
                raise ConfigError(
                    f"{self.pipeline.source}: stage {cfg.name!r} has distributed.node_rank {spread.node_rank}: "
                    f"`compress run` runs on node 0; on this machine run `compress join {self.pipeline.source} "
                    f"--stage {cfg.name} --node-rank {spread.node_rank} --run-dir <the shared run directory>`")

    def _record_config(self) -> str:
        """The resolved configuration, written once the first stage actually starts: under configs/ by
        content (so an earlier run's configuration is never replaced) and as pipeline.resolved.yaml."""
        if self._config_file is None:
            assert self.manifest is not None
            text = self.pipeline.resolved_yaml()
            name = f"configs/{hashlib.sha256(text.encode()).hexdigest()[:16]}.yaml"
            if not (self.run_dir / name).is_file():
                atomic_write_text(self.run_dir / name, text)
            atomic_write_text(self.run_dir / "pipeline.resolved.yaml", text)
            if name not in [c["file"] for c in self.manifest.resolved_configs]:
                self.manifest.resolved_configs.append({"file": name, "pipeline": self.pipeline.config.name,
                                                       "source": self.pipeline.source, "first_used": now()})
            self._config_file = name
        return self._config_file

    def _register_external_inputs(self) -> None:
        assert self.manifest is not None
        for role, path in self.options.external_inputs.items():
            path = Path(path).resolve()
            try:
                digest, size = digest_path(path)
            except FileNotFoundError as exc:
                raise ArtifactError(f"--input {role}={path}: no such file or folder") from exc
            kind = "torch-model" if (path / "model.json").is_file() else ("onnx" if path.suffix == ".onnx" else "file")
            self.manifest.artifacts[f"external.{role}"] = ArtifactRecord(
                name=f"external.{role}", kind=kind, path=str(path), sha256=digest, size_bytes=size, stage="external")

    def _inputs(self, stage_name: str, refs: dict[str, str],
                left_out: dict[str, str] | None = None) -> dict[str, InputArtifact]:
        """The stage's input artifacts, verified; ``left_out`` collects its optional roles an earlier stage left
        out on purpose (role → why)."""
        manifest = self.manifest
        assert manifest is not None
        inputs = {}
        for role, artifact in refs.items():
            problem = manifest.verify(self.run_dir, artifact)
            if problem:
                producer = artifact.split(".", 1)[0]
                made = manifest.stages.get(producer)
                # why it was skipped: the producer's metrics under the artifact's own role where it says, else
                # every skip it recorded
                own = made.metrics.get(artifact.split(".", 1)[1]) if made else None
                skipped = [own["skipped"]] if isinstance(own, dict) and "skipped" in own else \
                    [m["skipped"] for m in (made.metrics.values() if made else []) if isinstance(m, dict) and "skipped" in m]
                left_on_purpose = isinstance(own, dict) and "skipped" in own  # its producer said why, by name
                stage_cfg = self.pipeline.stage(stage_name)
                # a bench's collected files: those it lists too, where their producer left them out on purpose
                collected = role.startswith(ARTIFACT_ROLE) and (not getattr(stage_cfg, "artifacts", None)
                                                                or left_on_purpose)
                # a role its stage can do without (optional_inputs), left out on purpose by a completed stage
                optional = left_on_purpose and role in registry.get(stage_cfg.kind).optional_inputs
                if (collected or optional) and made is not None and made.status == "completed" \
                        and artifact not in made.outputs:
                    if skipped:  # e.g. a TensorRT engine on a machine without TensorRT
                        logger.info(f"{artifact} not included: {producer} skipped it ({'; '.join(skipped)})",
                                    extra={"stage": stage_name})
                    if optional and left_out is not None:
                        left_out[role] = f"{producer} left {artifact} out: {'; '.join(skipped)}"
                    continue
                if skipped:
                    raise ArtifactError(f"stage {stage_name!r} needs input {artifact}, which stage {producer!r} "
                                        f"skipped: {'; '.join(skipped)}")
                raise ArtifactError(
                    f"stage {stage_name!r} needs input {artifact}, but {problem}; "
                    f"re-run the stage that makes it: compress run {self.pipeline.source} --from {producer}")
            record = manifest.artifacts[artifact]
            inputs[role] = InputArtifact(artifact, record.kind, manifest.resolve_path(self.run_dir, record), record.meta,
                                         record.size_bytes, record.sha256)
        return inputs

    def _key_material(self, cfg: StageConfig, cls: type, inputs: dict[str, InputArtifact]) -> dict:
        """Everything a stage's cache key is made of; kept in its record so a re-run can say what changed."""
        uses = cls.uses
        global_cfg = self.pipeline.config.model_dump(mode="json")
        data_digest = None
        if "data" in uses:
            self._load_data()
            data_digest = self._data_digest
        assert self.manifest is not None
        material = {"kind": cfg.kind, "settings": cfg.model_dump(mode="json", exclude={"distributed"}),
                    "uses": {key: _without_locations(key, global_cfg[key]) for key in uses}, "data": data_digest,
                    # Weights files and user model code by content, wherever a model section appears.
                    "sources": model_sources(cfg, self.pipeline.config.model if "model" in uses else None),
                    "inputs": {role: self.manifest.artifacts[art.name].sha256 for role, art in inputs.items()},
                    "input_names": {role: art.name for role, art in inputs.items()}, "version": __version__,
                    "environment": self._environment_digest if cls.keyed_on_environment else None}
        if (extra := cls.key_extra(cfg, self.pipeline.config)) is not None:  # what the settings do not say
            material["extra"] = extra
        task = task_named(self.pipeline.config.task)
        if task.pipeline_settings is not None:  # every stage's score (and the best epoch) depends on it (NMS)
            material[task.name] = {task.pipeline_settings: getattr(self.pipeline.config, task.pipeline_settings)
                                   .model_dump(mode="json")}
        if self.pipeline.config.threads is not None:  # float sums are split by thread: the bits depend on it
            material["threads"] = self.pipeline.config.threads
        spread = self._distributed(cfg, cls)
        if spread is not None:  # how many processes changes the weights; where they run does not
            material["distributed"] = spread.result_settings()
        return material

    def _distributed(self, cfg: StageConfig, cls: type) -> DistributedSettings | None:
        """The stage's distributed settings where it runs on more than one process, else None."""
        chosen = getattr(cfg, "distributed", None) or self.pipeline.config.distributed
        if chosen.processes <= 1 or not cls.distributable:
            return None
        return chosen

    def _output_problems(self, previous: StageRecord | None, cls: type) -> list[str]:
        """What is wrong with a completed stage's outputs: a file changed, or an output recorded under a name its
        kind has since renamed (a later stage would look for today's name and not find it)."""
        assert self.manifest is not None
        if previous is None or previous.status != "completed":
            return []
        renamed = cls.renamed
        former = [o for o in previous.outputs if o.partition(".")[2] in renamed]
        return [p for p in (self.manifest.verify(self.run_dir, o) for o in previous.outputs) if p] + [
            f"{o} is now named {o.partition('.')[0]}.{renamed[o.partition('.')[2]]}" for o in former]

    def _run_stage(self, index: int, refs: dict[str, str]) -> None:
        manifest = self.manifest
        assert manifest is not None
        cfg = self.pipeline.stages[index]
        cls = registry.get(cfg.kind)
        assert cls is not None
        left_out: dict[str, str] = {}
        inputs = self._inputs(cfg.name, refs, left_out)
        fallback = self._red_line.fall_back(cfg.name, cls, inputs)
        material = self._key_material(cfg, cls, inputs)
        if fallback is not None:  # in the record, and so in the key: switching fall_back off re-runs the stage
            material["fallback"] = fallback.record()
        input_digests = material["inputs"]
        key = _hash({k: v for k, v in material.items() if k != "input_names"})
        previous = manifest.stages.get(cfg.name)
        forced = cfg.name in self.options.force or cfg.name == self.options.from_stage
        # Outputs are re-hashed only where they could still let the stage be skipped: with another key it
        # re-runs anyway, and the changed key material is the reason.
        same_key = not forced and previous is not None and previous.cache_key == key
        problems = self._output_problems(previous, cls) if same_key else []
        if same_key and previous.status == "completed" and not problems:
            hint = f" (--force {cfg.name} re-runs it)" if self.options.only else ""
            logger.info(f"cached, skipped{hint}", extra={"stage": cfg.name})
            return
        reason = why_rerun(cfg.name, previous, material, problems, forced)

        if cls.judges_on_data:
            for artifact in inputs.values():
                check_same_data(artifact, self._load_data(), source=f"stage {cfg.name!r}",
                                independent=self.pipeline.config.data.independent_test)

        # A completed record stays while a new attempt runs: its outputs are only replaced on success.
        kept = previous if previous is not None and previous.status == "completed" else None
        record = StageRecord(name=cfg.name, kind=cfg.kind, status="running", config_hash=_hash(cfg.model_dump(mode="json")),
                             cache_key=key, input_digests=input_digests, package_version=__version__, started=now(),
                             environment=self._environment_digest, key_material=material,
                             resolved_config=self._record_config())
        if kept is not None:
            kept.last_attempt = {"status": "running", "started": record.started, "cache_key": key,
                                 "environment": self._environment_digest}
        else:
            manifest.stages[cfg.name] = record
        manifest.save(self.run_dir)
        ctx = StageContext(run_dir=self.run_dir, stage_dir=self.run_dir / cfg.name, name=cfg.name,
                           pipeline=self.pipeline.config, cache_key=key, console=self.console, load_data=self._load_data,
                           environment=manifest.environment, left_out=left_out)
        logger.info(f"running ({cfg.kind}): {reason}", extra={"stage": cfg.name})
        spread = self._distributed(cfg, cls)
        if spread is None and self.pipeline.config.distributed.processes > 1:
            logger.info(f"runs in this one process: a {cfg.kind} stage does not train on several",
                        extra={"stage": cfg.name})
        try:
            if spread is not None:
                cls(cfg).check_inputs(ctx, inputs)
                ctx.stage_dir.mkdir(parents=True, exist_ok=True)
                result, duration = launch_stage(
                    ctx, stage_index=index, kind=cfg.kind, pipeline=self.pipeline.resolved(),
                    source=self.pipeline.source, inputs=inputs, settings=spread, data_digest=self._load_data().digest())
            else:
                result, duration = cls(cfg).execute(ctx, inputs)
        except BaseException as exc:
            failure = {"status": "failed", "ended": now(), "error": f"{type(exc).__name__}: {exc}"}
            if kept is not None:
                kept.last_attempt.update(failure)
            else:
                record.status, record.ended, record.error = "failed", failure["ended"], failure["error"]
            try:
                manifest.save(self.run_dir)
            except OSError as save_error:  # e.g. the disk is full: the stage's own error is the one to report
                logger.warning(f"could not record the failed attempt ({save_error}); the manifest on disk is the "
                               "one from before this attempt", extra={"stage": cfg.name})
            if isinstance(exc, CompressError) or not isinstance(exc, Exception):
                raise
            raise from_library(exc, cfg.name, cfg.kind) from exc

        sources = list(dict.fromkeys(i.name for i in inputs.values()))  # one artifact may fill two roles
        self._red_line.judge_models(cfg.name, result.outputs, refs)
        record.outputs = self._register_outputs(cfg.name, result.outputs, sources)
        record.status, record.ended, record.duration_s = "completed", now(), round(duration, 3)
        record.metrics = result.metrics
        manifest.stages[cfg.name] = record
        manifest.save(self.run_dir)
        logger.info(f"done in {duration:.1f}s", extra={"stage": cfg.name})

    def _register_outputs(self, stage: str, outputs: list[Output], input_names: list[str]) -> list[str]:
        manifest = self.manifest
        assert manifest is not None
        for name in [a for a, r in manifest.artifacts.items() if r.stage == stage]:
            del manifest.artifacts[name]
        names = []
        for out in outputs:
            digest, size = digest_path(out.path)
            name = f"{stage}.{out.role}"
            manifest.artifacts[name] = ArtifactRecord(
                name=name, kind=out.kind, path=out.path.relative_to(self.run_dir).as_posix(), sha256=digest,
                size_bytes=size, stage=stage, meta=out.meta,
                made_from=out.made_from if out.made_from is not None else input_names)
            names.append(name)
        return names
