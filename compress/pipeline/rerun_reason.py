"""Why a stage runs again, in one line: a silent re-run looks like a repair nobody asked for.

The runner keeps what each completed stage's cache key was made of (its settings, the
pipeline sections it uses, its input digests, the data digest, model sources, version and
machine); comparing that with the current material names the field, input or file that
changed.
"""
from __future__ import annotations

from typing import Any

_LIMIT = 4  # changed settings named on the line; more are counted


def changed_paths(old: Any, new: Any, prefix: str) -> list[str]:
    """Dotted paths where two JSON-like values differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new), key=str):
            out += changed_paths(old.get(key), new.get(key), f"{prefix}.{key}" if prefix else str(key))
        return out
    return [] if old == new else [prefix]


def _settings_words(paths: list[str]) -> str:
    shown = ", ".join(paths[:_LIMIT])
    return shown + (f" and {len(paths) - _LIMIT} more" if len(paths) > _LIMIT else "")


def why_rerun(stage: str, previous, material: dict, output_problems: list[str], forced: bool) -> str:
    """The reason a stage runs now: ``previous`` is its last record (or None), ``material`` the current
    cache-key material, ``output_problems`` what is wrong with the previous outputs."""
    if forced:
        return "asked to (--force / --from)"
    if previous is None:
        return "first run in this run directory"
    if previous.status != "completed":
        return f"its previous attempt did not complete ({previous.status}); running again"
    attempt = previous.last_attempt or {}
    if attempt.get("status") in ("failed", "running"):
        note = f"the last attempt {'failed' if attempt['status'] == 'failed' else 'was interrupted'}"
    else:
        note = ""
    reasons = []
    if output_problems:
        reasons.append(f"outputs changed ({'; '.join(output_problems)})")
    old = previous.key_material
    if old is None:
        if not reasons:
            reasons.append("its cache key changed (the record predates kept reasons)")
    else:
        settings = changed_paths(old.get("settings"), material.get("settings"), f"stages.{stage}")
        settings += changed_paths(old.get("uses"), material.get("uses"), "")
        if settings:
            reasons.append(f"settings changed: {_settings_words(settings)}")
        inputs = sorted(set(changed_paths(old.get("inputs"), material.get("inputs"), "")))
        if inputs:
            names = [material.get("input_names", {}).get(role, role) for role in inputs]
            reasons.append(f"input changed: {', '.join(names)}")
        for key, words in (("data", "data changed (split digest)"), ("sources", "model weights or code changed"),
                           ("version", "package version changed"), ("environment", "machine or software changed")):
            if old.get(key) != material.get(key):
                reasons.append(words)
    if not reasons:
        reasons.append(note or "its cache key changed")
    elif note:
        reasons.append(note)
    return "; ".join(reasons)
