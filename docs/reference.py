"""The documentation's generated pages: the pipeline-file reference from the pydantic schema, the command-line
reference from the parser, and the report's fields from its typed model.

A hand-written reference drifts from the code the first time a field is added. Here a page holds a marker,
``<!-- generated: pipeline -->`` (or ``cli``, ``report``, ``runtimes``), and this MkDocs hook writes the reference there
at build time from the classes the tool itself validates with, so the site cannot describe a field the
code does not have, or miss one it has (a test checks the pipeline reference against the JSON schema).
"""
from __future__ import annotations

import argparse
import json
import re
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

MARKER = re.compile(r"<!-- generated: (\w+) -->")


@dataclass
class Row:
    path: str
    type: str
    default: str
    description: str


def nested_models(annotation) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (through Optional, unions, lists, dicts and Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found = []
    for arg in typing.get_args(annotation):
        found += [m for m in nested_models(arg) if m not in found]
    return found


def type_words(annotation) -> str:
    """An annotation as a user writes the value: ``"a" | "b"``, ``number``, ``list of …``, a section's name."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_words(args[0])
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(dict.fromkeys(type_words(a) for a in args))
    if origin in (list, tuple, set):
        return f"list of {type_words(args[0])}" if args else "list"
    if origin is dict:
        return f"mapping of {type_words(args[0])} to {type_words(args[1])}" if args else "mapping"
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    names = {int: "integer", float: "number", str: "text", bool: "true | false", typing.Any: "any"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _constraints(annotation) -> list:
    """The constraints inside an annotation's ``Annotated`` members (``Annotated[float, Field(gt=0)] | "auto"``)."""
    found = []
    if typing.get_origin(annotation) is typing.Annotated:
        for item in annotation.__metadata__:
            found += list(getattr(item, "metadata", None) or [item])  # a Field(...) holds its own constraints
    for arg in typing.get_args(annotation):
        found += _constraints(arg)
    return found


def bounds_words(field) -> str:
    """A field's numeric bounds as a user reads them (``≥ 18, ≤ 23``), from its constraints (``ge``, ``gt``, …),
    the field's own or a union member's."""
    signs = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}
    words = [f"{sign} {getattr(c, key)}" for c in [*field.metadata, *_constraints(field.annotation)]
             for key, sign in signs.items() if getattr(c, key, None) is not None]
    return f" ({', '.join(dict.fromkeys(words))})" if words else ""


def _default_value(field):
    if field.is_required():
        return PydanticUndefined
    return field.default_factory() if field.default_factory is not None else field.default


def value_words(value) -> str:
    if value is PydanticUndefined:
        return "required"
    if isinstance(value, BaseModel):
        return "see below" if type(value).model_fields else "{}"
    if isinstance(value, list) and any(isinstance(v, BaseModel) for v in value):
        return json.dumps([v.model_dump(mode="json", exclude_defaults=True) for v in value])
    return json.dumps(value, default=str)


def model_rows(model: type[BaseModel], prefix: str, seen: set | None = None,
               instance: BaseModel | None = None) -> Iterator[tuple[Row, list]]:
    """Every field of ``model`` and of the sections under it, depth first, each with its dotted path. A section's
    fields show the defaults of the section's own default where it has one (``target`` defaults to
    ``{macs: 0.45}``, so ``target.macs`` shows 0.45, not the class's bare default)."""
    seen = set() if seen is None else seen
    for name, field in model.model_fields.items():
        key = field.alias or name
        nested = nested_models(field.annotation)
        value = getattr(instance, name) if instance is not None else _default_value(field)
        yield Row(f"{prefix}{key}", type_words(field.annotation) + bounds_words(field), value_words(value),
                  (field.description or "").replace("|", "\\|").replace("\n", " ")), nested
        for sub in nested:
            if (sub, prefix + key) not in seen:
                seen.add((sub, prefix + key))
                inner = value if isinstance(value, sub) else None
                for row, more in model_rows(sub, f"{prefix}{key}.", seen, inner):
                    yield row, more


def pipeline_rows() -> dict[str, list[Row]]:
    """The pipeline file's fields: the top level (and its sections), then each stage kind's."""
    from compress.config import PipelineConfig
    from compress.stages import registry

    sections = {"the pipeline file": [row for row, _ in model_rows(PipelineConfig, "")
                                      if not row.path.startswith("stages.")]}
    for kind in registry.kinds():
        cls = registry.get(kind)
        sections[f"kind: {kind}"] = [row for row, _ in model_rows(cls.Config, "")]
    return sections


def _table(rows: list[Row], with_default: bool = True) -> str:
    head = "| field | type | default | description |\n|---|---|---|---|\n" if with_default else \
        "| field | type | description |\n|---|---|---|\n"
    lines = []
    for r in rows:
        cells = [f"`{r.path}`", r.type.replace("|", "\\|"), *([f"`{r.default}`"] if with_default else []),
                 r.description or "—"]
        lines.append("| " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


def pipeline_reference() -> str:
    out = []
    for title, rows in pipeline_rows().items():
        out.append(f"## {title}\n\n" + ("Each entry of `stages:` has `name`, `kind` and `inputs`, then its kind's "
                                        "settings.\n\n" if title.startswith("kind:") else "") + _table(rows))
    return "\n".join(out)


def report_reference() -> str:
    """The fields of ``report.json`` (serve_bench.report_model.Report), its entries' included."""
    from serve_bench.report_model import Report

    rows = [row for row, _ in model_rows(Report, "")]
    return _table(rows, with_default=False)


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, tuple[argparse.ArgumentParser, str]]:
    for action in parser._actions:  # argparse keeps its subcommands here and nowhere public
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return {name: (sub, helps.get(name, "")) for name, sub in action.choices.items()}
    return {}


def cli_reference() -> str:
    from compress.cli import build_parser

    out = []
    for name, (sub, summary) in _subcommands(build_parser()).items():
        usage = " ".join(sub.format_usage().split())[len("usage: "):]
        rows = []
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            flag = ", ".join(action.option_strings) or action.dest
            shown = not (action.default is None or action.default is False or action.default == argparse.SUPPRESS
                         or action.default == [])
            default = f" (default: `{action.default}`)" if shown else ""
            rows.append(f"| `{flag}` | {(action.help or '—').replace('|', '/')}{default} |")
        text = (sub.description or "").strip()
        out.append(f"### compress {name}\n\n{summary}\n\n```\n{usage}\n```\n\n" + (f"{text}\n\n" if text else "")
                   + ("| argument | meaning |\n|---|---|\n" + "\n".join(rows) + "\n" if rows else ""))
    return "\n".join(out)


def runtimes_reference() -> str:
    """One row per runtime, read from its runner class in the registry: the table cannot name a runtime the bench
    does not have, or miss one it has."""
    from serve_bench.runners import RUNNERS

    rows = []
    for name, runner in RUNNERS.items():
        if not runner.formats:  # the harness's simulated model
            continue
        kinds = ", ".join(f"`{kind}`" for kind in runner.formats)
        device = runner.fixed_device or "the bench's device"
        own = f"`{runner.native_int8_kind}`" if runner.native_int8_kind else "—"
        rows.append(f"| `{name}` | {runner.title or name} | {kinds} | "
                    f"{'yes' if runner.measured_by_default else 'where `runtimes` names it'} | "
                    f"{device} | {own} | "
                    f"`{runner.install_hint}` |")
    return ("| runtime | what it is | files it loads | measured by default | device | its own INT8 file | install |\n"
            "|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")


GENERATORS = {"pipeline": pipeline_reference, "cli": cli_reference, "report": report_reference,
              "runtimes": runtimes_reference}


def on_page_markdown(markdown: str, page, config, files, **kwargs) -> str:
    """MkDocs hook: each ``<!-- generated: NAME -->`` marker becomes NAME's generated reference."""
    return MARKER.sub(lambda m: GENERATORS[m.group(1)](), markdown)
