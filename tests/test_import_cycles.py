"""No two modules of the project import each other, directly or round a longer loop, counting the imports
inside functions: import-linter's layer contracts see only the floors, and a lazy import inside a method
(the kind that hid a runtime's profiler away from its runner) still ties two modules into one."""
from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("compress", "serve_bench", "train", "export")


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def _imported(node: ast.AST, package: str) -> list[str]:
    """The module names one import statement may bind (``from a import b``: ``a.b`` where b is a module)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            parts = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join(parts + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        return [base] + [f"{base}.{alias.name}" for alias in node.names]
    return []


def import_graph() -> dict[str, set[str]]:
    """Module → the project modules it imports anywhere in its body (top level, functions, methods)."""
    modules = _modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _imported(node, package):
                while target and target not in modules:  # a name from a module: the module itself
                    target = target.rsplit(".", 1)[0] if "." in target else ""
                if target and target != name:
                    graph[name].add(target)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return cycles


def test_no_module_imports_itself_round_a_loop():
    assert import_cycles(import_graph()) == []


def test_the_check_finds_a_loop_through_an_import_inside_a_function():
    """The rule on a known answer: a two-module loop closed only by an import inside a method, and a three-module
    loop, are found; a chain is not."""
    graph = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"g"}, "g": set()}
    assert sorted(import_cycles(graph)) == [["a", "b"], ["c", "d", "e"]]
    source = "import x\n\nclass R:\n    def profile(self):\n        from pkg.other import thing\n"
    imported = [t for node in ast.walk(ast.parse(source)) for t in _imported(node, "pkg")]
    assert "pkg.other" in imported  # the import inside the method counts
