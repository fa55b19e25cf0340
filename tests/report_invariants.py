"""Checks of real bench reports: every figure against its own interval, and every key against the report model."""
from __future__ import annotations

import typing

from pydantic import BaseModel

_ROUNDING = 0.5e-4  # report.json rounds ratios and speed-ups to 4 decimals


def _inside(label: str, point, interval, problems: list[str]) -> None:
    if point is None or not interval:
        return
    if not interval[0] <= point <= interval[1]:
        problems.append(f"{label} {point:g} outside [{interval[0]:g}, {interval[1]:g}]")


def points_outside_intervals(report: dict) -> list[str]:
    """Every (point, interval) pair of every artifact: latency percentiles over blocks and requests, each
    latency ratio (against the baseline and INT8 against fp32), the speed-up; and the speed-up must be the
    inverse of the p99 ratio the ratio table shows. An empty list: the report is consistent."""
    problems: list[str] = []
    for art in report["artifacts"]:
        name, lat = art["name"], art.get("latency_ms") or {}
        for key in ("p50", "p99"):
            _inside(f"{name}: latency_ms.{key} (blocks)", lat.get(key), lat.get(f"{key}_ci_blocks"), problems)
        _inside(f"{name}: latency_ms.p99 (requests)", lat.get("p99"), lat.get("p99_ci"), problems)
        _inside(f"{name}: latency_ms.p50 (requests)", lat.get("p50"), lat.get("p50_ci"), problems)
        _inside(f"{name}: speedup_p99", art.get("speedup_p99"), art.get("speedup_p99_ci"), problems)
        for family in ("latency_ratio", "int8_vs_fp32", "vs_export_alone"):
            for key, ratio in (art.get(family) or {}).items():
                if isinstance(ratio, dict):
                    _inside(f"{name}: {family}.{key}", ratio["ratio"], ratio["ci"], problems)
        ratio = (art.get("latency_ratio") or {}).get("p99")
        # 1/r moves by up to rounding/r² when r moves by the rounding, and the speed-up has its own rounding
        if ratio and abs(art["speedup_p99"] - 1 / ratio["ratio"]) > _ROUNDING / ratio["ratio"] ** 2 + _ROUNDING:
            problems.append(f"{name}: speedup_p99 {art['speedup_p99']:g} is not 1/latency_ratio.p99 "
                            f"{ratio['ratio']:g}")
    return problems


def untyped_keys(model, data, where: str = "") -> list[str]:
    """Keys of ``data`` that ``model`` (a report model class) does not name, through its typed sections."""
    def models_in(annotation) -> list:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return [annotation]
        return [m for arg in typing.get_args(annotation) for m in models_in(arg)]

    def mapping(annotation) -> bool:  # dict[...] or dict[...] | None
        return typing.get_origin(annotation) is dict or any(typing.get_origin(a) is dict
                                                             for a in typing.get_args(annotation))

    fields = {(f.alias or n): f for n, f in model.model_fields.items()}
    found = [f"{where}{k}" for k in data if k not in fields]
    for key, value in data.items():
        sections = models_in(fields[key].annotation) if key in fields else []
        if not sections:
            continue  # no section under it: a value, or a mapping of the runtime's own facts as it reported them
        if mapping(fields[key].annotation) and isinstance(value, dict):
            items = [(f"[{k!r}]", v) for k, v in value.items()]  # a mapping of sections: each value checked
        else:
            items = [(f"[{i}]", v) for i, v in enumerate(value)] if isinstance(value, list) else [("", value)]
        found += [k for label, item in items if isinstance(item, dict)
                  for k in untyped_keys(sections[0], item, f"{where}{key}{label}.")]
    return found
