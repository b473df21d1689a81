"""The code stays ruff-clean and mypy-strict; part of the one test command."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tool(name: str) -> str:
    exe = Path(sys.executable).parent / name
    found = str(exe) if exe.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed (pip install -e '.[test]')")
    return found


def test_ruff_clean() -> None:
    r = subprocess.run([_tool("ruff"), "check", "syncd", "tests", "bench"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_strict() -> None:
    r = subprocess.run([_tool("mypy")], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


# -- layering -----------------------------------------------------------------------------
# The pipeline reads bottom-up: a module imports only modules of its rank or below. The
# face (syncd/__init__.py) and the command line sit on top; nothing imports the command
# line. Imports under ``if TYPE_CHECKING:`` are not imports at run time.
RANKS: list[tuple[str, ...]] = [
    ("syncd.errors", "syncd.version", "syncd.private", "syncd.redact", "syncd.worker",
     "syncd.progress", "syncd.claude", "syncd.gitinfo", "syncd.host", "syncd.config",
     "syncd.duration", "syncd.untrusted", "syncd.background",
     "syncd.filemarks", "syncd.localdb"),
    ("syncd.store",),
    ("syncd.security.crypto",),
    ("syncd.security",),
    ("syncd.format",),
    ("syncd.repository", "syncd.seen", "syncd.sibling", "syncd.sessionfiles", "syncd.mask",
     "syncd.backup.state", "syncd.backup.errorlog"),
    ("syncd.view", "syncd.timeline"),
    ("syncd.backup", "syncd.archive", "syncd.restore", "syncd.follow", "syncd.search",
     "syncd.secrets", "syncd.render"),
    ("syncd.service", "syncd.web"),
    ("syncd.cli", "syncd", "syncd.__main__"),
]


def _modules() -> dict[str, Path]:
    out = {}
    for p in (ROOT / "syncd").rglob("*.py"):
        parts = p.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _runtime_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and \
                node.test.id == "TYPE_CHECKING":
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        else:
            yield from _runtime_imports(node)


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        deps = set()
        for node in _runtime_imports(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{name}: relative import"
                base = node.module or ""
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                           for a in node.names]
            else:
                targets = [a.name for a in node.names]
            deps |= {t for t in targets if t in mods and t != name}
        graph[name] = deps
    return graph


# Entries that name one module, not a package with modules under it.
_ONE_MODULE = {"syncd", "syncd.__main__"}


def _rank(module: str) -> int:
    best = (-1, -1)
    for rank, prefixes in enumerate(RANKS):
        for p in prefixes:
            under = p not in _ONE_MODULE and module.startswith(p + ".")
            if (module == p or under) and len(p) > best[0]:
                best = (len(p), rank)
    assert best[1] >= 0, f"{module} has no rank in RANKS"
    return best[1]


def test_every_module_has_a_rank() -> None:
    for module in _modules():
        _rank(module)


def test_each_module_imports_only_its_rank_or_below() -> None:
    upward = [f"{m} (rank {_rank(m)}) imports {d} (rank {_rank(d)})"
              for m, deps in _graph().items() for d in deps if _rank(d) > _rank(m)]
    assert upward == []


def test_store_and_format_import_nothing_above_them() -> None:
    graph = _graph()
    allowed = {"syncd.store": ("syncd.store", "syncd.errors", "syncd.private"),
               "syncd.format": ("syncd.format", "syncd.errors", "syncd.worker",
                                "syncd.store.layout", "syncd.security.crypto",
                                "syncd.untrusted")}
    for pkg, ok in allowed.items():
        for m, deps in graph.items():
            if m == pkg or m.startswith(pkg + "."):
                bad = [d for d in deps if not any(d == o or d.startswith(o + ".") for o in ok)]
                assert bad == [], f"{m} imports {bad}"


def test_nothing_imports_the_command_line() -> None:
    users = [m for m, deps in _graph().items() if not m.startswith(("syncd.cli", "syncd.__main__"))
             for d in deps if d.startswith("syncd.cli")]
    assert users == []


def test_no_import_cycles() -> None:
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the path, 2: done
    cycles: list[list[str]] = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cycles.append([*path[path.index(d):], d])
            elif d not in state:
                visit(d, [*path, d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert cycles == []


# The restore path's rooms, bottom-up: within ``syncd.restore`` a module imports only
# modules of its row or below. Outside it, the rooms of one restore (options to place)
# are reached only through ``restorer``, the door.
RESTORE_ROWS: list[tuple[str, ...]] = [
    ("remap", "merge", "install", "sessionref", "listing"),
    ("relocation", "userconfig"),
    ("origin",),
    ("options", "report"),
    ("mapping", "fetch"),
    ("plan", "rewrite", "conflicts"),
    ("place",),
    ("restorer",),
]
_ROOMS = ("options", "report", "mapping", "fetch", "plan", "rewrite", "conflicts", "place")
ROOM_MAX_LINES = 600


def _restore_row(module: str) -> int:
    name = module.removeprefix("syncd.restore.")
    rows = [i for i, row in enumerate(RESTORE_ROWS) if name in row]
    assert rows, f"{module} has no row in RESTORE_ROWS"
    return rows[0]


def test_restore_modules_import_only_their_row_or_below() -> None:
    graph = _graph()
    mods = [m for m in graph if m.startswith("syncd.restore.")]
    upward = [f"{m} (row {_restore_row(m)}) imports {d} (row {_restore_row(d)})"
              for m in mods for d in graph[m]
              if d.startswith("syncd.restore.") and _restore_row(d) > _restore_row(m)]
    assert upward == []


def test_the_rooms_of_a_restore_are_reached_only_through_the_restorer() -> None:
    rooms = {f"syncd.restore.{r}" for r in _ROOMS}
    users = [f"{m} imports {d}" for m, deps in _graph().items()
             if not m.startswith("syncd.restore.") for d in deps if d in rooms]
    assert users == []


def test_no_restore_module_is_over_its_size() -> None:
    big = {p.name: n for p in (ROOT / "syncd" / "restore").glob("*.py")
           if (n := len(p.read_text().splitlines())) > ROOM_MAX_LINES}
    assert big == {}
