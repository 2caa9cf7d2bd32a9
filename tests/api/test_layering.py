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
#: testing helpers built on the public API.
MAY_IMPORT_COMMUNICATOR = {"asynccomm", "asynccomm._runner", "asynccomm._mpi_runner",
                           "asynccomm.testing"}


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
