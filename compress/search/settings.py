"""The search file: the hand-set pipeline it starts from, the space over that pipeline's settings,
what to optimise, and how many trials run at once.

A separate file rather than a section of the pipeline: the hand-set pipeline stays runnable
as it is (it is the search's reference), and the configuration a search chooses is written
out as a plain pipeline file of the same shape.
"""
from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from compress.config import NAME_PATTERN, Strict
from compress.errors import ConfigError
from compress.pipeline.pipeline_file import (Pipeline, build_pipeline, fmt_path, line_map, line_of, read_yaml,
                                              set_dotted, yaml_value)
from serve_bench.accuracy.judges import JUDGES

OBJECTIVES = ("fastest_within_red_line", "most_accurate_within_budget", "most_traffic_within_budget")
# Settings a trial may not change: they name the run or pin what every trial must share.
FIXED_PATHS = ("name", "run_dir", "threads")
# The limits every trial and the final gate are judged against: the search's question, not a setting to vary.
LIMIT_PATHS = ("red_line", "latency.p99_budget_ms", "latency.scenario", "latency.target_qps", "latency.measured_at",
               "gate")
# Data settings that change where or how images are decoded, not which pixels a model sees.
DATA_LOCATION_FIELDS = ("decode_cache", "decode_cache_check", "cache_dir", "decode_workers")


def _fixed_reason(path: str) -> str | None:
    """Why a space may not vary ``path``, or None where it may."""
    if path in FIXED_PATHS or path.endswith((".name", ".kind")):
        return f"a trial may not change {path}"
    if any(path == p or path.startswith(p + ".") for p in LIMIT_PATHS):
        return ("the limits (red_line, latency.p99_budget_ms, gate) are what every trial is judged against, not a "
                "setting to search; set them in the hand-set pipeline")
    if path.startswith("data.") and path.split(".")[1] not in DATA_LOCATION_FIELDS:
        return ("every trial is judged against the reference baseline on the reference's images; a trial that "
                "changes the data would be measured on other images (or at another size): search the data as "
                "separate hand-set pipelines")
    return None


class Range(Strict):
    """A numeric range; integers when both ends are integers (and the step, if given)."""

    low: int | float
    high: int | float
    log: bool = Field(False, description="sample on a log scale (both ends above 0)")
    step: int | float | None = Field(None, gt=0, description="a grid: low, low+step, ... (not with log)")

    @model_validator(mode="after")
    def _check(self) -> "Range":
        if self.high <= self.low:
            raise ValueError(f"high {self.high} must be above low {self.low}")
        if self.log and (self.low <= 0 or self.step is not None):
            raise ValueError("log: both ends must be above 0 and no step")
        return self

    @property
    def integer(self) -> bool:
        return all(isinstance(v, int) and not isinstance(v, bool) for v in (self.low, self.high)) and \
            (self.step is None or isinstance(self.step, int))


class RaySettings(Strict):
    address: str | None = Field(None, description="an existing Ray cluster ('auto', 'HOST:6379' or "
                                                   "'ray://HOST:10001'); default: a Ray instance of this process")
    bench_resource: str = Field("compress_bench", description="the custom Ray resource of the machine latency is "
                                                              "measured on; one measurement holds it at a time")
    bench_cpus: int | None = Field(None, ge=1, description="CPUs a measurement holds, so nothing else runs beside "
                                                           "it (default: every CPU of this machine)")


class SearchSettings(Strict):
    name: str = Field(..., pattern=NAME_PATTERN)
    pipeline: str = Field(..., description="the hand-set pipeline file (relative to this file): run as it is, as "
                                           "the reference, and the base every trial changes")
    run_dir: str | None = Field(None, description="the search directory; default: runs/<name>")
    objective: Literal["fastest_within_red_line", "most_accurate_within_budget", "most_traffic_within_budget"] = Field(
        "fastest_within_red_line", description="most_traffic_within_budget: the trial whose artifact carries the "
        "most Poisson traffic within the p99 budget (its bench sweeps serving configurations: traffic.sweep)")
    sampler: Literal["tpe", "nsga2"] = Field("tpe", description="tpe: one objective under the red line; nsga2: the "
                                                                "accuracy/latency front")
    space: dict[str, Range | list[Any]] = Field(..., min_length=1,
                                                description="dotted pipeline setting → a range or a list of choices")
    trials: int = Field(12, ge=1, description="trials that finish (completed, stopped early or failed)")
    parallel: int = Field(2, ge=1, description="trials built at once (their measurements take turns)")
    threads_per_trial: int | None = Field(None, ge=1, description="torch threads of each trial's training; default: "
                                                                  "this machine's CPUs / parallel")
    startup_trials: int | None = Field(None, ge=1, description="random trials before the sampler models the results "
                                                               "(default: a third of the trials, at least 2)")
    population: int | None = Field(None, ge=2, description="nsga2's population (default: parallel × 2, at least 4)")
    seed: int = Field(0, ge=0, description="the sampler's seed")
    finalists: int = Field(3, ge=1, description="best trials re-measured together, with the hand-set result and "
                                                "the baseline, in the final interleaved bench")
    hopeless_margin: float = Field(3.0, ge=0, description="points past the red line at which a trial's validation "
                                                          "accuracy after pruning stops it before quantization")
    early_stop_after: str | None = Field(None, description="the stage after which that check is made (default: the "
                                                           "first prune stage)")
    ray: RaySettings = Field(default_factory=RaySettings)

    @model_validator(mode="after")
    def _check(self) -> "SearchSettings":
        for path, spec in self.space.items():
            reason = _fixed_reason(path)
            if reason:
                raise ValueError(f"space.{path}: {reason}")
            if isinstance(spec, list):
                if not spec:
                    raise ValueError(f"space.{path}: give at least one choice")
                plain = (type(None), bool, int, float, str)
                if not all(isinstance(v, plain) for v in spec):
                    raise ValueError(f"space.{path}: choices must be plain values (null, true/false, numbers, text); "
                                     "a section can be searched field by field")
        return self

    def space_dict(self) -> dict:
        """The space as plain data (for the study's record and the report)."""
        return {k: v if isinstance(v, list) else v.model_dump() for k, v in self.space.items()}

    def threads(self) -> int:
        return self.threads_per_trial or max(1, (os.cpu_count() or 1) // self.parallel)

    def startup(self) -> int:
        return self.startup_trials or max(2, self.trials // 3)


class SearchPlan:
    """A validated search: its settings, the base pipeline's raw mapping and where things live."""

    def __init__(self, path: Path, settings: SearchSettings, base_raw: dict, base_path: Path) -> None:
        self.path, self.settings, self.base_raw, self.base_path = path, settings, base_raw, base_path
        self.base = build_pipeline(self.trial_raw({}), str(base_path))

    @property
    def run_dir(self) -> Path:
        return Path(self.settings.run_dir or Path("runs") / self.settings.name)

    def trial_raw(self, params: dict[str, Any]) -> dict:
        """The base pipeline with ``params`` set and the search's thread count pinned."""
        raw = copy.deepcopy(self.base_raw)
        raw.pop("run_dir", None)
        raw["threads"] = self.settings.threads()
        for path, value in params.items():
            set_dotted(raw, path, value, f"{self.path}: space.{path}")
        return raw

    def trial_run_raw(self, params: dict[str, Any]) -> dict:
        """What a trial runs: ``trial_raw`` without MLflow tracking. A trial is two partial runs (build, then
        measure) beside other trials; logged, each would be two half MLflow runs, many at once on one store.
        The trial's folder and the search report are its record; the chosen pipeline keeps the section."""
        raw = self.trial_raw(params)
        if isinstance(raw.get("tracking"), dict):
            raw["tracking"].pop("mlflow", None)
        return raw

    def trial_pipeline(self, params: dict[str, Any]) -> Pipeline:
        return build_pipeline(self.trial_raw(params), f"{self.base_path} with {params}")


def _probes(spec: Range | list[Any]) -> list[Any]:
    return list(spec) if isinstance(spec, list) else [spec.low, spec.high]


def _check_space(plan: SearchPlan) -> None:
    """Every path must name a real setting and every end and choice must make a valid pipeline:
    a typo found after an hour of trials is an hour lost."""
    problems = []
    benches = {s.name for s in plan.base.stages if s.kind == "bench"}
    for path in plan.settings.space:
        if path == "latency.batch_size" or path.split(".")[:2] in (["stages", b] for b in benches):
            problems.append(f"  space.{path}: the measurement protocol (latency.batch_size and the bench stage's "
                            "settings) is how every trial and the final bench are measured, not a setting to search; "
                            "set it in the hand-set pipeline")
    for path, spec in plan.settings.space.items():
        if any(p.startswith(f"  space.{path}:") for p in problems):
            continue
        for value in _probes(spec):
            try:
                plan.trial_pipeline({path: value})
            except ConfigError as exc:
                detail = str(exc).split("\n", 1)[-1].strip()
                problems.append(f"  space.{path} = {value!r}: {detail}")
                break
    if problems:
        raise ConfigError(f"{plan.path}: {len(problems)} space {'entry does' if len(problems) == 1 else 'entries do'} "
                          "not make a valid pipeline (fix the path or the values):\n" + "\n".join(problems))


def _check_stages(plan: SearchPlan) -> None:
    kinds = [s.kind for s in plan.base.stages]
    if "bench" not in kinds:
        raise ConfigError(f"{plan.base_path}: a search measures every trial with the pipeline's bench stage, and it "
                          "has none; add `- {name: bench, kind: bench}` as its last stage")
    after = plan.settings.early_stop_after
    if after is not None and after not in [s.name for s in plan.base.stages]:
        raise ConfigError(f"{plan.path}: early_stop_after: no stage {after!r} in {plan.base_path}; stages: "
                          f"{', '.join(s.name for s in plan.base.stages)}")
    if plan.settings.objective == "most_traffic_within_budget":
        bench = next(s for s in plan.base.stages if s.kind == "bench")
        if not bench.traffic.sweep or plan.base.latency.p99_budget_ms is None:
            raise ConfigError(f"{plan.path}: objective most_traffic_within_budget ranks trials by the highest load "
                              f"their artifact carries within the p99 budget: in {plan.base_path} set "
                              f"latency.p99_budget_ms and `traffic: {{sweep: true}}` on bench stage {bench.name!r}")
    if plan.base_raw.get("threads") is not None:
        raise ConfigError(f"{plan.base_path}: threads: a search pins every trial's thread count itself; remove it and "
                          f"set threads_per_trial in {plan.path}")


def load_search(path: str | Path, overrides: list[str] | None = None) -> SearchPlan:
    path = Path(path)
    raw, text = read_yaml(path, "search file")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the search file must be a YAML mapping with name, pipeline and space")
    for assignment in overrides or []:
        key, sep, value = assignment.partition("=")
        if not sep or "." in key:
            raise ConfigError(f"override {assignment!r}: write a top-level search field, e.g. trials=16 or parallel=1")
        raw[key] = yaml_value(value)
    try:
        settings = SearchSettings.model_validate(raw)
    except ValidationError as exc:
        lines = line_map(text)
        rendered = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            line = line_of(lines, loc[:2] if loc[:1] == ("space",) else loc)
            rendered.append(f"  {path}:{line}: {fmt_path(loc)}: {err['msg'].removeprefix('Value error, ')}"
                            if line else f"  {path}: {fmt_path(loc)}: {err['msg'].removeprefix('Value error, ')}")
        raise ConfigError(f"{path}: {len(rendered)} problem{'s' if len(rendered) > 1 else ''} in the search file:\n"
                          + "\n".join(rendered)) from None
    base_path = path.parent / settings.pipeline
    if not base_path.is_file():
        raise ConfigError(f"{path}: pipeline: {base_path} is not a file; give the hand-set pipeline's path relative "
                          "to the search file")
    base_raw, _ = read_yaml(base_path)
    if not isinstance(base_raw, dict):
        raise ConfigError(f"{base_path}: the pipeline file must be a YAML mapping (named by {path}: pipeline)")
    if base_raw.get("task", "classification") in JUDGES:
        task = base_raw["task"]
        raise ConfigError(f"{base_path}: task: {task} cannot be searched yet (the search's split bench and its "
                          f"corrected intervals are written for paired top-k accuracy); tune the {task} pipeline "
                          "by hand, or search a classification pipeline")
    plan = SearchPlan(path, settings, base_raw, base_path)
    _check_stages(plan)
    _check_space(plan)
    return plan

