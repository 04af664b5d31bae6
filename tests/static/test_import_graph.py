"""No project module imports another that imports it back, directly or not.

The graph is built from source with ``ast``, over every module of
``docket_core``, ``docket_memory``, ``docket_redis`` and ``docket_glide``.
An edge is an ``import``/``from ... import`` of a project module anywhere in
a module: at module level, in a class or in a function (a function-level
import is a dependency too, only a deferred one).  How imports count:

- ``import a.b`` depends on ``a.b``; ``from a import n`` on ``a.n`` when that
  is a module, else on ``a``; relative imports are resolved first.
- Importing ``a.b.c`` also runs the ``__init__`` of ``a`` and ``a.b``: an edge
  goes to each such package, except the importer's own packages, which are
  already running when it imports anything.
- Imports under ``if TYPE_CHECKING:`` never run, so they are no edges (their
  ``else:`` branch does run and counts).
- ``importlib.import_module`` with a computed name is not seen.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("docket_core", "docket_memory", "docket_redis", "docket_glide")


def project_modules() -> dict[str, Path]:
    """Every module of the project packages: dotted name -> source file."""
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements under ``node`` that can run (not type-only)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for statement in child.orelse:
                yield from _runtime_imports(ast.Module(body=[statement], type_ignores=[]))
        else:
            yield from _runtime_imports(child)


def _ancestors(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules that ``module`` runs when its imports run."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    named: set[str] = set()
    for statement in _runtime_imports(ast.parse(path.read_text(), str(path))):
        if isinstance(statement, ast.Import):
            named.update(alias.name for alias in statement.names)
            continue
        base = statement.module or ""
        if statement.level:
            anchor = package.split(".")
            anchor = anchor[: len(anchor) - (statement.level - 1)]
            base = ".".join([*anchor, base] if base else anchor)
        for alias in statement.names:
            submodule = f"{base}.{alias.name}"
            named.add(submodule if submodule in modules else base)
    own = set(_ancestors(module))
    edges: set[str] = set()
    for target in named:
        for name in [*_ancestors(target), target]:
            if name in modules and name != module and (name == target or name not in own):
                edges.add(name)
    return edges


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan),
    or with a module importing itself, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _path_within(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One concrete cycle through the component's first module, for the message."""
    members = set(component)
    start = component[0]
    trail = [start]
    seen = {start}
    while True:
        successors = sorted(graph[trail[-1]] & members)
        if start in successors and (len(trail) > 1 or len(members) == 1):
            return [*trail, start]
        step = next((s for s in successors if s not in seen), None)
        if step is None:  # dead end inside the component: back up
            trail.pop()
            if not trail:
                return [*component, start]
            continue
        seen.add(step)
        trail.append(step)


def test_graph_sees_the_project() -> None:
    graph = import_graph()
    assert "docket_core.worker" in graph
    assert "docket_core.instrumentation" in graph["docket_core.worker"]
    assert "docket_memory.store" in graph
    assert "docket_core.adapter" in graph["docket_memory.store"]


def test_cycle_finder() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert cycles(graph) == [["a", "b", "c"], ["e"]]
    assert _path_within(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]


def test_no_import_cycles() -> None:
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(
        " -> ".join(_path_within(graph, component)) for component in found
    )
