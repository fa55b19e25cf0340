"""The chain keeps to the red line: each model a stage makes is judged on the validation split, and a stage that
makes deployable files from a model past the line is given the last model within it (:mod:`compress.stages.red_line_check`
holds the rule; this holds the run's side of it: the manifest, the baseline, the log)."""
from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from compress.config import PipelineConfig
from compress.pipeline.manifest import Manifest, digest_path
from compress.stages import red_line_check
from compress.stages.base import InputArtifact, Output

logger = logging.getLogger(__name__)


class RedLineWiring:
    """Judges a run's models and falls back where a file-making stage is wired to one past the line."""

    def __init__(self, config: PipelineConfig, stages: list, run_dir: Path, manifest_of: Callable[[], Manifest | None],
                 load_data: Callable) -> None:
        """``stages``: the pipeline's validated stage settings, in order; ``manifest_of``: the run's manifest, once
        loaded."""
        self.config, self.stages, self.run_dir = config, stages, Path(run_dir)
        self.manifest_of, self.load_data = manifest_of, load_data
        self.val_cache: dict[str, tuple[str, float]] = {}  # validation figures by model digest (the baseline's once)

    def baseline(self, refs: dict[str, str]) -> InputArtifact | None:
        """The red line's baseline, as the bench measures against it: the first train stage's model, else the model
        the user brought."""
        name = refs.get("baseline") or next(
            (f"{s.name}.model" for kind in ("train", "model") for s in self.stages if s.kind == kind), None)
        record = self.manifest_of().artifacts.get(name or "")
        if record is None or record.kind != "torch-model":
            return None
        return InputArtifact(name, record.kind, self.manifest_of().resolve_path(self.run_dir, record), record.meta,
                             record.size_bytes, record.sha256)

    def judge_models(self, stage: str, outputs: list[Output], refs: dict[str, str]) -> None:
        """Each torch model the stage made, judged on the validation split against the red line (kept in its
        record's meta, read by :meth:`fall_back` of the stages after it). Only stages after the baseline's own:
        an earlier one would be judged against a baseline of the last run. A model that cannot be judged is left
        without a verdict, which no stage reads as within the line."""
        red = self.config.red_line
        models = [o for o in outputs if o.kind == "torch-model"]
        if not red.fall_back or not models or not self.load_data().meaningful_accuracy:
            return
        baseline = self.baseline(refs)
        names = [s.name for s in self.stages]
        if baseline is None or baseline.name.split(".", 1)[0] not in names[:names.index(stage)]:
            return
        for out in models:
            name = f"{stage}.{out.role}"
            digest, size = digest_path(out.path)
            made = InputArtifact(name, out.kind, out.path, out.meta, size, digest)
            try:
                verdict = red_line_check.judged(made, baseline, self.load_data(), red.max_drop, self.val_cache)
            except Exception as exc:  # noqa: BLE001 - the stage's work stands; only the verdict is missing, said
                logger.warning(f"{name} could not be judged on validation ({type(exc).__name__}: {exc}); a stage "
                               "that makes files from it uses it as it is", extra={"stage": stage})
                continue
            out.meta[red_line_check.RECORD_KEY] = verdict
            logger.info(f"{name} on validation: {red_line_check.verdict_words(verdict)}: "
                        f"{'within' if verdict['within'] else 'PAST'} the red line", extra={"stage": stage})

    def fall_back(self, stage: str, cls: type, inputs: dict[str, InputArtifact]):
        """Where the stage makes deployable files from a model past the red line, the last model within it in
        that model's place (said in the log with what it costs); None where nothing changes. Verdicts are read
        against today's line and baseline, and judged here where a record has none that fits."""
        model = inputs.get("model")
        red = self.config.red_line
        if not cls.makes_files_from_model or model is None or model.kind != "torch-model" or not red.fall_back:
            return None
        baseline = self.baseline({})
        if baseline is None or model.name == baseline.name or not self.load_data().meaningful_accuracy:
            return None
        manifest = self.manifest_of()

        def source_of(artifact: InputArtifact) -> InputArtifact | None:
            maker = manifest.stages.get(manifest.artifacts[artifact.name].stage) \
                if artifact.name in manifest.artifacts else None
            name = ((maker.key_material or {}).get("input_names") or {}).get("model") if maker else None
            record = manifest.artifacts.get(name or "")
            if record is None or record.kind != "torch-model":
                return None
            return InputArtifact(name, record.kind, manifest.resolve_path(self.run_dir, record), record.meta,
                                 record.size_bytes, record.sha256)

        def verdict_of(artifact: InputArtifact) -> dict | None:
            if artifact.name == baseline.name:
                return {"within": True}
            verdict = red_line_check.current(artifact.meta.get(red_line_check.RECORD_KEY), baseline, red.max_drop)
            if verdict is None:
                try:
                    verdict = red_line_check.judged(artifact, baseline, self.load_data(), red.max_drop,
                                                    self.val_cache)
                except Exception as exc:  # noqa: BLE001 - not judged: never taken as within, said
                    logger.warning(f"{artifact.name} could not be judged on validation ({type(exc).__name__}: "
                                   f"{exc})", extra={"stage": stage})
                    return None
                if artifact.name in manifest.artifacts:  # kept, so the next run reads it instead of judging again
                    manifest.artifacts[artifact.name].meta[red_line_check.RECORD_KEY] = verdict
            return verdict

        found = red_line_check.fallback_for(model, source_of, verdict_of)
        if found is None:
            verdict = verdict_of(model)
            if verdict is not None and not verdict["within"]:
                logger.warning(f"{model.name} is past the red line on validation, and no model within it is behind "
                               "it: this stage uses it", extra={"stage": stage})
            return None
        inputs["model"], fallback = found
        logger.warning(fallback.words(stage), extra={"stage": stage, "style": "yellow"})
        return fallback
