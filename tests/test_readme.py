"""Every Python code block of the README (and of docs/*.md) runs on its own, as shown, in
a fresh interpreter, and those that say what they print print it."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


@dataclass(frozen=True)
class Block:
    """One fenced ``python`` block: where it is, the heading it sits under, its code."""

    path: Path
    line: int
    heading: str
    code: str

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def python_blocks(path: Path) -> list[Block]:
    """Every ```python block of ``path``, in order (headings inside blocks do not count)."""
    blocks: list[Block] = []
    heading, start = "", 0
    fence: str | None = None  # the language of the block we are in, if any
    code: list[str] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if fence is None:
            if line.startswith("```"):
                fence, start, code = line[3:].strip(), number, []
            elif re.match(r"#+ ", line):
                heading = line
        elif line.startswith("```"):
            if fence == "python":
                blocks.append(Block(path, start, heading, "\n".join(code) + "\n"))
            fence = None
        else:
            code.append(line)
    return blocks


def _all_blocks() -> list[Block]:
    paths = [README, *sorted((ROOT / "docs").glob("*.md"))]
    return [b for p in paths for b in python_blocks(p)]


BLOCKS = _all_blocks()


def run(code: str, limit: float = 120) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter, from a directory that is not the checkout (so only
    the installed package can be imported)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=limit, check=False, cwd=ROOT / "docs")


def _short_example(out: str) -> None:
    assert out.strip().splitlines()[-1] == "[3.0, 0.0, 1.0, 2.0]"


def _groups(out: str) -> None:
    assert out.strip().splitlines()[-1] == "(28.0, 3, 3)"


def _cluster(out: str) -> None:
    lines = out.strip().splitlines()
    assert lines[0].split()[:4] == ["rank", "sent", "received", "msgs"]
    assert lines[2].split()[:4] == ["0", "67.11", "MB", "0"]  # rank 0 sent 64 MiB
    times = [float(t) for t in lines[-1].strip("[]").split(",")]
    assert len(times) == 16 and times[0] > times[1] > 0  # senders also computed


def _mpi_idiom(out: str) -> None:
    assert out.strip() == "[1.0, 0.0]"  # started with python: two ranks in-process


#: What blocks print, by the heading they sit under (the others must only run).
PRINTS: dict[str, Callable[[str], None]] = {
    "## A short example": _short_example,
    "## Groups, collectives and objects": _groups,
    "## What would it cost on real hardware? (the cluster model)": _cluster,
    "## Across processes and hosts (MPI)": _mpi_idiom,
}

#: The one block that fails, on purpose: the hang the debugging section shows.
DEADLOCK = "## Debugging: traces, the flight recorder and hangs"


def test_the_blocks_are_found() -> None:
    headings = {b.heading for b in BLOCKS}
    assert set(PRINTS) | {DEADLOCK} <= headings


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.name)
def test_every_python_block_runs_on_its_own(block: Block) -> None:
    proc = run(block.code)
    if block.heading == DEADLOCK and "ac.run(main, world_size=2)" in block.code:
        assert proc.returncode != 0
        assert "DeadlockError: deadlock: every rank is blocked" in proc.stderr
        assert ("wait-for cycle: rank 0 waits for 1 on tag 0 (recv), rank 1 waits for 0 on "
                "tag 0 (recv)") in proc.stderr
        return
    assert proc.returncode == 0, f"{block.name}:\n{proc.stderr[-3000:]}"
    check = PRINTS.get(block.heading)
    if check is not None:
        check(proc.stdout)
