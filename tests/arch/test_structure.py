"""The package's shape: no import cycle between rockjit's modules, no module over 500 lines.

Imports are read with ``ast`` from the source (nothing is imported), including imports inside
functions: a function-level import that closes a cycle is still a cycle, only deferred.
Imports under ``if TYPE_CHECKING:`` are left out (they never run).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "rockjit"
MAX_LINES = 500
# modules another helper is splitting right now (issue 11), with the reason they may be long
LONG_OK: dict[str, str] = {}
# cycles another helper is removing right now (issue 11); each entry is one module of the cycle
CYCLES_OK: dict[str, str] = {}


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(name: str, path: Path, modules: set[str]) -> set[str]:
    """The rockjit modules ``name`` imports (the most specific existing module per name)."""
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    found: set[str] = set()

    def resolve(mod: str, names: list[str]) -> None:
        for n in names:
            if f"{mod}.{n}" in modules:
                found.add(f"{mod}.{n}")
            elif mod in modules:
                found.add(mod)

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for c in child.orelse:
                    visit(c)
                continue
            if isinstance(child, ast.Import):
                for a in child.names:
                    if a.name in modules:
                        found.add(a.name)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[:len(base) - (child.level - 1)]
                    mod = ".".join(base + ([child.module] if child.module else []))
                else:
                    mod = child.module or ""
                if mod.split(".")[0] == "rockjit":
                    resolve(mod, [a.name for a in child.names])
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    found.discard(name)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(m, p, set(mods)) for m, p in mods.items()}


def _edges_within(comp: list[str], graph: dict[str, set[str]]) -> str:
    return "\n".join(f"    {a} -> {b}" for a in comp for b in sorted(graph[a]) if b in comp)


def test_no_import_cycle() -> None:
    graph = _graph()
    # a package's __init__ re-exporting its submodules is not a cycle of meaning: an edge from
    # a package to its own submodule is left out
    graph = {m: {d for d in deps if not d.startswith(m + ".")} for m, deps in graph.items()}
    bad = [c for c in _cycles(graph) if not any(m in CYCLES_OK for m in c)]
    msg = "\n".join(f"  cycle of {len(c)} modules:\n{_edges_within(c, graph)}" for c in bad)
    assert not bad, f"import cycles in rockjit/ (break them: move the shared part down):\n{msg}"


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("name,path", sorted(_modules().items()))
def test_module_size(name: str, path: Path) -> None:
    n = len(path.read_text().splitlines())
    if name in LONG_OK:
        return
    assert n <= MAX_LINES, (f"{path.relative_to(PKG.parent)} has {n} lines (limit {MAX_LINES}): "
                            f"split it by job")
