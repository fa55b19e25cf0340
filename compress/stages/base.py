"""What every stage shares: registration by kind, the context it runs in, its result.

A stage's ``run`` does only what is specific to it. The base class and the runner do
the rest once: the stage folder, timing, the log line, checking that declared outputs
exist, cache keys and manifest records.
"""
from __future__ import annotations

import contextlib
import logging
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator

from rich.console import Console

from compress.config import DistributedSettings, PipelineConfig, StageConfig
from compress.errors import ArtifactError, StageError
from train.atomic_io import atomic_dir
from train.distributed import SINGLE, ProcessGroupInfo

if TYPE_CHECKING:
    from train.data import DataBundle

logger = logging.getLogger(__name__)


@dataclass
class InputArtifact:
    name: str
    kind: str
    path: Path
    meta: dict[str, Any] = field(default_factory=dict)
    size_bytes: int = 0  # as recorded in the manifest (a folder's files summed)
    sha256: str = ""  # as recorded in the manifest; empty where the artifact was given without one


@dataclass
class Output:
    role: str  # registered as "<stage>.<role>"
    kind: str
    path: Path
    meta: dict[str, Any] = field(default_factory=dict)
    made_from: list[str] | None = None  # default: every input of the stage


@dataclass
class StageResult:
    outputs: list[Output]
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass
class StageContext:
    run_dir: Path
    stage_dir: Path
    name: str
    pipeline: PipelineConfig
    cache_key: str
    console: Console
    load_data: Callable[[], "DataBundle"]
    environment: dict[str, Any] = field(default_factory=dict)  # the machine and software this run is on
    group: ProcessGroupInfo = SINGLE  # this process's rank when the stage runs under torchrun
    distributed: DistributedSettings | None = None  # the stage's settings when it runs on several processes
    left_out: dict[str, str] = field(default_factory=dict)  # optional input roles an earlier stage left out: why

    @property
    def data(self) -> "DataBundle":
        return self.load_data()

    @property
    def is_main(self) -> bool:
        return self.group.is_main

    def log(self, message: str, style: str | None = None) -> None:
        """A progress line of this stage, through ``logging`` (the run shows it on its console)."""
        logger.info(message, extra={"stage": self.name, "style": style})

    @contextlib.contextmanager
    def atomic_output_dir(self, relative: str) -> Iterator[Path]:
        """A folder artifact that appears under its final name only once complete.

        On ranks other than 0 the folder is scratch, removed afterwards: every rank runs the same
        stage code, and only rank 0's files become the artifact."""
        if not self.is_main:
            with tempfile.TemporaryDirectory(prefix=f"rank{self.group.rank}-") as scratch:
                yield Path(scratch)
            return
        with atomic_dir(self.stage_dir / relative) as tmp:
            yield tmp


class Stage:
    kind: ClassVar[str]
    Config: ClassVar[type[StageConfig]]
    input_roles: ClassVar[tuple[str, ...]] = ()
    required_inputs: ClassVar[tuple[str, ...]] = ()
    # Roles the stage runs without when the stage that makes them completed and recorded why it left them out
    # (``{"<role>": {"skipped": why}}`` in its metrics); any other missing input stops the run.
    optional_inputs: ClassVar[tuple[str, ...]] = ()
    produces: ClassVar[tuple[str, ...]] = ()
    deployable: ClassVar[tuple[str, ...]] = ()  # produced roles a benchmark measures
    collects_deployable: ClassVar[bool] = False  # takes every earlier deployable artifact as "artifact:<name>"
    default_teacher: ClassVar[bool] = False  # an unset "teacher" input defaults to the trained baseline
    # role → produced role: an unset input defaults to the latest earlier stage that makes one.
    latest_of: ClassVar[dict[str, str]] = {}
    # an output's former name → today's: a pipeline file's reference to the former is read as today's, with a warning
    renamed: ClassVar[dict[str, str]] = {}
    # Top-level pipeline sections whose values belong in this stage's cache key.
    uses: ClassVar[tuple[str, ...]] = ("seed", "data", "model")
    # Results depend on the machine (latencies, whether TensorRT builds): the environment
    # fingerprint joins the cache key, so a run directory moved to another machine re-measures.
    keyed_on_environment: ClassVar[bool] = False
    # Trains or measures accuracy on the data, so an input made on another split is refused
    # (compress.stages.data_match); a stage that only converts passes the input's record on instead.
    judges_on_data: ClassVar[bool] = True
    # Trains: may run on several processes under torchrun (the pipeline's or its own `distributed:`).
    distributable: ClassVar[bool] = False
    # Makes deployable files from its ``model`` input without training it further (quantize, export, nncf): where
    # that model is past the red line on validation, the runner gives it the last model within the line instead
    # (compress.stages.red_line_check; ``red_line.fall_back`` turns it off).
    makes_files_from_model: ClassVar[bool] = False

    def __init__(self, config: StageConfig) -> None:
        self.config = config

    @classmethod
    def config_refs(cls, config: StageConfig) -> dict[str, str]:
        """References to earlier artifacts made by settings (a distillation teacher); resolved like inputs."""
        return {}

    @classmethod
    def key_extra(cls, config: StageConfig, pipeline) -> dict | None:
        """Anything else a stage's results depend on that its settings do not say (resolved from the machine or
        from other stages' settings), added to its cache key; None: nothing."""
        return None

    @classmethod
    def produces_for(cls, config: StageConfig) -> tuple[str, ...]:
        """The roles this configuration makes, so a later stage's default never names one it won't."""
        return cls.produces

    @classmethod
    def latest_of_for(cls, config: StageConfig) -> dict[str, str]:
        """The ``latest_of`` defaults this configuration reads: an input it would not use must not join its
        cache key (or make a run re-do it when that input changes)."""
        return cls.latest_of

    def check_inputs(self, ctx: StageContext, inputs: dict[str, InputArtifact]) -> None:
        missing = [role for role in self.required_inputs if role not in inputs]
        if missing:
            raise ArtifactError(
                f"stage {ctx.name!r} ({self.kind}) needs input {', '.join(missing)}; "
                f"set stages.{ctx.name}.inputs or add an earlier stage that makes one"
            )

    def execute(self, ctx: StageContext, inputs: dict[str, InputArtifact]) -> tuple[StageResult, float]:
        self.check_inputs(ctx, inputs)
        ctx.stage_dir.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        result = self.run(ctx, inputs)
        duration = time.perf_counter() - start
        for out in result.outputs if ctx.is_main else ():
            if not out.path.exists():
                raise StageError(f"stage {ctx.name!r} declared output {out.role} at {out.path}, which was not written")
        return result, duration

    def run(self, ctx: StageContext, inputs: dict[str, InputArtifact]) -> StageResult:
        raise NotImplementedError(f"stage kind {self.kind!r} does not implement run()")
