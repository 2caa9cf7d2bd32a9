"""What a failed MPICH job leaves behind: its shared-memory segment in ``/dev/shm``, and
its launcher's topology file in the temporary folder.

MPICH unlinks the segment its ranks on one host share (``mpich_shm_*``, 2 MiB here) at
``MPI_Finalize``; a job that ends by ``MPI_Abort`` or a killed rank, as the failure cases of
the MPI tests do on purpose, leaves it behind (as every MPI does: cleaning up after failed
jobs is left to the batch system).  Its launcher (hydra's ``mpiexec``) writes the host's
topology to a ``hydra_hwloc_xmlfile_*`` file in the temporary folder for its proxies, and
such a job leaves that behind too (a few for each run of the suite, hundreds over weeks).
The suite does that cleaning for the jobs it started: ``tests/conftest.py`` notes the files
of each kind (``KINDS``) there are when the session starts and, when it ends, removes those
made since that no live process maps or holds open.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

SHM = Path("/dev/shm")
PREFIX = "mpich_shm_"
#: The launcher's topology files (hydra writes them where ``TMPDIR`` says, as Python does).
TMP = Path(tempfile.gettempdir())
HYDRA_PREFIX = "hydra_hwloc_xmlfile_"
#: (folder, name prefix) of each kind of file a failed job leaves.
KINDS = ((SHM, PREFIX), (TMP, HYDRA_PREFIX))


def segments(folder: Path = SHM, prefix: str = PREFIX) -> set[str]:
    """The names of the files of one kind (MPICH's segments by default) there are now."""
    try:
        return {p.name for p in folder.iterdir() if p.name.startswith(prefix)}
    except OSError:
        return set()


def in_use(folder: Path = SHM) -> set[str]:
    """The names of the files in ``folder`` that a live process maps or holds open (of
    the processes this user may look into; another user's files are not this user's
    to remove anyway)."""
    root = f"{folder}/"
    names: set[str] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for line in (proc / "maps").read_text().splitlines():
                at = line.find(root)
                if at >= 0:
                    names.add(line[at + len(root):].split(" ")[0])
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith(root):
                    names.add(target[len(root):].split(" ")[0])
        except OSError:  # gone meanwhile, or not ours to look into
            continue
    return names


def remove_orphans(before: set[str], min_age: float = 1.0, folder: Path = SHM,
                   prefix: str = PREFIX) -> list[str]:
    """Remove the files of one kind (MPICH's segments by default) that were not there
    ``before``, that no live process uses, and that are at least ``min_age`` seconds old
    (one being made right now is not in use yet); return their names."""
    new = segments(folder, prefix) - before
    if not new:
        return []
    used, now, removed = in_use(folder), time.time(), []
    for name in sorted(new - used):
        path = folder / name
        try:
            if now - path.stat().st_mtime >= min_age:
                path.unlink()
                removed.append(name)
        except OSError:  # removed meanwhile
            continue
    return removed
