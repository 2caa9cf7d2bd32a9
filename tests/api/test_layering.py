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
        "from .._engine import engine",
        "from .._buffers import BufferView",
        "from ..transports import base",
        "from ... import something_outside",
        "import asynccomm._engine.stream",
        "if TYPE_CHECKING:",
        "    from .._engine.request import Request",
    ])
    found = core_violations(imports_in(bad_source, "asynccomm._core"))
    for needle in ["asyncio", "numpy", "structlog", "time", "asynccomm._engine.engine",
                   "asynccomm._buffers", "asynccomm.transports", "something_outside",
                   "asynccomm._engine.stream", "asynccomm._engine.request"]:
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
#: communicators, the MPI world and the world of processes that build one per process
#: like the runner, and the testing helpers built on the public API, and the
#: communicator's own parts (its free functions its methods hand off to, which name it for
#: type checking only).
MAY_IMPORT_COMMUNICATOR = {
    "asynccomm", "asynccomm._comm.runner", "asynccomm._comm.mpi_runner", "asynccomm.testing",
    "asynccomm._comm.process_runner",
    "asynccomm._comm.groups", "asynccomm._comm.objects", "asynccomm._comm.collective_api",
    "asynccomm._comm.forming", "asynccomm._comm.batches"}


@pytest.mark.parametrize("path", _py_files(PKG), ids=lambda p: str(p.relative_to(PKG)))
def test_nothing_below_imports_communicator(path: Path) -> None:
    mod = _module_name(path)
    if mod in MAY_IMPORT_COMMUNICATOR:
        return
    bad = [i for i in imports_of(path) if i.module == "asynccomm._comm.communicator"
           or i.module.startswith("asynccomm._comm.communicator.")]
    assert bad == [], f"{mod} imports _communicator at line {bad[0].lineno}"


@pytest.mark.parametrize("path", _py_files(PKG), ids=lambda p: str(p.relative_to(PKG)))
def test_nothing_below_imports_runner(path: Path) -> None:
    mod = _module_name(path)
    if mod in {"asynccomm", "asynccomm._comm.runner", "asynccomm._comm.mpi_runner",
               "asynccomm.testing"}:
        return
    bad = [i for i in imports_of(path) if i.module == "asynccomm._comm.runner"
           or i.module.startswith("asynccomm._comm.runner.")]
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

#: Each package's (or top-level module's) layer, keyed by module-name prefix: a module
#: imports only from its own layer or below, whatever kind of import it is (at the top, in a
#: function, or for type checking only), and a new file needs no entry here.
LAYERS: dict[str, int] = {
    # leaves
    "asynccomm._types": 0, "asynccomm._exceptions": 0, "asynccomm._version": 0,
    # the sans-IO core
    "asynccomm._core": 1,
    # buffers; the C extension (it is handed what it uses, it imports nothing of ours)
    "asynccomm._buffers": 2, "asynccomm._native": 2,
    # op deadlines behind one loop timer (the virtual-time loop knows its timer)
    "asynccomm._deadlines": 2,
    # the cluster model, model time and the virtual-time loop
    "asynccomm.sim": 3,
    # transports: links between engines
    "asynccomm.transports": 4,
    # the engine: requests, streams, flight, tracing, diagnostics, the Python lane
    "asynccomm._engine": 5,
    # collectives, built on the point-to-point API
    "asynccomm._collectives": 6,
    # the communicator, groups, objects, hang diagnosis and the runners
    "asynccomm._comm": 7,
    # the public surface
    "asynccomm": 8, "asynccomm.testing": 8, "asynccomm.trace": 8, "asynccomm.timeline": 8,
}

#: The imports of ours that stand inside a function: ``run`` reaches the MPI runner only
#: under a launcher (the other way round, the MPI runner imports the communicator).
FUNCTION_IMPORTS = {("asynccomm._comm.runner", "asynccomm._comm.mpi_runner")}

#: The module of ours that is not a Python file (the compiled lane), and who may import it:
#: the fast lane, and the shared-memory link's rings (their atomic words).
NATIVE = {"asynccomm._native._lane"}
MAY_IMPORT_NATIVE = {"asynccomm._engine.lane": NATIVE, "asynccomm.transports._shm_ring": NATIVE}


@dataclass(frozen=True)
class Edge:
    """An import of one asynccomm module by another."""

    importer: str
    target: str
    lineno: int
    type_checking: bool
    in_function: bool = False


def layer_of(name: str) -> int:
    """The layer of a module, by the longest prefix in ``LAYERS``.

    Raises:
        KeyError: a name under no prefix.
    """
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in LAYERS:
            return LAYERS[prefix]
    raise KeyError(name)


def _known_modules() -> set[str]:
    return {_module_name(p) for p in _py_files(PKG)} | NATIVE


def _owning_module(name: str, known: set[str]) -> str | None:
    """The module an imported name belongs to (``asynccomm._types.ANY_SOURCE`` ->
    ``asynccomm._types``), if it is one of ours (those that do not exist are
    ``unresolved_in``'s)."""
    if name != "asynccomm" and not name.startswith("asynccomm."):
        return None
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def _guarded_lines(tree: ast.Module) -> tuple[set[int], set[int]]:
    """The lines inside ``if TYPE_CHECKING:`` blocks, and those inside functions."""
    checking: set[int] = set()
    functions: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                checking.update(sub.lineno for sub in ast.walk(child) if hasattr(sub, "lineno"))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for child in node.body:
                functions.update(sub.lineno for sub in ast.walk(child) if hasattr(sub, "lineno"))
    return checking, functions


def edges_in(source: str, module: str, package: str,
             known: set[str] | None = None) -> list[Edge]:
    known = _known_modules() if known is None else known
    checking, functions = _guarded_lines(ast.parse(source))
    out = []
    for imp in imports_in(source, package):
        target = _owning_module(imp.module, known)
        if target is None or target == module or (target == "asynccomm"
                                                  and module != "asynccomm"):
            continue
        out.append(Edge(module, target, imp.lineno, imp.lineno in checking,
                        imp.lineno in functions))
    return list(dict.fromkeys(out))  # ``from X import y`` names X and X.y: one edge


def all_edges() -> list[Edge]:
    known = _known_modules()
    return [e for p in _py_files(PKG)
            for e in edges_in(p.read_text(encoding="utf-8"), _module_name(p), _package_of(p),
                              known)]


def test_every_module_has_a_layer() -> None:
    missing = []
    for name in sorted(_known_modules()):
        try:
            layer_of(name)
        except KeyError:
            missing.append(name)
    assert missing == [], f"give these a layer in LAYERS: {missing}"


def unresolved_in(source: str, package: str, known: set[str]) -> list[str]:
    """The modules of ours that ``source`` imports from but that do not exist (``from X
    import y``: X must be a module; ``import X``: X must be)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                names = [".".join(base + ([node.module] if node.module else []))]
            else:
                names = [node.module or ""]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        out.extend(f"{n} (line {node.lineno})" for n in names
                   if (n == "asynccomm" or n.startswith("asynccomm.")) and n not in known)
    return out


def test_every_import_of_ours_resolves_to_a_module() -> None:
    known = _known_modules()
    unknown = [f"{_module_name(p)} imports {u}" for p in _py_files(PKG)
               for u in unresolved_in(p.read_text(encoding="utf-8"), _package_of(p), known)]
    assert unknown == []


def layer_violations(edges: list[Edge]) -> list[str]:
    """Imports from a higher layer, of any kind."""
    return [f"{e.importer}:{e.lineno} imports {e.target} (layer {layer_of(e.target)} above "
            f"{layer_of(e.importer)})" for e in edges
            if layer_of(e.target) > layer_of(e.importer)]


def cycles(edges: list[Edge]) -> list[set[str]]:
    """The sets of modules that import each other round a cycle (strongly connected
    components of more than one module)."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.importer, set()).add(e.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                top = stack.pop()
                component.add(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(component)

    for start in sorted(graph):
        if start not in index:
            visit(start)
    return found


def test_no_module_imports_from_a_layer_above() -> None:
    assert layer_violations(all_edges()) == []


def test_no_import_cycle_of_any_kind() -> None:
    """Not at run time, not for the type checker, not through a function-level import:
    where two modules need each other, one names the other by a protocol of what it uses
    (``_comm.view.CommView``, ``_engine.request.OpStream``, ...)."""
    assert cycles(all_edges()) == []


def test_only_the_listed_modules_import_the_extension() -> None:
    bad = [f"{e.importer}:{e.lineno}" for e in all_edges()
           if e.target in NATIVE and e.target not in MAY_IMPORT_NATIVE.get(e.importer, ())]
    assert bad == []


def test_no_function_imports_a_module_of_ours_but_the_listed() -> None:
    """Imports of ours belong at the top of a module; the few inside functions are there
    to keep a heavy or optional dependency off ``import asynccomm`` (listed here)."""
    allowed = FUNCTION_IMPORTS
    found = sorted({(e.importer, e.target) for e in all_edges() if e.in_function})
    assert [f for f in found if f not in allowed] == [], "import it at the top of the module"


def test_the_layer_checks_can_fail() -> None:
    known = _known_modules()
    source = "\n".join([
        "from typing import TYPE_CHECKING",
        "from .._engine.engine import DeviceEngine",
        "if TYPE_CHECKING:",
        "    from .._comm.communicator import Communicator",
        "from ..nothing_here import x",
        "def f():",
        "    from .._collectives import functions",
    ])
    edges = edges_in(source, "asynccomm.transports.local", "asynccomm.transports", known)
    assert [v.split(" (")[0] for v in layer_violations(edges)] == [
        "asynccomm.transports.local:2 imports asynccomm._engine.engine",
        "asynccomm.transports.local:4 imports asynccomm._comm.communicator",
        "asynccomm.transports.local:7 imports asynccomm._collectives",
        "asynccomm.transports.local:7 imports asynccomm._collectives.functions"]
    assert unresolved_in(source, "asynccomm.transports", known) == [
        "asynccomm.nothing_here (line 5)"]
    assert [e.in_function for e in edges][-1] is True
    loop = [Edge("asynccomm._engine.engine", "asynccomm._engine.request", 1, False),
            Edge("asynccomm._engine.request", "asynccomm._engine.stream", 1, False),
            Edge("asynccomm._engine.stream", "asynccomm._engine.engine", 1, True)]
    assert cycles(loop) == [{"asynccomm._engine.engine", "asynccomm._engine.request",
                             "asynccomm._engine.stream"}]
    assert cycles([e for e in loop if not e.type_checking]) == []
