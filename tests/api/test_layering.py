"""Dependency direction, checked on the source with ``ast``."""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import asynccomm

PKG = Path(asynccomm.__file__).parent
CORE = PKG / "_core"

#: Third-party or I/O modules ``_core`` must never import: it is sans-IO and never reads a
#: clock (time is passed in as ``now=``).
CORE_FORBIDDEN = {"asyncio", "numpy", "structlog", "mpi4py", "uvloop", "time", "threading",
                  "concurrent", "selectors", "socket"}


@dataclass(frozen=True)
class Import:
    """One imported module, resolved to an absolute name."""

    module: str
    lineno: int
    relative_level: int


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _package_of(path: Path) -> str:
    name = _module_name(path)
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def imports_of(path: Path) -> list[Import]:
    """Every module ``path`` imports (``from X import y`` counts X and X.y, since y may be
    a submodule), wherever the import statement is (TYPE_CHECKING blocks included)."""
    return imports_in(path.read_text(encoding="utf-8"), _package_of(path))


def imports_in(source: str, package: str) -> list[Import]:
    """``imports_of`` for source text, as if it lived in ``package``."""
    tree = ast.parse(source)
    out: list[Import] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend(Import(alias.name, node.lineno, 0) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                up = node.level - 1
                base = (".".join(base_parts[: len(base_parts) - up]) if up < len(base_parts)
                        else "<outside-asynccomm>")
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            out.append(Import(target, node.lineno, node.level))
            out.extend(Import(f"{target}.{alias.name}", node.lineno, node.level)
                       for alias in node.names if alias.name != "*")
    return out


def _py_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def _top(name: str) -> str:
    return name.partition(".")[0]


def _is_stdlib(name: str) -> bool:
    top = _top(name)
    return top in sys.stdlib_module_names or top == "__future__"


CORE_FILES = _py_files(CORE)


def test_there_are_core_files() -> None:
    assert {p.name for p in CORE_FILES} >= {"__init__.py", "matching.py", "descriptors.py",
                                            "chunking.py"}


def core_violations(imports: list[Import]) -> list[str]:
    """What a ``_core`` module must not import: asyncio, numpy, structlog, mpi4py, uvloop,
    clocks and I/O, anything third-party, and any asynccomm module above ``_core`` except
    the two leaves ``_types`` and ``_exceptions``."""
    allowed_above = ("asynccomm._types", "asynccomm._exceptions")
    bad = []
    for imp in imports:
        name = imp.module
        if name == "asynccomm":
            continue  # ``from .. import x``: x has its own entry
        if _top(name) == "asynccomm":
            inside_core = name == "asynccomm._core" or name.startswith("asynccomm._core.")
            # ``from .._types import ANY_SOURCE`` also yields "asynccomm._types.ANY_SOURCE"
            leaf = any(name == a or name.startswith(a + ".") for a in allowed_above)
            if not inside_core and not leaf:
                bad.append(f"line {imp.lineno}: imports {name} (above _core)")
        elif _top(name) in CORE_FORBIDDEN:
            bad.append(f"line {imp.lineno}: imports {name}")
        elif not _is_stdlib(name):
            bad.append(f"line {imp.lineno}: imports third-party {name}")
    return bad


@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: p.name)
def test_core_is_sans_io(path: Path) -> None:
    bad = core_violations(imports_of(path))
    assert bad == [], f"{path.relative_to(PKG.parent)}:\n" + "\n".join(bad)


def test_core_check_catches_violations() -> None:
    """The checker itself can fail."""
    bad_source = "\n".join([
        "import asyncio",
        "import numpy as np",
        "from structlog import get_logger",
        "import time",
        "from .. import _engine",
        "from .._buffers import BufferView",
        "from ..transports import base",
        "from ... import something_outside",
        "import asynccomm._stream",
        "if TYPE_CHECKING:",
        "    from .._request import Request",
    ])
    found = core_violations(imports_in(bad_source, "asynccomm._core"))
    for needle in ["asyncio", "numpy", "structlog", "time", "asynccomm._engine",
                   "asynccomm._buffers", "asynccomm.transports", "something_outside",
                   "asynccomm._stream", "asynccomm._request"]:
        assert any(needle in line for line in found), (needle, found)
    good_source = "\n".join([
        "from __future__ import annotations",
        "from collections import deque",
        "from .._types import ANY_SOURCE",
        "from .. import _exceptions",
        "from .descriptors import Envelope",
        "from . import chunking",
        "import asynccomm._core.matching",
    ])
    assert core_violations(imports_in(good_source, "asynccomm._core")) == []


@pytest.mark.parametrize("name", ["_exceptions.py", "_types.py"])
def test_leaves_import_only_stdlib(name: str) -> None:
    path = PKG / name
    bad = [f"line {i.lineno}: {i.module}" for i in imports_of(path)
           if i.relative_level or not _is_stdlib(i.module)]
    assert bad == [], f"{name} must import only the standard library:\n" + "\n".join(bad)


def test_import_does_not_load_mpi4py() -> None:
    """mpi4py (and MPI with it) is loaded when the first MPI world opens, not on import,
    not even of the MPI transport's module."""
    code = ("import sys, asynccomm, asynccomm.transports.base, asynccomm.transports.local, "
            "asynccomm.transports.mpi; assert 'mpi4py' not in sys.modules, 'mpi4py was imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr


#: The MPI transport's modules (``transports/mpi.py`` and ``transports/_mpi_*.py``): the
#: only ones that may import mpi4py.
MPI_MODULES = {PKG / "transports" / "mpi.py", *(PKG / "transports").glob("_mpi_*.py")}


def test_mpi4py_is_imported_only_by_the_mpi_transport() -> None:
    bad = [f"{p.relative_to(PKG.parent)}:{i.lineno}" for p in _py_files(PKG)
           for i in imports_of(p)
           if _top(i.module) == "mpi4py" and p not in MPI_MODULES]
    assert bad == []


#: Modules that may import _communicator: the re-exports, the runner that builds
#: communicators, the MPI world that builds one per process like the runner, and the
#: testing helpers built on the public API, and the communicator's own parts (its
#: mixins, which name it for type checking only).
MAY_IMPORT_COMMUNICATOR = {"asynccomm", "asynccomm._runner", "asynccomm._mpi_runner",
                           "asynccomm.testing", "asynccomm._groups", "asynccomm._objects",
                           "asynccomm._collective_api", "asynccomm._forming"}


@pytest.mark.parametrize("path", _py_files(PKG), ids=lambda p: str(p.relative_to(PKG)))
def test_nothing_below_imports_communicator(path: Path) -> None:
    mod = _module_name(path)
    if mod in MAY_IMPORT_COMMUNICATOR:
        return
    bad = [i for i in imports_of(path) if i.module == "asynccomm._communicator"
           or i.module.startswith("asynccomm._communicator.")]
    assert bad == [], f"{mod} imports _communicator at line {bad[0].lineno}"


@pytest.mark.parametrize("path", _py_files(PKG), ids=lambda p: str(p.relative_to(PKG)))
def test_nothing_below_imports_runner(path: Path) -> None:
    mod = _module_name(path)
    if mod in {"asynccomm", "asynccomm._runner", "asynccomm._mpi_runner", "asynccomm.testing"}:
        return
    bad = [i for i in imports_of(path) if i.module == "asynccomm._runner"
           or i.module.startswith("asynccomm._runner.")]
    assert bad == [], f"{mod} imports _runner at line {bad[0].lineno}"


def _calls(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                out.append((f"{func.value.id}.{func.attr}", node.lineno))
            elif isinstance(func, ast.Name):
                out.append((func.id, node.lineno))
    return out


def test_no_event_loop_policies_or_uvloop_install() -> None:
    """uvloop only through ``asyncio.Runner(loop_factory=...)``."""
    forbidden = {"uvloop.install", "asyncio.set_event_loop_policy",
                 "asyncio.get_event_loop_policy", "asyncio.set_event_loop",
                 "asyncio.get_event_loop", "structlog.configure", "logging.basicConfig"}
    bad = [f"{p.relative_to(PKG.parent)}:{line}: {name}" for p in _py_files(PKG)
           for name, line in _calls(p) if name in forbidden]
    assert bad == []


def test_no_print_in_the_library() -> None:
    bad = [f"{p.relative_to(PKG.parent)}:{line}" for p in _py_files(PKG)
           for name, line in _calls(p) if name == "print"]
    assert bad == []


# -- the layer table ---------------------------------------------------------------------------

#: Every module's layer: a module imports only from its own layer or below, and the imports
#: form no cycle.  A new module must be placed here (the test below says so).
LAYERS: dict[str, int] = {
    # leaves
    "asynccomm._types": 0, "asynccomm._exceptions": 0, "asynccomm._version": 0,
    # the sans-IO core
    "asynccomm._core": 1, "asynccomm._core.descriptors": 1, "asynccomm._core.states": 1,
    "asynccomm._core.matching": 1, "asynccomm._core.chunking": 1, "asynccomm._core.wire": 1,
    # buffers, logging, model time
    "asynccomm._buffers": 2, "asynccomm._logging": 2, "asynccomm._clock": 2,
    "asynccomm._fastlane": 2, "asynccomm._speedups": 2,
    # the cluster model and the virtual-time loop (nothing above them)
    "asynccomm.sim": 3, "asynccomm.sim.cluster": 3, "asynccomm.sim.model": 3,
    "asynccomm.sim.records": 3, "asynccomm.sim.device": 3, "asynccomm.sim.loop": 3,
    "asynccomm.sim.timing": 3,
    # world options
    "asynccomm._options": 4,
    # transports: links between engines
    "asynccomm.transports": 5, "asynccomm.transports.base": 5,
    "asynccomm.transports.local": 5, "asynccomm.transports._mpi_lib": 5,
    "asynccomm.transports._mpi_progress": 5, "asynccomm.transports._mpi_transport": 5,
    "asynccomm.transports._mpi_chunks": 5,
    "asynccomm.transports._ticker": 5, "asynccomm.transports._doorbell": 5,
    "asynccomm.transports.mpi": 5,
    # requests and streams: handles the engine owns
    "asynccomm._request": 6, "asynccomm._stream": 6,
    # the flight recorder and trace collection: what handles record; what ranks wait for
    "asynccomm._flight": 6, "asynccomm._trace": 6, "asynccomm._waits": 6,
    # the engine
    "asynccomm._diagnostics": 7, "asynccomm._engine": 7, "asynccomm._summary": 7,
    "asynccomm._engine_fast": 7, "asynccomm._engine_traced": 7, "asynccomm._engine_peers": 7,
    # the public API
    "asynccomm._communicator": 8, "asynccomm._groups": 8, "asynccomm._objects": 8,
    "asynccomm._collective_api": 8, "asynccomm._hang": 8, "asynccomm._batches": 8,
    "asynccomm._calls": 8, "asynccomm._forming": 8,
    "asynccomm._runner": 9, "asynccomm._mpi_runner": 9,
    # collectives: built on the communicator's public point-to-point API
    "asynccomm._reduce_ops": 7, "asynccomm._collective_costs": 7,
    "asynccomm._collective_algorithms": 7, "asynccomm._collectives": 7,
    "asynccomm": 10, "asynccomm.testing": 10, "asynccomm.trace": 10,
    "asynccomm.timeline": 10,
}


@dataclass(frozen=True)
class Edge:
    """An import of one asynccomm module by another."""

    importer: str
    target: str
    lineno: int
    type_checking: bool


def _owning_module(name: str) -> str | None:
    """The module an imported name belongs to (``asynccomm._types.ANY_SOURCE`` ->
    ``asynccomm._types``), if it is one of ours."""
    while name:
        if name in LAYERS:
            return name
        name = name.rpartition(".")[0]
    return None


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                for sub in ast.walk(child):
                    if hasattr(sub, "lineno"):
                        lines.add(sub.lineno)
    return lines


def edges_in(source: str, module: str, package: str) -> list[Edge]:
    guarded = _type_checking_lines(ast.parse(source))
    out = []
    for imp in imports_in(source, package):
        target = _owning_module(imp.module)
        if target is not None and target != module and (target != "asynccomm" or
                                                          module == "asynccomm"):
            out.append(Edge(module, target, imp.lineno, imp.lineno in guarded))
    return list(dict.fromkeys(out))  # ``from X import y`` names X and X.y: one edge


def all_edges() -> list[Edge]:
    return [e for p in _py_files(PKG)
            for e in edges_in(p.read_text(encoding="utf-8"), _module_name(p), _package_of(p))]


def test_every_module_has_a_layer() -> None:
    missing = sorted({_module_name(p) for p in _py_files(PKG)} - set(LAYERS))
    assert missing == [], f"place these modules in LAYERS: {missing}"


def layer_violations(edges: list[Edge]) -> list[str]:
    """Imports from a higher layer (a ``TYPE_CHECKING`` import may look up: annotations
    only)."""
    return [f"{e.importer}:{e.lineno} imports {e.target} (layer {LAYERS[e.target]} above "
            f"{LAYERS[e.importer]})" for e in edges
            if LAYERS[e.target] > LAYERS[e.importer] and not e.type_checking]


def cycles(edges: list[Edge]) -> list[list[str]]:
    """Cycles among the runtime imports (``TYPE_CHECKING`` ones do not run)."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        if not e.type_checking:
            graph.setdefault(e.importer, set()).add(e.target)
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    return found


def test_no_module_imports_from_a_layer_above() -> None:
    assert layer_violations(all_edges()) == []


def test_the_imports_have_no_cycle() -> None:
    assert cycles(all_edges()) == []


def test_the_layer_checks_can_fail() -> None:
    source = "\n".join([
        "from typing import TYPE_CHECKING",
        "from .._engine import DeviceEngine",
        "if TYPE_CHECKING:",
        "    from .._communicator import Communicator",
    ])
    edges = edges_in(source, "asynccomm.transports.local", "asynccomm.transports")
    assert [v.split(" (")[0] for v in layer_violations(edges)] == [
        "asynccomm.transports.local:2 imports asynccomm._engine"]
    loop = [Edge("asynccomm._engine", "asynccomm._request", 1, False),
            Edge("asynccomm._request", "asynccomm._stream", 1, False),
            Edge("asynccomm._stream", "asynccomm._engine", 1, False),
            Edge("asynccomm._stream", "asynccomm._communicator", 1, True)]
    assert cycles(loop) == [["asynccomm._engine", "asynccomm._request", "asynccomm._stream",
                             "asynccomm._engine"]]
