"""The CPU a rank's own work runs on: what a collective costs beyond its messages.

How it works
------------
A link's calibrated segments time the messages (a ping-pong holds the per-message work of
both sides), but a collective call does more on each rank: argument checks and setting up
the call, Python per step of its algorithm, copies (the scratch arrays a call works on and
the output written at its end, ``_collectives.functions`` Rule 6) and the reductions.
``HostSpec`` holds those rates and ``collective_seconds`` turns a call into CPU seconds;
the cluster world charges them on the rank's core within the call's timeout: a step's
after each wait, the rest once the call's arguments are checked and its algorithm chosen,
before its first message (Rule 2d).

Rule 1 (the call).  A call of ``nbytes`` (nccl-tests' convention: the whole buffer) on
``p`` ranks costs ``call + steps * step + copied / copy_bandwidth + reduced /
reduce_bandwidth + fresh * touch`` seconds, where ``steps``, ``copied`` and ``reduced`` bytes
are those of the algorithm the call runs (``WORK``, keyed ``"allreduce.ring"``; a bare
collective name is its bandwidth algorithm's, a tree's for bcast, reduce, gather, scatter),
and ``fresh`` the bytes of the scratch arrays it allocates; one rank costs ``call`` only.
Rule 1b (caches).  ``cached`` holds pieces ``(up_to, copy_bandwidth, reduce_bandwidth)``
by size: a small call's arrays stay in the caches, a large one's go to memory.  A call
copies and reduces the bytes a call of the first piece's ``up_to`` would at that piece's
rates, the bytes a call of the next piece's has beyond those at the next piece's, and so
on, the bytes past the last piece at ``copy_bandwidth`` and ``reduce_bandwidth``
(``asynccomm.calibrate.fit_host`` fits each piece's rates on the bytes beyond the piece
before's): a call's time never falls as its size grows.  Every byte of a call past the
last piece at the large calls' rates (scaled to a working set far smaller than theirs,
Rule 1d) put calls of 384 and 512 KiB on two ranks 9-17% under their measurements,
below the 256 KiB calls' time.
Rule 1c (first touch).  A call's scratch comes from its rank's pool
(``_collectives.scratch``): warm when a call of its size succeeded on the rank before (and
the pool kept it under its cap), fresh pages otherwise, which a warm ping-pong never sees.
``touch`` is the seconds per byte of those page faults, on average over the call's scratch
bytes (``fresh``): the calibration weighs a first touch by the faults its calls count, so
for calls back to back, whose scratch the pool hands back warm, it comes out near zero.
Rule 1d (working set).  A link's segments time a ping-pong, whose working set is one
message and its copy (2 m bytes): a call's messages move among every rank's arrays and
scratch (the ranks of a node share its last cache), which can be far beyond the caches.
``memory`` holds the copy rate measured at a few working sets (``(bytes, bytes/s)``, read
between them on log2 of the bytes); each byte a rank receives into the call's large
arrays (not a ring reduce-scatter's, which land in one block the caches keep) in a call
whose working set is W (``footprint``) costs 1 / memory(W) - 1 / memory(2 m) more on
its core, m its messages' size (none where the call's working set is no larger).  The
call's own copies and reductions past the ``cached`` pieces (Rule 1b) take their rates
times memory(W) / memory(``working_set``), the working set of the calls those rates were
fitted on (0: the rates hold at every working set).
Rule 1e (a source no step wrote).  A ping-pong sends what it has just received, and a ring
forwards the block it has just copied in: their sources are in the caches.  A message that
leaves from the caller's array (the ring allgather's first, every pairwise alltoall
message, those a linear gather's root receives: ``Footprint.cold``) is read from memory in
a call past the caches, which costs its receiver more where the ranks share one core and
its caches (``cores`` = 1: in-process ranks): ``COLD_SOURCE`` (a half) of what Rule 1d
charges a byte received more.  In-process, a 2 MiB message from a block of a 64 MiB array
took 193-195 us, from one just written 126 (and 292 into a block of such an array, 226-234
from one just written): half the 138 us more that Rule 1d gives a byte received in a call
of that working set.  Ranks on cores of their own read every message from the other core's
caches, as their ping-pong does, and pay nothing more.  Against the measurements of four
runs replayed (their in-process rates as fitted then), the in-process cells met rose from
32 to 36 of 36, the mean error from 5.6 to 4.8%, the 4 MiB alltoall's from 10-22% under to
-8% to +9%.  In eight runs alternating the two models, each calibrated afresh (the fit now
takes the allgather's first message out too), 35 and 32 of 36 met, the mean error 5.8 and
6.0%; the 4 MiB alltoall +8.6% and +10.5% on average: the machine moves these calls by as
much from one run to the next.
Rule 2 (cores).  The ranks share ``cores`` cores (0: a core per rank): rank ``r`` runs on
core ``r % cores``, and its CPU work queues on that core first come, first served, so two
ranks on one core take twice as long for their work as one.  On more ranks than cores
a step of a call that waited for a rank of its own core costs ``switch`` more on that
core (Rule 2e): processes that wait for a message (polling, or spinning a while before
they sleep) hold a core another rank needs until the system's scheduler moves them, and
a rank that slept costs a wake-up (0 where ranks share one event loop, which switches
between them itself).  Calibrated on
processes and MPI from barrier calls on one process more than the cores, whose ranks all
wait at once as a collective's do at each step (``asynccomm.calibrate.measure_switch``).
A step whose message is past ``EAGER_LIMIT`` (rendezvous) costs ``rendezvous_switch`` more
again there: its receiver is woken for the announcement and its sender again for the
completion, two hand-offs where an eager message has one.  Calibrated from ring allgather
calls on as many processes, of messages just past the limit against messages at it
(``asynccomm.calibrate.measure_rendezvous_switch``); without it 256 KiB calls on 3
processes (85 KiB messages) measured 30-55% above the model.
Their messages share the cores too: a transfer into a rank is held on its core
(``sim/model.py`` Rule 4b).  Where that one core also moves every message of the node in
turn (``Cluster(shared_intra=True)`` with a ``"fifo"`` link:
in-process ranks, whose one CPU copies each message), the work and the messages queue on
one resource, so a call's work and the other ranks' messages never overlap.
Rule 2b (the step of a transport).  ``step`` is measured on the transport a preset is
calibrated on: on in-process ranks a step's bookkeeping is among the CPU seconds of the
messages their ping-pong counts, where ranks in processes of their own (shared memory,
MPI) spend it apart from their messages, on two ranks from small allreduce calls (two
steps) less allgather calls (one) less a message (``asynccomm.calibrate.measure_step``).
Rule 2c (one event loop).  A link's segments time a ping-pong, whose every message makes its
receiver wait a turn of the loop and a task switch for it; in a call on more ranks sharing
one event loop a receiver finds many of its messages arrived already (the loop runs every
rank's step in one turn, in an order that depends on the rank count, not monotonically),
so a step of a call of an algorithm on ``p`` ranks costs ``unwaited`` (``(algorithm, ranks,
seconds)``, its entry of the most ranks up to ``p``, none below its first; an algorithm
without entries the mean of the others') less: how many messages are found arrived
differs from one algorithm to another.  A message found arrived was staged on its way
(eager: the engine copies it into a warm buffer of its staging pool and out again into
the recv, a copy more of its bytes, which the saving pays first at the rate of a copy
among the message and its copy, memory(2 m) of Rule 1d, or without ``memory`` at the
call's copy rate; that rate, of copies among the call's scratch and output, put calls
on 4 ranks with 32 to 64 KiB messages 6-16% too dear); a rendezvous one (past
``EAGER_LIMIT``) is found only announced and moves once its sender, waiting for the
match as no ping-pong sender does, is woken: no saving.
A call's work never goes below nothing.  Measured on in-process ranks from small ring
allgather and allreduce calls on a few rank counts, against their model
(``asynccomm.calibrate.measure_unwaited``); ranks in processes of their own have none.
Rule 2d (when a step's work runs).  A call spends its steps' work where the steps run:
one step's (its switches with it) after each wait of its algorithm, up to ``steps`` of
them, and the rest of its work before its first message (``call_work``; the cluster
world's ``sim/timing.py`` Rule 7).  A rank that waits fewer times than ``steps`` (a leaf
of a tree, a rank that recursive doubling folds in) spends fewer: ``collective_seconds``,
the whole, is what the chooser and the calibration's closed forms take.  A step that
costs less than nothing (Rule 2c) leaves it all to the first part, never below nothing.
Spent all before the first message, the steps' work of two ranks of one core ran before
either's messages left, where each step's runs while the other rank waits for its
message.  Replayed against six runs' measurements (the switches solved again), the cells
change little: met 31 and 31 of 54 on processes, 31 and 32 on MPI, the mean error 9.9 to
9.8% and 8.9 to 8.7%; the calls the validation times wait once a step on every rank.
Rule 2e (a hand-off on one core).  A step pays its switches (``switch``, and past the
eager limit ``rendezvous_switch``) only where its wait was for a rank on its own core
(the ranks it received from, or without a receive those it sent to): that rank's
message comes once it has had the core and given it back, where a message from a rank
on another core comes while this core runs its other rank.  Measured on 4 processes on
the 2 cores, each bound to its CPU (``asynccomm.calibrate.placed``) as this rule places
them (0 and 2 on one, 1 and 3 on the other): a 4 KiB ring allgather, whose every
message crosses cores, took 280-300 us a call, and a ring allreduce (6 steps) 490-590;
bound 0 and 1, 2 and 3 instead (half the ring's messages within a core) 420-450 and
760-810; a pairwise alltoall (its second step within a core) 400-440.  Every step
charged a switch solved on 3 ranks (a third of whose barrier's messages stay on a
core), the model priced the allgather and allreduce of 4 KiB 14-30% over in six runs
(processes and MPI); charged only within a core, -9% to +11%.  Their calls of 16 to
128 KiB came within 9% as well (the pairwise alltoall on 4 ranks stays 9-36% under at
every size); calls of 256 KiB there (64 KiB messages) came out 1-39% under,
because a call whose messages are 64 KiB took 100 us more than one whose messages
are 63 KiB (542-545 against 440-448 us, a 4-rank allgather), where a ping-pong shows
no such step: the old charge on every step had hidden that.  It was the transport's:
an eager message of the eager limit's 64 KiB that landed before its recv took the
Python steps (the C lane's landing stopped short of it), and a collective's messages
often land first; it lands in C now, and a 4-rank ring allreduce of 256 KiB on bound
processes took 711 us a call in the next run, against 1074-1201 in the two before.
Rule 3 (off by default).  ``HostSpec()`` costs nothing: presets of published hardware time
messages only; ``python -m asynccomm.calibrate`` measures these rates on this machine.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = ["WORK", "CallWork", "Footprint", "HostSpec", "Work", "call_work",
           "collective_seconds", "footprint", "work_of"]

class Work(NamedTuple):
    """What one rank does in a call beyond its messages (Rule 1)."""

    steps: int  # waits of its algorithm, on the critical path
    copied: float  # bytes copied (scratch in, output out, blocks moved about)
    reduced: float  # bytes reduced
    fresh: float  # bytes of scratch arrays allocated by the call (Rule 1c)


#: The share of Rule 1d's cost more per byte received that a message from the caller's
#: array pays again where the ranks share one core (Rule 1e).
COLD_SOURCE = 0.5

#: Messages past this many bytes go by rendezvous (Rule 2c): ``asynccomm.EAGER_LIMIT``,
#: the default of every transport, written here as this module imports nothing of ours.
EAGER_LIMIT = 65_536

#: The work of an algorithm on n bytes and p > 1 ranks.
WorkOf = Callable[[int, int], Work]


def _log2(p: int) -> int:
    return (p - 1).bit_length()  # ceil(log2 p)


def _folded(p: int) -> tuple[int, bool]:
    """Recursive doubling's rounds on the power of two below ``p``, and whether ranks fold
    (``_collectives.algorithms`` Rule 4: two steps more)."""
    p2 = 1 << (p.bit_length() - 1)
    return p2.bit_length() - 1, p2 != p


def _allreduce_ring(n: int, p: int) -> Work:
    # the input copied into scratch, the output written at the end; p-1 reductions of n/p
    # into a block-sized scratch
    return Work(2 * (p - 1), 2.0 * n, n * (p - 1) / p, n + n / p)


def _allreduce_doubling(n: int, p: int) -> Work:
    rounds, fold = _folded(p)  # every round reduces the whole buffer into a full scratch
    return Work(rounds + 2 * fold, 2.0 * n, float(n) * (rounds + fold), 2.0 * n)


def _ring(n: int, p: int) -> Work:
    # allgather ring / alltoall pairwise: its own block in place, the output at the end
    return Work(p - 1, n / p + n, 0.0, float(n))


def _bruck(n: int, p: int) -> Work:
    # its block into a full scratch, rotated into the call's output, which is copied out
    return Work(_log2(p), 2.0 * n + n / p, 0.0, 2.0 * n)


def _reduce_scatter_ring(n: int, p: int) -> Work:
    return Work(p - 1, n + 2 * n / p, n * (p - 1) / p, n + 2 * n / p)


def _reduce_scatter_halving(n: int, p: int) -> Work:
    rounds, fold = _folded(p)  # halves of what is left: n/2 + n/4 + ... of the p2's share
    p2 = 1 << rounds
    return Work(rounds + 2 * fold, n + 2 * n / p, n * (p2 - 1) / p2 + n * fold,
                2.0 * n + n / p)


def _bcast(n: int, p: int) -> Work:
    return Work(_log2(p), float(n), 0.0, float(n))  # a scratch of the buffer, copied out


def _reduce(n: int, p: int) -> Work:
    # the root's: a scratch accumulator and a recv scratch, a reduction per round
    return Work(_log2(p), 2.0 * n, float(n) * _log2(p), 2.0 * n)


def _gather(steps: Callable[[int], int]) -> WorkOf:
    # the root's: its own block, the whole output written at the end
    return lambda n, p: Work(steps(p), n + n / p, 0.0, float(n))


def _scatter(steps: Callable[[int], int]) -> WorkOf:
    return lambda n, p: Work(steps(p), 2 * n / p, 0.0, n / p)


WORK: dict[str, WorkOf] = {
    "allreduce.ring": _allreduce_ring, "allreduce.recursive_doubling": _allreduce_doubling,
    "allgather.ring": _ring, "allgather.bruck": _bruck, "alltoall.pairwise": _ring,
    "reduce_scatter.ring": _reduce_scatter_ring,
    "reduce_scatter.recursive_doubling": _reduce_scatter_halving,
    "bcast.binomial": _bcast, "reduce.binomial": _reduce,
    "gather.linear": _gather(lambda p: 1), "gather.binomial": _gather(_log2),
    "scatter.linear": _scatter(lambda p: 1), "scatter.binomial": _scatter(_log2),
    "barrier.dissemination": lambda n, p: Work(_log2(p), 0.0, 0.0, 0.0),
}
#: The algorithm a bare collective name stands for.
_BARE = {"allreduce": "ring", "allgather": "ring", "alltoall": "pairwise",
         "reduce_scatter": "ring", "bcast": "binomial", "reduce": "binomial",
         "gather": "binomial", "scatter": "binomial", "barrier": "dissemination"}


def _algorithm(name: str) -> str:
    """``name`` as ``"<collective>.<algorithm>"``: a bare collective name with its
    algorithm in ``_BARE``."""
    return name if "." in name else f"{name}.{_BARE.get(name, '')}"


def _rate(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"HostSpec {field} must be a number, got {type(value).__name__}")
    if not value > 0:
        raise ValueError(f"HostSpec {field} must be > 0 bytes/s, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class HostSpec:
    """The CPU work of a collective call (see module docs); times in seconds, rates in
    bytes/s (``math.inf``: free).

    Raises:
        TypeError: a field of the wrong type.
        ValueError: ``cores`` < 0, a negative or non-finite time, a rate <= 0.
    """

    cores: int = 0  # ranks share this many cores (0: a core per rank)
    call: float = 0.0  # seconds per collective call
    step: float = 0.0  # seconds per step of its algorithm
    copy_bandwidth: float = math.inf  # bytes/s of the call's copies
    reduce_bandwidth: float = math.inf  # bytes/s of its reductions
    #: (up_to, copy_bandwidth, reduce_bandwidth) for calls of at most up_to bytes (Rule 1b)
    cached: tuple[tuple[int, float, float], ...] = ()
    switch: float = 0.0  # seconds more per step on more ranks than cores (Rule 2)
    #: seconds more again per step whose message is past EAGER_LIMIT, on more ranks than
    #: cores (Rule 2)
    rendezvous_switch: float = 0.0
    touch: float = 0.0  # seconds per byte of a call's scratch, its pages' first touch (Rule 1c)
    #: the share of a large transfer's link time its sender's core spends copying it too,
    #: on ranks with cores of their own (``sim/model.py`` Rule 4e), 0 to 1
    shared_copy: float = 0.0
    #: (working set bytes, copy bytes/s), by working set (Rule 1d)
    memory: tuple[tuple[int, float], ...] = ()
    working_set: int = 0  # bytes at which copy_ and reduce_bandwidth were fitted (Rule 1d)
    #: (algorithm, ranks, seconds a step costs less on that many ranks of one event loop),
    #: by algorithm and ranks (Rule 2c)
    unwaited: tuple[tuple[str, int, float], ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.cores, bool) or not isinstance(self.cores, int):
            raise TypeError(f"HostSpec cores must be an int, got {type(self.cores).__name__}")
        if self.cores < 0:
            raise ValueError(f"HostSpec cores must be >= 0, got {self.cores}")
        for field in ("call", "step", "switch", "rendezvous_switch", "touch"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"HostSpec {field} must be a number, got {type(value).__name__}")
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"HostSpec {field} must be a finite number >= 0 seconds, "
                                 f"got {value!r}")
        if isinstance(self.shared_copy, bool) or not isinstance(self.shared_copy, int | float):
            raise TypeError(f"HostSpec shared_copy must be a number, got "
                            f"{type(self.shared_copy).__name__}")
        if not 0 <= self.shared_copy <= 1:
            raise ValueError(f"HostSpec shared_copy must be from 0 to 1, got "
                             f"{self.shared_copy!r}")
        _rate("copy_bandwidth", self.copy_bandwidth)
        _rate("reduce_bandwidth", self.reduce_bandwidth)
        if not isinstance(self.cached, tuple) or not all(
                isinstance(c, tuple) and len(c) == 3 for c in self.cached):
            raise TypeError("HostSpec cached must be a tuple of (up_to, copy_bandwidth, "
                            "reduce_bandwidth) tuples")
        for up_to, copy, reduce in self.cached:
            if isinstance(up_to, bool) or not isinstance(up_to, int) or up_to < 0:
                raise ValueError(f"HostSpec cached up_to must be an int >= 0, got {up_to!r}")
            _rate("cached copy_bandwidth", copy)
            _rate("cached reduce_bandwidth", reduce)
        if [c[0] for c in self.cached] != sorted({c[0] for c in self.cached}):
            raise ValueError("HostSpec cached must be sorted by up_to, each once")
        if not isinstance(self.memory, tuple) or not all(
                isinstance(m, tuple) and len(m) == 2 for m in self.memory):
            raise TypeError("HostSpec memory must be a tuple of (bytes, copy_bandwidth) tuples")
        for size, rate in self.memory:
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ValueError(f"HostSpec memory bytes must be an int >= 1, got {size!r}")
            _rate("memory copy_bandwidth", rate)
        if [m[0] for m in self.memory] != sorted({m[0] for m in self.memory}):
            raise ValueError("HostSpec memory must be sorted by working set, each once")
        if isinstance(self.working_set, bool) or not isinstance(self.working_set, int) \
                or self.working_set < 0:
            raise ValueError(f"HostSpec working_set must be an int >= 0, got "
                             f"{self.working_set!r}")
        if not isinstance(self.unwaited, tuple) or not all(
                isinstance(u, tuple) and len(u) == 3 and isinstance(u[0], str)
                for u in self.unwaited):
            raise TypeError("HostSpec unwaited must be a tuple of (algorithm, ranks, seconds) "
                            "tuples")
        for _, ranks, less in self.unwaited:
            if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 2:
                raise ValueError(f"HostSpec unwaited ranks must be an int >= 2, got {ranks!r}")
            if isinstance(less, bool) or not isinstance(less, int | float) \
                    or not math.isfinite(less):
                raise ValueError(f"HostSpec unwaited seconds must be a finite number, got "
                                 f"{less!r}")
        if [u[:2] for u in self.unwaited] != sorted({u[:2] for u in self.unwaited}):
            raise ValueError("HostSpec unwaited must be sorted by algorithm and ranks, each "
                             "once")

    @property
    def free(self) -> bool:
        """True when a call costs nothing (Rule 3)."""
        return (self.call == self.step == self.switch == self.rendezvous_switch
                == self.touch == self.shared_copy == 0
                and math.isinf(self.copy_bandwidth)
                and math.isinf(self.reduce_bandwidth)
                and all(math.isinf(c) and math.isinf(r) for _, c, r in self.cached)
                and not self.memory and not self.unwaited)

    def rates(self, nbytes: int, working_set: float = 0.0) -> tuple[float, float]:
        """(copy, reduce) bytes/s of a call of ``nbytes`` (Rule 1b) among ``working_set``
        bytes (Rule 1d; 0: as fitted): its cached piece's, or past them all the rates of
        its bytes beyond the last piece's (``work_seconds``)."""
        for up_to, copy, reduce in self.cached:
            if nbytes <= up_to:
                return copy, reduce
        if not (working_set and self.working_set and self.memory):
            return self.copy_bandwidth, self.reduce_bandwidth
        faster = self.per_byte(self.working_set) / self.per_byte(working_set)
        return self.copy_bandwidth * faster, self.reduce_bandwidth * faster

    def work_seconds(self, name: str, nbytes: int, p: int,
                     working_set: float = 0.0) -> float:
        """Seconds of the copies and reductions of a call of ``name`` (as ``work_of``) of
        ``nbytes`` on ``p`` ranks among ``working_set`` bytes (Rules 1b and 1d): each
        ``cached`` piece's rates for the bytes a call of its ``up_to`` has beyond the
        piece before's, the bytes past them all at ``rates``."""
        work = work_of(name, nbytes, p)
        spent, below = 0.0, Work(0, 0.0, 0.0, 0.0)
        for up_to, copy, reduce in (*self.cached, (None, *self.rates(nbytes, working_set))):
            upto = work if up_to is None or nbytes <= up_to else work_of(name, up_to, p)
            spent += ((upto.copied - below.copied) / copy
                      + (upto.reduced - below.reduced) / reduce)
            if upto is work:
                return spent
            below = upto
        return spent

    def per_byte(self, working_set: float) -> float:
        """Seconds per byte copied with ``working_set`` bytes in use (Rule 1d): ``memory``
        read between its points on log2 of the bytes (its ends past them); 0 without."""
        points = self.memory
        if not points:
            return 0.0
        if working_set <= points[0][0]:
            return 1 / points[0][1]
        for (lo, lo_rate), (hi, hi_rate) in itertools.pairwise(points):
            if working_set <= hi:
                f = math.log2(working_set / lo) / math.log2(hi / lo)
                return (1 - f) / lo_rate + f / hi_rate
        return 1 / points[-1][1]

    def slower_messages(self, fp: Footprint) -> float:
        """Seconds the messages one rank receives in a call of footprint ``fp`` cost more
        than their ping-pong (Rules 1d and 1e)."""
        if not fp.messages or not self.memory:
            return 0.0
        more = max(0.0, self.per_byte(fp.working_set)
                   - self.per_byte(2 * fp.received / fp.messages))
        return more * (fp.received + (COLD_SOURCE * fp.cold if self.cores == 1 else 0.0))

    def step_less(self, algorithm: str, p: int, message: float = 0.0,
                  copy: float = math.inf) -> float:
        """Seconds a step of a call of ``algorithm`` (``"allgather.ring"``) on ``p`` ranks,
        whose messages are of ``message`` bytes, costs less (Rule 2c): its entry of the
        most ranks up to ``p`` in ``unwaited`` (0 below its first; without entries, the
        mean of the other algorithms') less its staging copy of the message at ``copy``
        bytes/s (never below 0 for a saving); 0 for a rendezvous message."""
        if message > EAGER_LIMIT or not self.unwaited:
            return 0.0
        named = {a for a, _, _ in self.unwaited}
        less = statistics.fmean(
            next((u for a, n, u in reversed(self.unwaited) if a == name and n <= p), 0.0)
            for name in ({algorithm} if algorithm in named else named))
        return less if less <= 0 else max(0.0, less - message / copy)

    def core(self, rank: int) -> int:
        """The core ``rank`` runs on (Rule 2)."""
        return rank % self.cores if self.cores else rank

    def describe(self) -> str:
        """One line: the cores, the Python per call and step, and the rates in GB/s."""
        pieces = [f"calls <= {n} B: copy {c / 1e9:.2f}, reduce {r / 1e9:.2f}"
                  for n, c, r in self.cached]
        return (f"{f'{self.cores} core(s)' if self.cores else 'a core per rank'}, call "
                f"{self.call * 1e6:.1f} us, step {self.step * 1e6:.1f} us (+"
                f"{self.switch * 1e6:.1f} us on more ranks than cores, +"
                f"{self.rendezvous_switch * 1e6:.1f} us more past the eager limit), first touch "
                f"{self.touch * 4096 * 1e6:.2f} us per 4 KiB page of scratch, "
                + "; ".join([*pieces, f"{'larger' if pieces else 'calls'}: copy "
                             f"{self.copy_bandwidth / 1e9:.2f}, reduce "
                             f"{self.reduce_bandwidth / 1e9:.2f}"]) + " GB/s"
                + (f" (among {self.working_set / 2**20:g} MiB)" if self.working_set else "")
                + ("; copies among " + ", ".join(f"{n / 2**20:g} MiB {r / 1e9:.1f}"
                                                 for n, r in self.memory)
                   + " GB/s" if self.memory else "")
                + (f"; a large message's copy {self.shared_copy:.0%} on its sender's core"
                   if self.shared_copy else "")
                + ("; a step on ranks of one loop less by " + ", ".join(
                    f"{a} on {n} {u * 1e6:.1f}" for a, n, u in self.unwaited)
                   + " us" if self.unwaited else ""))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (infinite rates as None)."""
        return {"cores": self.cores, "call": self.call, "step": self.step,
                "copy_bandwidth": _json_rate(self.copy_bandwidth),
                "reduce_bandwidth": _json_rate(self.reduce_bandwidth),
                "cached": [[n, _json_rate(c), _json_rate(r)] for n, c, r in self.cached],
                "switch": self.switch, "rendezvous_switch": self.rendezvous_switch,
                "touch": self.touch, "shared_copy": self.shared_copy,
                "memory": [list(m) for m in self.memory], "working_set": self.working_set,
                "unwaited": [list(u) for u in self.unwaited]}

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> HostSpec:
        """As ``to_dict`` writes (None rates are infinite).

        Raises:
            TypeError, ValueError: as the constructor; an unknown field.
        """
        fields = dict(doc)
        for rate in ("copy_bandwidth", "reduce_bandwidth"):
            if rate in fields:
                fields[rate] = _read_rate(fields[rate])
        fields["cached"] = tuple((n, _read_rate(c), _read_rate(r))
                                 for n, c, r in fields.get("cached", ()))
        fields["memory"] = tuple((n, r) for n, r in fields.get("memory", ()))
        fields["unwaited"] = tuple((a, n, u) for a, n, u in fields.get("unwaited", ()))
        return cls(**fields)


def _json_rate(rate: float) -> float | None:
    return None if math.isinf(rate) else rate


def _read_rate(rate: float | None) -> float:
    return math.inf if rate is None else rate


def work_of(name: str, nbytes: int, p: int) -> Work:
    """The work of a call of ``name`` (``"allreduce.ring"``, or a bare collective name: its
    algorithm in ``_BARE``) on ``nbytes`` and ``p`` ranks (Rule 1); an unknown name counts
    as one step that copies its buffer."""
    if p <= 1:
        return Work(0, 0.0, 0.0, 0.0)
    work = WORK.get(_algorithm(name))
    return work(nbytes, p) if work is not None else Work(1, float(nbytes), 0.0, 0.0)


class Footprint(NamedTuple):
    """What a call touches (Rule 1d): on every rank together, and what one rank receives."""

    working_set: float  # bytes of every rank's arrays and scratch
    received: float  # bytes one rank receives
    messages: int  # in how many messages
    cold: float = 0.0  # of those bytes, how many leave from the caller's array (Rule 1e)


#: The bytes of the caller's arrays an algorithm reads or writes on a rank (the busiest:
#: a gather's root), and the messages it receives into arrays as large as the call's
#: buffer: (arrays, messages, bytes each).  A ring's reduce-scatter receives each block
#: into one block-sized scratch, which stays in the caches: its messages are not counted.
_ARRAYS: dict[str, Callable[[int, int], tuple[float, int, float]]] = {
    "allreduce.ring": lambda n, p: (n, p - 1, n / p),
    "allreduce.recursive_doubling": lambda n, p: (n, sum(_folded(p)), float(n)),
    "allgather.ring": lambda n, p: (n + n / p, p - 1, n / p),
    "allgather.bruck": lambda n, p: (n + n / p, _log2(p), n * (p - 1) / p / _log2(p)),
    "alltoall.pairwise": lambda n, p: (2.0 * n, p - 1, n / p),
    "gather.linear": lambda n, p: (n + n / p, p - 1, n / p),
    "gather.binomial": lambda n, p: (n + n / p, _log2(p), n * (p - 1) / p / _log2(p)),
}


#: The bytes a rank receives whose messages leave from the caller's array, which no step
#: of the call has just written (Rule 1e): the ring allgather's first, every pairwise
#: alltoall message, the messages of a linear gather's root.
_COLD: dict[str, Callable[[int, int], float]] = {
    "allgather.ring": lambda n, p: n / p,
    "alltoall.pairwise": lambda n, p: n * (p - 1) / p,
    "gather.linear": lambda n, p: n * (p - 1) / p,
}


def footprint(name: str, nbytes: int, p: int) -> Footprint:
    """The footprint of a call of ``name`` (as ``work_of``) on ``nbytes`` and ``p`` ranks:
    every rank's arrays (its buffer, for an algorithm without an entry) and fresh scratch,
    and the messages a rank receives into large arrays (none counted for bcast, reduce,
    reduce_scatter and scatter, whose algorithms the chooser does not weigh against each
    other on it)."""
    if p <= 1:
        return Footprint(0.0, 0.0, 0)
    key = _algorithm(name)
    arrays, messages, each = (_ARRAYS[key](nbytes, p) if key in _ARRAYS
                              else (float(nbytes), 0, 0.0))
    cold = _COLD[key](nbytes, p) if key in _COLD else 0.0
    return Footprint(p * (arrays + work_of(key, nbytes, p).fresh), messages * each, messages,
                     cold)


class CallWork(NamedTuple):
    """A call's CPU seconds on its rank's core (Rule 1), as it spends them (Rule 2d): before
    its first message, and after each of its first ``steps`` waits; ``handoff`` more after
    a wait for a rank on its own core (Rule 2e)."""

    first: float
    step: float
    steps: int
    handoff: float = 0.0


def call_work(host: HostSpec, name: str, nbytes: int, p: int) -> CallWork:
    """The CPU work of one call of ``name`` (as ``work_of``) of ``nbytes`` on ``p`` ranks,
    split as the call spends it (Rule 2d); ``collective_seconds`` in all."""
    steps, _, _, fresh = work_of(name, nbytes, p)
    fp = footprint(name, nbytes, p)
    each = fp.received / fp.messages if fp.messages else float(nbytes)  # a step's message
    # a staged message's copy runs among it and its copy (Rule 2c)
    staging = (1 / host.per_byte(2 * each) if host.memory
               else host.rates(nbytes, fp.working_set)[0])
    crowded = 0 < host.cores < p  # Rule 2: a step's hand-offs, two past the eager limit
    handoff = ((host.switch + (host.rendezvous_switch if each > EAGER_LIMIT else 0.0))
               if crowded else 0.0)
    step = host.step - host.step_less(_algorithm(name), p, each, staging)
    rest = (host.call + host.work_seconds(name, nbytes, p, fp.working_set)
            + fresh * host.touch + host.slower_messages(fp))
    if step <= 0.0:  # a step less than nothing: it goes first, never below nothing
        rest, step = max(0.0, rest + steps * step), 0.0
    if steps and (step > 0.0 or handoff > 0.0):
        return CallWork(rest, step, steps, handoff)
    return CallWork(rest, 0.0, 0)


def collective_seconds(host: HostSpec, name: str, nbytes: int, p: int) -> float:
    """CPU seconds of one call of ``name`` (as ``work_of``) of ``nbytes`` on ``p`` ranks,
    at most: every step's wait taken as one for a rank of its own core (Rule 2e)."""
    work = call_work(host, name, nbytes, p)
    return work.first + work.steps * (work.step + work.handoff)
