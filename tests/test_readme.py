"""The README's examples run as shown and print what it says they print."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_block(after_heading: str) -> str:
    text = README.read_text()
    section = text[text.index(after_heading):]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def run(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    return proc.stdout


def test_the_short_example() -> None:
    out = run(python_block("## A short example"))
    assert out.strip().splitlines()[-1] == "[3.0, 0.0, 1.0, 2.0]"


def test_the_cluster_example() -> None:
    code = "import numpy as np\nimport asynccomm as ac\n" + python_block(
        "## What would it cost on real hardware?")
    lines = run(code).strip().splitlines()
    assert lines[0].split()[:4] == ["rank", "sent", "received", "msgs"]
    assert lines[2].split()[:4] == ["0", "67.11", "MB", "0"]  # rank 0 sent 64 MiB
    times = [float(t) for t in lines[-1].strip("[]").split(",")]
    assert len(times) == 16 and times[0] > times[1] > 0  # senders also computed


def test_the_groups_example() -> None:
    out = run(python_block("## Groups, collectives and objects"))
    assert out.strip().splitlines()[-1] == "(28.0, 3, 3)"


def test_the_deadlock_of_the_debugging_section_is_reported_within_two_seconds() -> None:
    code = python_block("## Debugging: traces, the flight recorder and hangs")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode != 0
    assert "DeadlockError: deadlock: every rank is blocked" in proc.stderr
    assert ("wait-for cycle: rank 0 waits for 1 on tag 0 (recv), rank 1 waits for 0 on "
            "tag 0 (recv)") in proc.stderr
