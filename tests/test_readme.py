"""Every Python code block of the README and of the manual (docs/*.md) runs on its own, as
shown, in a fresh interpreter, and those that say what they print print it; every link
between the pages leads somewhere; the README stays short and keeps its two commands."""

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
DOCS = ROOT / "docs"
#: The manual's pages (docs/performance.md is written by ``make bench``).
PAGES = ("semantics", "collectives", "cluster-model", "mpi", "processes", "debugging",
         "examples", "claims", "development", "performance", "faults")
#: The pages that show Python: each must have blocks here, or they would go unchecked.
WITH_CODE = ("README.md", "docs/semantics.md", "docs/collectives.md", "docs/cluster-model.md",
             "docs/mpi.md", "docs/processes.md", "docs/debugging.md", "docs/faults.md")


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


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _all_blocks() -> list[Block]:
    return [b for p in _pages() for b in python_blocks(p)]


BLOCKS = _all_blocks()


def run(code: str, limit: float = 120, *,
        script: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter, from a directory that is not the checkout (so only
    the installed package can be imported); as the script file ``script`` if given (a
    program whose ranks' processes import it)."""
    if script is None:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=limit, check=False, cwd=ROOT / "docs")
    script.write_text(code, encoding="utf-8")
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
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


def _processes(out: str) -> None:
    assert out.strip() == "[2.0, 0.0, 1.0]"


def _faults(out: str) -> None:
    assert out.strip().splitlines() == ["(1, (2,), [0, 1, 3], 4.0)", "RuntimeError"]


def _fault_plans(out: str) -> None:
    assert out.strip().splitlines() == ["((2,), 4.0, '12.1 ms')", "CommClosedError", "True"]


def _running_loop(out: str) -> None:
    assert out.strip().splitlines() == ["[0, 10, 20, 30]", "0 5 [0. 1. 2.]"]


#: What blocks print, by page and the heading they sit under (the others must only run).
PRINTS: dict[tuple[str, str], Callable[[str], None]] = {
    ("README.md", "## A short example"): _short_example,
    ("docs/semantics.md", "## Running a world"): _running_loop,
    ("docs/collectives.md", "# Groups, collectives and objects"): _groups,
    ("docs/cluster-model.md", "# The cluster model: what would it cost on real hardware?"):
        _cluster,
    ("docs/mpi.md", "# Across processes and hosts (MPI)"): _mpi_idiom,
    ("docs/processes.md", "# Processes on one machine, without MPI"): _processes,
    ("docs/faults.md", "# When a rank dies: revoke, agree, shrink"): _faults,
    ("docs/faults.md", "## Fault plans on the modelled cluster"): _fault_plans,
}

#: The pages whose blocks run as script files: their ranks' processes import them.
AS_SCRIPTS = ("docs/processes.md",)

#: The one block that fails, on purpose: the hang the debugging page shows.
DEADLOCK = ("docs/debugging.md", "# Debugging: traces, the flight recorder and hangs")


def _where(block: Block) -> tuple[str, str]:
    return str(block.path.relative_to(ROOT)), block.heading


def test_the_blocks_are_found() -> None:
    found = {_where(b) for b in BLOCKS}
    assert set(PRINTS) | {DEADLOCK} <= found
    assert set(WITH_CODE) <= {where for where, _ in found}


def test_the_manual_is_all_there() -> None:
    assert {f"{name}.md" for name in PAGES} <= {p.name for p in DOCS.glob("*.md")}


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.name)
def test_every_python_block_runs_on_its_own(block: Block, tmp_path: Path) -> None:
    proc = run(block.code, script=tmp_path / "program.py"
               if _where(block)[0] in AS_SCRIPTS else None)
    if _where(block) == DEADLOCK and "ac.run(main, world_size=2)" in block.code:
        assert proc.returncode != 0
        assert "DeadlockError: deadlock: every rank is blocked" in proc.stderr
        assert ("wait-for cycle: rank 0 waits for 1 on tag 0 (recv), rank 1 waits for 0 on "
                "tag 0 (recv)") in proc.stderr
        return
    assert proc.returncode == 0, f"{block.name}:\n{proc.stderr[-3000:]}"
    check = PRINTS.get(_where(block))
    if check is not None:
        check(proc.stdout)


def anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to dashes."""
    text = heading.lstrip("#").strip().lower()
    return "".join(ch for ch in text if ch.isalnum() or ch in " -_").replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of ``path``'s headings (those inside code blocks do not count)."""
    found, fenced = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#+ ", line):
            found.add(anchor(line))
    return found


def links(path: Path) -> list[str]:
    """Every markdown link target of ``path`` outside code blocks and code spans."""
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_leads_somewhere(page: Path) -> None:
    for target in links(page):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        file, _, fragment = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        assert dest.exists(), f"{page.name}: {target}: no such file"
        if fragment:
            assert dest.suffix == ".md", f"{page.name}: {target}: an anchor into a non-page"
            assert fragment in anchors(dest), f"{page.name}: {target}: no such heading"


def test_the_manual_is_linked_from_the_readme() -> None:
    targets = {t.partition("#")[0] for t in links(README)}
    assert {f"docs/{name}.md" for name in PAGES} <= targets


def test_the_readme_is_short_and_keeps_its_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200  # the manual is docs/
    for command in ("make demo", "make test", "pip install"):
        assert command in text, command
