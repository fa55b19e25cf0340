"""A run logged where its users already look: MLflow, one MLflow run per `compress run`.

After every stage (run or taken from the cache) its settings become parameters, its numeric
metrics (nested ones by dotted name) metrics, its status and summary tags; a train, distill or
prune stage's history (a report folder's history.json) becomes per-epoch curves, a bench
stage's report per-artifact accuracy and latency metrics and the report files themselves.
The run directory stays the record: tracking is a view of it, so an unreachable server stops
nothing but its own logging (one warning), while a store that cannot be opened at the start is
a configuration error before any stage runs.

Without a ``tracking.mlflow`` section nothing is imported or logged. The default store is local:
an SQLite file ``mlflow.db`` beside the run directories (MLflow refuses its old plain-file
store: measured with MLflow 3.17), browsable with ``mlflow ui --backend-store-uri sqlite:///runs/mlflow.db``.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Callable, Iterator

from compress import __version__
from compress.config import MlflowSettings, PipelineConfig
from compress.errors import ConfigError
from compress.pipeline.manifest import Manifest, StageRecord, now
from serve_bench import report_model

logger = logging.getLogger(__name__)
STORE_FILE, ARTIFACT_FOLDER = "mlflow.db", "mlartifacts"
_MAX_PARAM = 6000  # MLflow's limit on a parameter value's length
_BATCH = 100  # MLflow's log_batch takes at most 100 parameters at once
_UNSAFE = re.compile(r"[^A-Za-z0-9_\-. :/]")


def store_uri(settings: MlflowSettings, run_dir: Path) -> tuple[str, Path | None]:
    """(tracking URI, local folder for artifacts or None): a URI with a scheme is used as given; a plain
    folder, or no setting at all (the run directory's parent), is a local SQLite store."""
    given = settings.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if given and re.match(r"^[A-Za-z][A-Za-z0-9+.-]+:", given):  # a scheme: http:, sqlite:, file:, databricks
        return given, None
    folder = Path(given) if given else Path(run_dir).resolve().parent
    return f"sqlite:///{folder.resolve() / STORE_FILE}", folder.resolve() / ARTIFACT_FOLDER


# The calls that open the run: one retry and a 15 s timeout where the user set none of MLflow's own.
_OPENING_HTTP = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                 "MLFLOW_HTTP_REQUEST_TIMEOUT": "15"}


@contextlib.contextmanager
def _answer_soon() -> Iterator[None]:
    """A mistyped or stopped server refused in seconds: with MLflow's defaults (7 retries, backoff
    factor 2) a closed port took 250 s to fail (measured, MLflow 3.17.2). Calls once the run has
    started keep MLflow's patience, so a passing blip of the server costs no logging."""
    added = {k: v for k, v in _OPENING_HTTP.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def flatten(value: object, prefix: str) -> dict[str, object]:
    """Nested dicts by dotted keys; lists and other leaves kept as they are."""
    if isinstance(value, dict):
        out: dict[str, object] = {}
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def _key(name: str) -> str:
    return _UNSAFE.sub("_", name)[:250]


def numeric(values: dict[str, object]) -> dict[str, float]:
    return {_key(k): float(v) for k, v in values.items() if isinstance(v, (int, float)) and v == v}


class MlflowRun:
    """One MLflow run, written through ``MlflowClient`` (no global active run to leak into a user's code)."""

    def __init__(self, settings: MlflowSettings, config: PipelineConfig, run_dir: Path, source: str) -> None:
        try:
            from mlflow import MlflowClient
            from mlflow.exceptions import MlflowException
        except ImportError as exc:
            raise ConfigError(f"{source}: tracking.mlflow needs MLflow: pip install 'compress[tracking]'") from exc
        self._errors: tuple[type[BaseException], ...] = (MlflowException, OSError)
        uri, artifacts = store_uri(settings, run_dir)
        experiment = settings.experiment or config.name
        try:
            with _answer_soon():
                self.client = MlflowClient(tracking_uri=uri)
                found = self.client.get_experiment_by_name(experiment)
                if found is not None:
                    experiment_id = found.experiment_id
                else:
                    experiment_id = self.client.create_experiment(
                        experiment, artifact_location=(artifacts / experiment).as_uri() if artifacts else None)
                self.run_id = self.client.create_run(
                    experiment_id, run_name=settings.run_name or Path(run_dir).name,
                    tags={"compress.version": __version__, "compress.pipeline": config.name, "compress.source": source,
                          "compress.run_dir": str(Path(run_dir).resolve())}).info.run_id
        except self._errors as exc:
            raise ConfigError(f"{source}: tracking.mlflow: cannot open the MLflow store {uri} ({exc}); fix "
                              "tracking.mlflow.tracking_uri or remove the tracking section") from exc
        from mlflow.entities import Metric, Param, RunTag

        self._Metric, self._Param, self._RunTag = Metric, Param, RunTag
        self._broken = False
        logger.info(f"tracking in MLflow: {uri}, experiment {experiment!r}, run {self.run_id}")
        self.params({"pipeline": {k: v for k, v in config.model_dump(mode="json").items()
                                  if k not in ("stages", "tracking")}})

    def _safe(self, what: str, call: Callable[[], object]) -> None:
        """Log, unless the store already failed once: the run itself never stops for its tracking."""
        if self._broken:
            return
        try:
            call()
        except self._errors as exc:
            self._broken = True
            logger.warning(f"MLflow logging stopped ({what}: {exc}); the run goes on and its run directory has "
                           "every record")

    def params(self, values: dict) -> None:
        flat = {_key(k): json.dumps(v) if isinstance(v, (list, dict)) else str(v) for k, v in flatten(values, "").items()}
        self._safe("parameters", lambda: self._batch(params=[self._Param(k, v[:_MAX_PARAM]) for k, v in flat.items()]))

    def metrics(self, values: dict[str, float]) -> None:
        self.curves([(k, v, 0) for k, v in values.items()])

    def curves(self, points: list[tuple[str, float, int]]) -> None:
        stamp = int(time.time() * 1000)
        self._safe("metrics", lambda: self._batch(metrics=[self._Metric(k, v, stamp, s) for k, v, s in points]))

    def tags(self, values: dict[str, object]) -> None:
        self._safe("tags", lambda: self._batch(tags=[self._RunTag(_key(k), str(v)[:5000]) for k, v in values.items()]))

    def files(self, local: Path, path: str | None = None) -> None:
        if local.is_dir():
            self._safe("artifacts", lambda: self.client.log_artifacts(self.run_id, str(local), path))
        elif local.is_file():
            self._safe("artifacts", lambda: self.client.log_artifact(self.run_id, str(local), path))

    def _batch(self, params: list = (), metrics: list = (), tags: list = ()) -> None:
        for start in range(0, max(len(params), len(metrics), len(tags), 1), _BATCH):
            self.client.log_batch(self.run_id, metrics=list(metrics[start:start + _BATCH]),
                                  params=list(params[start:start + _BATCH]), tags=list(tags[start:start + _BATCH]))

    def stage(self, record: StageRecord, run_dir: Path, manifest: Manifest, cached: bool) -> None:
        name = record.name
        self.params({name: (record.key_material or {}).get("settings", {})})
        metrics = numeric(flatten(record.metrics, name))
        if record.duration_s is not None and not cached:
            metrics[_key(f"{name}.duration_s")] = record.duration_s
        self.metrics(metrics)
        self.tags({f"{name}.status": "cached" if cached else record.status,
                   **({f"{name}.summary": record.metrics["summary"]} if record.metrics.get("summary") else {})})
        for output in record.outputs:
            artifact = manifest.artifacts.get(output)
            if artifact is None or artifact.kind != "report":
                continue
            folder = manifest.resolve_path(run_dir, artifact)
            if (folder / "history.json").is_file():  # a train, distill or prune stage's curves, one point per epoch
                rows = json.loads((folder / "history.json").read_text())
                self.curves([(_key(f"{name}.{k}"), float(v), int(row.get("epoch", i))) for i, row in enumerate(rows)
                             for k, v in row.items() if k not in ("epoch", "step") and isinstance(v, (int, float))])
            if record.kind == "bench" and (folder / "report.json").is_file():
                report = report_model.read(json.loads((folder / "report.json").read_text()), str(folder))
                self.metrics(numeric({f"{name}.{a.name}.{k}": v for a in report.artifacts
                                      for k, v in _headline(a).items()}))
                self.tags({f"{name}.release": report.gate.release,
                           f"{name}.gate": "passed" if report.gate.passed else "FAILED"})
                self.files(folder, f"{name}/report")

    def end(self, run_dir: Path, status: str) -> None:
        for file in ("manifest.json", "pipeline.resolved.yaml"):
            self.files(Path(run_dir) / file)
        self._safe("the run's end", lambda: self.client.set_terminated(self.run_id, status=status))


def _headline(artifact: report_model.Entry) -> dict:
    lat = artifact.latency_ms
    return {**{k: v for k, v in artifact.accuracy.items() if k.startswith("top")}, "p50_ms": lat.p50,
            "p99_ms": lat.p99, "drop": artifact.accuracy_drop, "size_bytes": artifact.size_bytes}


class StageLog:
    """What the runner calls after each stage; does nothing where tracking is off."""

    def __init__(self, run: MlflowRun | None, run_dir: Path, started: str) -> None:
        self.run, self.run_dir, self.started = run, run_dir, started

    def stage_done(self, manifest: Manifest, name: str) -> None:
        record = manifest.stages.get(name)
        if self.run is not None and record is not None:
            self.run.stage(record, self.run_dir, manifest, cached=(record.started or "") < self.started)


@contextlib.contextmanager
def tracked(config: PipelineConfig, run_dir: Path, source: str,
            progress: Callable[[], tuple[Manifest | None, str | None]]) -> Iterator[StageLog]:
    """Open the MLflow run (if the pipeline asks for one) around a pipeline run; a failed or interrupted
    run is ended FAILED or KILLED, with the stage that stopped it logged."""
    settings, started = config.tracking.mlflow, now()  # records started before this are cached stages
    if settings is None:
        yield StageLog(None, run_dir, started)
        return
    run = MlflowRun(settings, config, run_dir, source)
    log = StageLog(run, run_dir, started)
    try:
        yield log
    except BaseException as exc:
        manifest, stage = progress()
        if manifest is not None and stage is not None:
            log.stage_done(manifest, stage)
            run.tags({"compress.stopped_at": stage, "compress.error": f"{type(exc).__name__}: {exc}"})
        run.end(run_dir, "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED")
        raise
    run.end(run_dir, "FINISHED")
