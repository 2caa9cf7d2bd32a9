"""MPICH's shared-memory segments that a failed job leaves in ``/dev/shm``.

MPICH unlinks the segment its ranks on one host share (``mpich_shm_*``, 2 MiB here) at
``MPI_Finalize``; a job that ends by ``MPI_Abort`` or a killed rank, as the failure cases of
the MPI tests do on purpose, leaves it behind (as every MPI does: cleaning up after failed
jobs is left to the batch system).  The suite does that cleaning for the jobs it started:
``tests/conftest.py`` notes the segments there are when the session starts and, when it
ends, removes those made since that no live process maps or holds open.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

SHM = Path("/dev/shm")
PREFIX = "mpich_shm_"


def segments() -> set[str]:
    """The names of MPICH's segments in ``/dev/shm`` now."""
    try:
        return {p.name for p in SHM.iterdir() if p.name.startswith(PREFIX)}
    except OSError:
        return set()


def in_use() -> set[str]:
    """The names of the files in ``/dev/shm`` that a live process maps or holds open (of
    the processes this user may look into; another user's segments are not this user's
    to remove anyway)."""
    names: set[str] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for line in (proc / "maps").read_text().splitlines():
                at = line.find(f"{SHM}/")
                if at >= 0:
                    names.add(line[at + len(str(SHM)) + 1:].split(" ")[0])
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith(f"{SHM}/"):
                    names.add(target[len(str(SHM)) + 1:].split(" ")[0])
        except OSError:  # gone meanwhile, or not ours to look into
            continue
    return names


def remove_orphans(before: set[str], min_age: float = 1.0) -> list[str]:
    """Remove MPICH's segments that were not there ``before``, that no live process uses,
    and that are at least ``min_age`` seconds old (one being made right now is not mapped
    yet); return their names."""
    new = segments() - before
    if not new:
        return []
    used, now, removed = in_use(), time.time(), []
    for name in sorted(new - used):
        path = SHM / name
        try:
            if now - path.stat().st_mtime >= min_age:
                path.unlink()
                removed.append(name)
        except OSError:  # removed meanwhile
            continue
    return removed
