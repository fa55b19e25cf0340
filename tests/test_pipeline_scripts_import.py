"""The scripts in pipelines/ import what exists: each ``from X import a, b`` anywhere in them (imports inside
functions included, which running the script's --help never reaches) names a module and names that are there."""
from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[1] / "pipelines").glob("*.py"))
OURS = ("compress", "serve_bench", "train", "export")


def _our_imports(path: Path) -> list[tuple[str, list[str], int]]:
    tree = ast.parse(path.read_text())
    return [(node.module, [a.name for a in node.names], node.lineno) for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in OURS]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_import_of_the_script_resolves(script):
    missing = []
    for module, names, line in _our_imports(script):
        try:
            found = importlib.import_module(module)
        except ImportError as exc:
            missing.append(f"{script.name}:{line}: {module} ({exc})")
            continue
        missing += [f"{script.name}:{line}: {module}.{name}" for name in names
                    if not hasattr(found, name) and importlib.util.find_spec(f"{module}.{name}") is None]
    assert missing == []
