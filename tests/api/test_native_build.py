"""The C extension is optional for users and required in CI (``ASYNCCOMM_REQUIRE_NATIVE``):
there a C file that does not compile, or compiles with a warning, fails the build, and
``import asynccomm`` refuses to run without the extension."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tree(tmp: Path) -> Path:
    """A copy of the sources to build (no compiled files)."""
    shutil.copy(ROOT / "setup.py", tmp / "setup.py")
    shutil.copy(ROOT / "pyproject.toml", tmp / "pyproject.toml")
    shutil.copy(ROOT / "README.md", tmp / "README.md")
    shutil.copytree(ROOT / "asynccomm", tmp / "asynccomm",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    return tmp


def _build(tree: Path, *, require: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ASYNCCOMM_REQUIRE_NATIVE",
                                                           "CFLAGS")}
    # Unoptimized (after Python's own -O3): these builds are about the verdict on a broken
    # file, not the code, and compile in a fraction of the time.
    env["CFLAGS"] = "-O0"
    if require:
        env["ASYNCCOMM_REQUIRE_NATIVE"] = "1"
    return subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=300,
                          check=False)


@pytest.mark.parametrize("breakage", [
    "#error this file is deliberately broken\n",
    "static int deliberately_unused(void) { int unused_local; return 0; }\n",
], ids=["error", "warning"])
def test_a_broken_c_file_fails_the_required_build(tmp_path: Path, breakage: str) -> None:
    tree = _tree(tmp_path)
    source = tree / "asynccomm" / "_native" / "_lane_buffers.c"
    source.write_text(source.read_text() + breakage)
    required = _build(tree, require=True)
    assert required.returncode != 0, required.stdout + required.stderr
    assert "_lane_buffers.c" in required.stdout + required.stderr
    optional = _build(tree, require=False)  # a user without a working compiler: goes on
    assert optional.returncode == 0, optional.stdout + optional.stderr


#: Import the copy with no extension built, as a checkout would (without the editable
#: install's finder, which would find this checkout's extension).
IMPORT = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'ditable' not in "
          "str(f)]; import asynccomm._engine.lane as f; print(f.FAST_LANE)")


def test_import_refuses_to_run_without_the_extension_when_it_is_required(
        tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    env = {**os.environ, "ASYNCCOMM_REQUIRE_NATIVE": "1", "PYTHONPATH": str(tree)}
    env.pop("ASYNCCOMM_PURE_PYTHON", None)
    proc = subprocess.run([sys.executable, "-c", IMPORT], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode != 0
    assert "ASYNCCOMM_REQUIRE_NATIVE is set but asynccomm's C extension" in proc.stderr
    env["ASYNCCOMM_PURE_PYTHON"] = "1"  # the pure-Python pass asks for no extension
    proc = subprocess.run([sys.executable, "-c", IMPORT], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "python", proc.stderr
    env.pop("ASYNCCOMM_REQUIRE_NATIVE")  # a user without a compiler: the Python lane
    env.pop("ASYNCCOMM_PURE_PYTHON")
    proc = subprocess.run([sys.executable, "-c", IMPORT], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "python", proc.stderr
