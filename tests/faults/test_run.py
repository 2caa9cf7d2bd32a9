"""``ac.run(..., faults="tolerate")``: a rank that raises has failed and the rest go on."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import asynccomm as ac

from .common import Died


async def program(comm: ac.Communicator) -> Any:
    if comm.rank == 1:
        raise Died("rank 1 is gone")
    try:
        await comm.allreduce(np.ones(2))
    except ac.CommBrokenError as exc:
        assert exc.peer == 1
        comm.revoke()
    except ac.CommRevokedError:
        pass
    new = await comm.shrink()
    buf = np.array([comm.rank + 1.0])
    await new.allreduce(buf)
    return new.size, float(buf[0])


@pytest.mark.parametrize("options", [{"loop": "asyncio"}, {"loop": "uvloop"},
                                     {"clock": "virtual"},
                                     {"cluster": ac.Cluster.preset("roce100g")}])
def test_a_failed_rank_is_a_result_and_the_others_go_on(options: dict[str, Any]) -> None:
    results = ac.run(program, 4, faults="tolerate", timeout=30, **options)
    assert isinstance(results[1], Died) and "(raised on rank 1)" in results[1].__notes__
    assert [results[r] for r in (0, 2, 3)] == [(3, 1.0 + 3 + 4)] * 3


def test_the_default_still_ends_the_run() -> None:
    with pytest.raises(Died, match="rank 1 is gone"):
        ac.run(program, 3, loop="asyncio", timeout=30)


def test_a_bad_faults_value_is_refused_before_any_rank_runs() -> None:
    ran = []

    async def main(comm: ac.Communicator) -> None:
        ran.append(comm.rank)

    with pytest.raises(ValueError, match="faults must be"):
        ac.run(main, 2, faults="ignore")
    with pytest.raises(NotImplementedError, match="not MPI .mpi4py 4.1.2 has no Comm.Revoke"):
        ac.run(main, 2, faults="tolerate", backend="mpi")
    assert ran == []


async def test_run_async_tolerates_too() -> None:
    results = await ac.run_async(program, 3, faults="tolerate", timeout=30)
    assert isinstance(results[1], Died) and results[0] == results[2] == (2, 1.0 + 3)
