"""asynccomm's benchmark suite: ``python -m benchmarks`` (``make bench``).

Every measurement runs beside its baseline in the same run and on the same event loop, and
is checked against the performance targets:

- ``latency``: one-way small-message latency (half a ping-pong) beside a bare
  ``asyncio.Future`` hand-off between two tasks;
- ``rate``: one-way small-message rate beside an ``asyncio.Queue`` between two tasks;
- ``bandwidth``: large-message bandwidth with the recv pre-posted beside ``np.copyto``, and
  the extra memory a large transfer needs;
- ``responsiveness``: the longest a task on the loop waits while a large transfer runs.

Results are printed as tables and written as JSON (``benchmarks/results/p2p.json``), the
tables included; so do ``benchmarks.cluster``, ``benchmarks.collectives`` and, under
``mpiexec``, ``benchmarks.mpi_p2p`` and ``benchmarks.mpi_ring``.  ``python -m
benchmarks.report`` assembles ``docs/performance.md`` from that JSON (``make bench`` runs
every benchmark, then it).
"""
