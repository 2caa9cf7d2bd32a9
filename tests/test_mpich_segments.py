"""The suite removes the segments MPICH leaves in ``/dev/shm`` after a failed job, and its
launcher's topology files, and only those (``tests/mpich_segments.py``)."""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import mpich_segments
from .mpich_segments import HYDRA_PREFIX, PREFIX, SHM, TMP


@pytest.fixture
def made() -> Iterator[list[Path]]:
    paths: list[Path] = []
    yield paths
    for path in paths:
        path.unlink(missing_ok=True)


def _segment(made: list[Path], what: str, age: float = 60.0) -> Path:
    path = SHM / f"{PREFIX}test_{os.getpid()}_{what}"
    path.write_bytes(b"\0" * mmap.PAGESIZE)
    past = path.stat().st_mtime - age
    os.utime(path, (past, past))
    made.append(path)
    return path


@pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm here")
def test_only_new_segments_no_process_uses_are_removed(made: list[Path]) -> None:
    old = _segment(made, "old")
    before = mpich_segments.segments()
    assert old.name in before
    orphan = _segment(made, "orphan")
    young = _segment(made, "young", age=0.0)
    mapped = _segment(made, "mapped")
    opened = _segment(made, "open")
    with mapped.open("r+b") as f:  # a mapping alone (the file closed) keeps it in use
        mapping = mmap.mmap(f.fileno(), 0)
    fd = os.open(opened, os.O_RDONLY)
    try:
        assert {mapped.name, opened.name} <= mpich_segments.in_use()
        assert orphan.name not in mpich_segments.in_use()
        removed = mpich_segments.remove_orphans(before, min_age=5.0)
        assert [n for n in removed if n.startswith(f"{PREFIX}test_{os.getpid()}_")] \
            == [orphan.name]
        assert not orphan.exists()
        assert old.exists() and young.exists() and mapped.exists() and opened.exists()
    finally:
        mapping.close()
        os.close(fd)
    # once nothing uses them, the new ones old enough go too; what was there stays
    mpich_segments.remove_orphans(before, min_age=5.0)
    assert not mapped.exists() and not opened.exists()
    assert old.exists() and young.exists()


def test_only_new_topology_files_no_process_holds_open_are_removed(made: list[Path]) -> None:
    def topology(what: str, age: float = 60.0) -> Path:
        path = TMP / f"{HYDRA_PREFIX}test_{os.getpid()}_{what}"
        path.write_text("<topology/>")
        past = path.stat().st_mtime - age
        os.utime(path, (past, past))
        made.append(path)
        return path

    old = topology("old")
    before = mpich_segments.segments(TMP, HYDRA_PREFIX)
    assert old.name in before
    orphan, young, opened = topology("orphan"), topology("young", age=0.0), topology("open")
    fd = os.open(opened, os.O_RDONLY)
    try:
        removed = mpich_segments.remove_orphans(before, min_age=5.0, folder=TMP,
                                                prefix=HYDRA_PREFIX)
        assert [n for n in removed if n.startswith(f"{HYDRA_PREFIX}test_{os.getpid()}_")] \
            == [orphan.name]
        assert not orphan.exists()
        assert old.exists() and young.exists() and opened.exists()
    finally:
        os.close(fd)
    mpich_segments.remove_orphans(before, min_age=5.0, folder=TMP, prefix=HYDRA_PREFIX)
    assert not opened.exists() and old.exists() and young.exists()
