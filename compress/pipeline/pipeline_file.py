"""Reading a pipeline file: YAML, command-line overrides, validation, one report of all errors.

Users fix config files in rounds; reporting every problem at once, each with its field
path and YAML line, turns five rounds into one.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from compress.config import PipelineConfig, StageConfig, check_metric_has_meaning
from compress.errors import ConfigError
from compress.stages import registry


@dataclass
class Pipeline:
    source: str
    config: PipelineConfig
    stages: list[StageConfig]

    def stage(self, name: str) -> StageConfig:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise ConfigError(f"{self.source}: no stage named {name!r}; stages: {', '.join(s.name for s in self.stages)}")

    def resolved(self) -> dict:
        data = self.config.model_dump(mode="json")
        data["stages"] = [s.model_dump(mode="json", by_alias=True) for s in self.stages]
        return data

    def resolved_yaml(self) -> str:
        return yaml.safe_dump(self.resolved(), sort_keys=False)


def fmt_path(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def line_map(text: str) -> dict[tuple, int]:
    lines: dict[tuple, int] = {}

    def walk(node: yaml.Node, path: tuple) -> None:
        lines[path] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                walk(value, path + (key.value,))
                lines[path + (key.value,)] = key.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, path + (i,))

    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return lines
    if root is not None:
        walk(root, ())
    return lines


def line_of(lines: dict[tuple, int], loc: tuple) -> int | None:
    for end in range(len(loc), -1, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return None


def apply_override(raw: dict, assignment: str) -> tuple:
    """``stages.train.epochs=3``: a stage is addressed by its name (or index); values are YAML.

    Returns the location it set, with stage names turned into indices, so a validation
    error there can point at the override rather than at a line of the file.
    """
    key, sep, value_text = assignment.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {assignment!r}: write key=value, e.g. stages.train.epochs=3 or seed=1")
    return set_dotted(raw, key, yaml_value(value_text), f"override {assignment!r}")


def yaml_value(text: str) -> Any:
    """The value of a command-line ``key=value`` as YAML reads it; text that is not YAML stays text."""
    try:
        return yaml.safe_load(text) if text else None
    except yaml.YAMLError:
        return text


def set_dotted(raw: dict, key: str, value: Any, what: str | None = None) -> tuple:
    """Set ``key`` (dotted, stages by name or index) in a raw pipeline mapping; sections on the way are created."""
    what = what or repr(key)
    parts = key.split(".")
    target: Any = raw
    location: list = []
    for i, part in enumerate(parts[:-1]):
        if isinstance(target, list):
            names = [s.get("name") for s in target if isinstance(s, dict)]
            if part in names:
                location.append(names.index(part))
                target = target[names.index(part)]
            elif part.isdigit() and int(part) < len(target):
                location.append(int(part))
                target = target[int(part)]
            else:
                raise ConfigError(f"{what}: no stage named {part!r}; stages: {', '.join(map(str, names))}")
        elif isinstance(target, dict):
            location.append(part)
            if target.get(part) is None:  # an unset optional section (e.g. `distill: null`) is filled in
                target[part] = {}
            target = target[part]
            if not isinstance(target, (dict, list)):
                raise ConfigError(f"{what}: {'.'.join(parts[:i + 1])} is a value, not a section")
        else:
            raise ConfigError(f"{what}: {'.'.join(parts[:i])} is a value, not a section")
    if not isinstance(target, dict):
        raise ConfigError(f"{what}: {'.'.join(parts[:-1])} is a list; address a stage by name")
    target[parts[-1]] = value
    return tuple(location + [parts[-1]])


def _describe(err: dict, model: type[BaseModel] | None) -> str:
    if err["type"] == "extra_forbidden" and model is not None:
        return f"unknown field; known fields: {', '.join(model.model_fields)}"
    message = err["msg"].removeprefix("Value error, ")
    if err["type"] not in ("missing", "value_error") and "input" in err and not isinstance(err["input"], (dict, list)):
        message += f", got {err['input']!r}"
    return message


def _owner(model: type[BaseModel], loc: tuple) -> type[BaseModel]:
    """The nested model a location points into, to list its fields on an unknown key."""
    current: Any = model
    for part in loc[:-1]:
        fields = getattr(current, "model_fields", {})
        if part not in fields:
            break
        annotation = fields[part].annotation
        for candidate in (annotation, *getattr(annotation, "__args__", ())):
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                current = candidate
                break
    return current


def _validate_stage(i: int, entry: dict, raw_stages: list, seen: dict[str, int],
                    problems: list[tuple[tuple, str]]) -> StageConfig | None:
    kind = entry.get("kind")
    cls = registry.get(kind) if isinstance(kind, str) else None
    if cls is None:
        problems.append((("stages", i, "kind"), f"unknown stage kind {kind!r}; known kinds: {', '.join(registry.kinds())}"))
        return None
    try:
        stage = cls.Config.model_validate(entry)
    except ValidationError as exc:
        for err in exc.errors():
            problems.append((("stages", i, *err["loc"]), _describe(err, _owner(cls.Config, err["loc"]))))
        return None
    if stage.name in seen:
        problems.append((("stages", i, "name"), f"duplicate stage name {stage.name!r} (also stages[{seen[stage.name]}])"))
    refs = {**{("inputs", role): ref for role, ref in stage.inputs.items()},
            **{(role,): ref for role, ref in cls.config_refs(stage).items()}}
    for where, ref in refs.items():
        role = where[-1]
        if where[0] == "inputs" and role not in cls.input_roles:
            problems.append((("stages", i, "inputs", role),
                             f"stage kind {kind!r} takes no input {role!r}; it takes: {', '.join(cls.input_roles) or 'none'}"))
        ref_stage = ref.split(".", 1)[0]
        if ref_stage not in seen:
            later = any(isinstance(s, dict) and s.get("name") == ref_stage for s in raw_stages[i:])
            hint = " (it runs later; inputs must come from earlier stages)" if later else ""
            problems.append((("stages", i, *where), f"refers to stage {ref_stage!r}, which is not an earlier "
                             f"stage{hint}; earlier stages: {', '.join(seen) or 'none'}"))
    return stage


_NEEDS_TORCH = ("train", "prune", "distill")


def _start_from_model(config: PipelineConfig, raw_stages: list, stages: list[StageConfig], seen: dict[str, int],
                      problems: list[tuple[tuple, str]]) -> None:
    """A model section with trained weights or an ONNX file is the run's first artifact: a ``kind: model``
    stage named ``model`` goes in front (unless the file writes one), so the first stage takes it by default
    and any stage can name it in ``inputs:``."""
    from compress.stages.model_stage import NAME, ModelSourceConfig

    entries = [s for s in raw_stages if isinstance(s, dict)]
    if any(s.get("kind") == "model" for s in entries):
        return
    for i, entry in enumerate(raw_stages):
        if isinstance(entry, dict) and entry.get("name") == NAME:
            problems.append((("stages", i, "name"), f"the name {NAME!r} is taken by the model section's artifact "
                             f"(model.weights / model.onnx); rename this stage"))
        if config.model.onnx and isinstance(entry, dict) and entry.get("kind") in _NEEDS_TORCH:
            problems.append((("stages", i, "kind"), f"a {entry['kind']} stage needs the torch model, and model.onnx "
                             "is an ONNX file: give model.name and model.weights instead, or drop the stage"))
    stages.append(ModelSourceConfig(name=NAME, kind="model"))
    seen[NAME] = -1


def build_pipeline(raw: Any, source: str, lines: dict[tuple, int] | None = None,
                   overridden: dict[tuple, str] | None = None) -> Pipeline:
    lines, overridden = lines or {}, overridden or {}
    problems: list[tuple[tuple, str]] = []
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the file must be a YAML mapping with name, data, model and stages")
    config = None
    try:
        config = PipelineConfig.model_validate(raw)
    except ValidationError as exc:
        for err in exc.errors():
            problems.append((err["loc"], _describe(err, _owner(PipelineConfig, err["loc"]))))
    else:
        from train.datasets import class_count

        try:
            check_metric_has_meaning(config.red_line.metric, class_count(config.data.name, config.data.path,
                                                                         config.data.synthetic_classes))
        except ValueError as exc:
            problems.append((("red_line", "metric"), str(exc)))

    stages: list[StageConfig] = []
    raw_stages = raw.get("stages") if isinstance(raw.get("stages"), list) else []
    seen: dict[str, int] = {}
    if config is not None and config.model.given:
        _start_from_model(config, raw_stages, stages, seen, problems)
    for i, entry in enumerate(raw_stages):
        if not isinstance(entry, dict):
            continue  # already reported by PipelineConfig
        stage = _validate_stage(i, entry, raw_stages, seen, problems)
        if stage is not None:
            stages.append(stage)
        if isinstance(entry.get("name"), str):
            seen.setdefault(entry["name"], i)

    if problems:
        rendered = []
        for loc, message in problems:
            line = line_of(lines, loc)
            where = f"{source}:{line}" if line else source
            for path, assignment in overridden.items():
                if tuple(loc[:len(path)]) == path:
                    where = f"{source} (override {assignment})"
            rendered.append(f"  {where}: {fmt_path(loc)}: {message}")
        noun = "problem" if len(problems) == 1 else "problems"
        raise ConfigError(f"{source}: {len(problems)} {noun} in the pipeline:\n" + "\n".join(rendered))
    assert config is not None
    return Pipeline(source=source, config=config, stages=stages)


def read_yaml(path: Path, what: str = "pipeline file") -> tuple[Any, str]:
    """The parsed YAML and its text; an unreadable file or a YAML error names the file and line."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the {what} ({exc.strerror})") from exc
    try:
        return yaml.safe_load(text), text
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError(f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from exc


def load_pipeline(path: str | Path, overrides: list[str] | None = None) -> Pipeline:
    path = Path(path)
    raw, text = read_yaml(path)
    overridden = {}
    for assignment in overrides or []:
        if not isinstance(raw, dict):
            break
        overridden[apply_override(raw, assignment)] = assignment
    return build_pipeline(raw, str(path), line_map(text), overridden)
