"""Input wiring: which artifact each stage of a pipeline reads per input role, defaults included.

Kept apart from the runner so the search's split benches and the tests can ask it of a pipeline
without running anything.
"""
from __future__ import annotations

import logging

from compress.errors import ConfigError
from compress.pipeline.pipeline_file import Pipeline
from compress.stages import registry

ARTIFACT_ROLE = "artifact:"  # roles of a collecting stage: one per artifact it measures

logger = logging.getLogger(__name__)


def _current_name(ref: str, stage: str, role: str, earlier: list[tuple[str, type]]) -> str:
    """``ref`` (``<stage>.<output>``) under the output's current name: a former one is read, and said."""
    maker, _, output = ref.partition(".")
    cls = next((c for n, c in earlier if n == maker), None)
    if cls is None or output not in cls.renamed:
        return ref
    current = f"{maker}.{cls.renamed[output]}"
    logger.warning("stages.%s.%s: %s is a former name of %s (deprecated); read as %s", stage,
                   role if role in ("artifacts", "leave_out") else f"inputs.{role}", ref, current, current)
    return current


def _first_train_model(earlier: list[tuple[str, type]]) -> str | None:
    """The red line's baseline: the first train stage's model, else the model the user brought (``model.model``)."""
    return next((f"{n}.model" for n, c in earlier if c.kind == "train"),
                next((f"{n}.model" for n, c in earlier if c.kind == "model"), None))


def input_refs(pipeline: Pipeline) -> dict[str, dict[str, str]]:
    """Artifact name each stage reads per input role.

    Defaults: ``model`` is the latest earlier model; ``teacher`` (and a ``baseline``) is the
    first train stage's model, the trained baseline (the brought model where nothing trains); a
    role in the stage's ``latest_of`` is the latest earlier artifact of that role (an INT8 export
    reads the latest Q/DQ file).
    """
    refs: dict[str, dict[str, str]] = {}
    earlier: list[tuple[str, type]] = []
    made: dict[str, tuple[str, ...]] = {}  # stage name → the roles its configuration makes
    for stage in pipeline.stages:
        cls = registry.get(stage.kind)
        assert cls is not None  # the pipeline was validated
        given = {**stage.inputs, **cls.config_refs(stage)}
        chosen: dict[str, str] = {}
        for role in cls.input_roles:
            ref = given.get(role)
            if ref is not None and "." in ref:
                chosen[role] = _current_name(ref, stage.name, role, earlier)
            elif ref is not None:  # a bare stage name: that stage's main artifact
                roles = made[ref]
                pick = role if role in roles else cls.latest_of.get(role) if cls.latest_of.get(role) in roles else \
                    roles[0] if roles else role
                chosen[role] = f"{ref}.{pick}"
            elif role == "model":
                makers = [n for n, roles in made.items() if "model" in roles]
                if makers:
                    chosen[role] = f"{makers[-1]}.model"
            elif role == "teacher" and cls.default_teacher and _first_train_model(earlier):
                chosen[role] = _first_train_model(earlier)
            elif role == "baseline" and _first_train_model(earlier):
                chosen[role] = _first_train_model(earlier)
            elif role in (latest := cls.latest_of_for(stage)):
                makers = [n for n, roles in made.items() if latest[role] in roles]
                if makers:
                    chosen[role] = f"{makers[-1]}.{latest[role]}"
        if cls.collects_deployable:
            left_out = [_current_name(n, stage.name, "leave_out", earlier)
                        for n in getattr(stage, "leave_out", None) or ()]
            deployable = [f"{n}.{role}" for n, c in earlier for role in c.deployable if role in made[n]]
            unknown = [name for name in left_out if name not in deployable]
            if unknown:
                raise ConfigError(f"stages.{stage.name}.leave_out: {', '.join(unknown)} is not made by an earlier "
                                  f"stage; the deployable artifacts are {', '.join(deployable) or 'none'}")
            listed = [_current_name(n, stage.name, "artifacts", earlier) for n in getattr(stage, "artifacts", None) or ()]
            names = listed or [name for name in deployable if name not in left_out]
            # The baseline is always measured in the same run, listed or not.
            baseline = getattr(stage, "baseline", None) or _first_train_model(earlier)
            if baseline and baseline not in names:
                names = [baseline, *names]
            chosen.update({f"{ARTIFACT_ROLE}{name}": name for name in names})
        refs[stage.name] = chosen
        earlier.append((stage.name, cls))
        made[stage.name] = cls.produces_for(stage)
    return refs
