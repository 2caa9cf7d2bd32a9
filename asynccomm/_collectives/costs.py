"""Which algorithm a collective runs: a default by message size, or the α–β cost model.

How it works
------------
A chooser is ``choose(names, nbytes, size) -> name``: ``names`` are the collective's
algorithms qualified by its name (``"allreduce.ring"``), ``nbytes`` follows nccl-tests (the
buffer of bcast, reduce and allreduce; the whole ``(size, ...)`` array of allgather,
reduce_scatter, gather, scatter and alltoall; 0 for barrier), ``size`` is the
communicator's.  It returns one of ``names``, qualified or not.  Every rank must choose the
same, so a chooser depends on its arguments only.

``default_choice`` switches by size.  ``model_chooser`` picks the algorithm whose closed form
is smallest on a cluster model.  A closed form counts an algorithm's steps and the bytes
each moves; its α and β come from the model itself: ``CollectiveCosts.step`` plans the
step's messages on a fresh, idle ``ClusterModel`` of the same cluster (the world's live model
is never touched) and takes the last arrival, so α (latencies, the rendezvous handshake of
messages past the eager limit) and 1/B (the slowest of the three stages, or all three in
series for store-and-forward) are the model's own, and messages of one step that share a
model resource (a PCIe switch, a NIC port, a copy engine) share it as they do in a run.
For example, ring allreduce costs 2(p-1) steps of n/p bytes: 2(p-1)·α + 2(p-1)/p·n/B.
To its messages a closed form adds the ranks' own work of the call as the model charges it
(``sim/host.py``: the call, steps, copies, reductions and fresh scratch of the algorithm,
and the switch of each step on more ranks than cores) times the ranks that share the
busiest core, which does their work in turn before their messages: where that work
counts (in-process ranks on one CPU, copies slower than the link) an algorithm of fewer
copies or steps can win where its messages alone would lose.  Presets of published
hardware have no host work, and their choices are their messages'.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import lru_cache

from .._types import EAGER_LIMIT
from ..sim.host import collective_seconds
from ..sim.model import ChunkPlan, ClusterModel

__all__ = ["CollectiveCosts", "Chooser", "default_choice", "model_chooser"]

Chooser = Callable[[Sequence[str], int, int], str]

KiB = 1 << 10
MiB = 1 << 20

#: (algorithm below the threshold, threshold in bytes, algorithm at and above it)
_BY_SIZE: dict[str, tuple[str, int, str]] = {
    "allreduce": ("recursive_doubling", 1 * MiB, "ring"),
    "allgather": ("bruck", 1 * MiB, "ring"),
    "reduce_scatter": ("recursive_doubling", 256 * KiB, "ring"),
    "gather": ("binomial", 256 * KiB, "linear"),
    "scatter": ("binomial", 256 * KiB, "linear"),
}


def default_choice(names: Sequence[str], nbytes: int, size: int) -> str:
    """The default chooser: latency-bound algorithms (recursive doubling, Bruck, binomial
    trees) for small messages, bandwidth-bound ones (rings, linear) for large."""
    collective = names[0].partition(".")[0]
    rule = _BY_SIZE.get(collective)
    if rule is None:
        return names[0]
    small, threshold, large = rule
    want = f"{collective}.{small if nbytes < threshold else large}"
    return want if want in names else names[0]


class CollectiveCosts:
    """Closed-form times (seconds) of every algorithm on a cluster model, for a communicator
    whose rank i is world rank ``ranks[i]`` (see module docs).

    Raises:
        TypeError: ``model`` is not a ClusterModel.
        ValueError: ``ranks`` empty or out of the model's world.
    """

    def __init__(self, model: ClusterModel, ranks: Sequence[int],
                 eager_limit: int = EAGER_LIMIT) -> None:
        if not isinstance(model, ClusterModel):
            raise TypeError(f"model must be a ClusterModel, got {type(model).__name__}")
        self.ranks = tuple(int(r) for r in ranks)
        if not self.ranks or not all(0 <= r < model.world_size for r in self.ranks):
            raise ValueError(f"ranks must be world ranks of 0..{model.world_size - 1}")
        self.size = len(self.ranks)
        self.eager_limit = eager_limit
        self._cluster = model.cluster
        self._world = model.world_size
        self._strategy = model.strategy
        self._slots = model.staging_slots
        self.step = lru_cache(maxsize=4096)(self._step)
        # the ranks whose work the busiest core does in turn (one CPU for a node's
        # in-process ranks, whose messages it moves too: ``ClusterModel.core``), found on a
        # fresh model
        fresh = None if model.cluster.host.free else ClusterModel(self._cluster, self._world)
        cores = [fresh.core(r).name for r in self.ranks] if fresh is not None else []
        self._per_core = max((cores.count(c) for c in cores), default=0)

    def _step(self, messages: tuple[tuple[int, int, int], ...]) -> float:
        """Seconds until the last of ``messages`` (src, dst, nbytes; communicator ranks),
        posted together on an idle cluster, has arrived."""
        model = ClusterModel(self._cluster, self._world, strategy=self._strategy,
                             staging_slots=self._slots)
        moving = []
        for src, dst, nbytes in messages:
            a, b = self.ranks[src], self.ranks[dst]
            if nbytes <= self.eager_limit:
                moving.append(model.start(a, b, nbytes, now=0,
                                          plan=ChunkPlan("async", max(1, nbytes))))
            else:  # request-to-send, clear-to-send, then the payload
                ready = model.control(b, a, now=model.control(a, b, now=0))
                moving.append(model.start(a, b, nbytes, now=ready))
        model.settle()  # transfers on fair links end when every one of them is known
        return max((m.end or 0 for m in moving), default=0) * 1e-9

    # -- building blocks --------------------------------------------------------------------

    def _shift(self, k: int, nbytes: int) -> float:
        """One step in which every rank sends ``nbytes`` to rank + k."""
        p = self.size
        return self.step(tuple((r, (r + k) % p, nbytes) for r in range(p)))

    @property
    def alpha(self) -> float:
        """Seconds of one empty message between ranks 0 and 1 on an idle path."""
        return self.step(((0, 1 % self.size, 0),))

    def bandwidth(self, nbytes: int = 64 * MiB) -> float:
        """B: the marginal bytes/s of messages of about ``nbytes`` between ranks 0 and 1
        (``nbytes`` more bytes cost nbytes/B more), α excluded."""
        dst = 1 % self.size
        t = self.step(((0, dst, 2 * nbytes),)) - self.step(((0, dst, nbytes),))
        return nbytes / t if t > 0 else math.inf

    # -- closed forms -------------------------------------------------------------------------

    def cost(self, name: str, nbytes: int) -> float:
        """The closed form of algorithm ``name`` (qualified, ``"allreduce.ring"``) for a call
        of ``nbytes`` (nccl-tests convention), in seconds.

        Raises:
            ValueError: an unknown algorithm.
        """
        form = getattr(self, "_" + name.replace(".", "__"), None)
        if form is None:
            raise ValueError(f"no closed form for {name!r}")
        if self.size == 1:
            return 0.0
        return float(form(nbytes)) + self.work(name, nbytes)

    def work(self, name: str, nbytes: int) -> float:
        """Seconds of the ranks' own work in a call of ``name`` on the busiest core (see
        module docs); 0 without host work."""
        if not self._per_core:
            return 0.0
        host = self._cluster.host
        return self._per_core * collective_seconds(host, name, nbytes, self.size)

    def _rounds(self) -> int:
        return (self.size - 1).bit_length()

    def _barrier__dissemination(self, n: int) -> float:
        return sum(self._shift(1 << k, 0) for k in range(self._rounds()))

    def _bcast__binomial(self, n: int) -> float:
        return self._rounds() * self._shift(1, n)  # one send per round on the critical path

    def _reduce__binomial(self, n: int) -> float:
        return self._rounds() * self._shift(1, n)

    def _allreduce__ring(self, n: int) -> float:
        p = self.size
        return 2 * (p - 1) * self._shift(1, -(-n // p))

    def _allreduce__recursive_doubling(self, n: int) -> float:
        p = self.size
        p2 = 1 << (p.bit_length() - 1)
        rem = p - p2
        real = [2 * v + 1 if v < rem else v + rem for v in range(p2)]
        total = 0.0
        if rem:  # fold and unfold: a pair's even rank hands over, then gets the result
            total += 2 * self.step(tuple((2 * i, 2 * i + 1, n) for i in range(rem)))
        d = 1
        while d < p2:
            total += self.step(tuple((real[v], real[v ^ d], n) for v in range(p2)))
            d <<= 1
        return total

    def _allgather__ring(self, n: int) -> float:
        p = self.size
        return (p - 1) * self._shift(1, -(-n // p))

    def _allgather__bruck(self, n: int) -> float:
        p = self.size
        m = -(-n // p)
        total, k = 0.0, 1
        while k < p:
            total += self._shift(-k % p, min(k, p - k) * m)
            k <<= 1
        return total

    def _reduce_scatter__ring(self, n: int) -> float:
        p = self.size
        return (p - 1) * self._shift(1, -(-n // p))

    def _reduce_scatter__recursive_doubling(self, n: int) -> float:
        p = self.size
        m = -(-n // p)
        p2 = 1 << (p.bit_length() - 1)
        rem = p - p2
        real = [2 * v + 1 if v < rem else v + rem for v in range(p2)]
        first = [2 * v if v < rem else v + rem for v in range(p2)] + [p]
        total = 0.0
        if rem:
            total += self.step(tuple((2 * i, 2 * i + 1, n) for i in range(rem)))
            total += self.step(tuple((2 * i + 1, 2 * i, m) for i in range(rem)))
        d = p2 >> 1
        while d:
            msgs = []
            for v in range(p2):
                give = (v & ~(2 * d - 1)) + (d if v & d == 0 else 0)
                msgs.append((real[v], real[v ^ d], (first[give + d] - first[give]) * m))
            total += self.step(tuple(msgs))
            d >>= 1
        return total

    def _gather__linear(self, n: int) -> float:
        p = self.size
        return self.step(tuple((r, 0, -(-n // p)) for r in range(1, p)))

    def _scatter__linear(self, n: int) -> float:
        p = self.size
        return self.step(tuple((0, r, -(-n // p)) for r in range(1, p)))

    def _gather__binomial(self, n: int) -> float:
        p = self.size
        m = -(-n // p)
        return sum(self._shift(1, min(1 << k, p - (1 << k)) * m) for k in range(self._rounds()))

    def _scatter__binomial(self, n: int) -> float:
        return self._gather__binomial(n)

    def _alltoall__pairwise(self, n: int) -> float:
        p = self.size
        m = -(-n // p)
        return sum(self._shift(s, m) for s in range(1, p))

    def chooser(self) -> Chooser:
        """A chooser that picks the algorithm with the smallest closed form."""

        def choose(names: Sequence[str], nbytes: int, size: int) -> str:
            if size != self.size:
                return default_choice(names, nbytes, size)
            return min(names, key=lambda name: self.cost(name, nbytes))

        return choose


def model_chooser(model: ClusterModel, ranks: Sequence[int],
                  eager_limit: int = EAGER_LIMIT) -> Chooser:
    """A chooser for a communicator of an in-process cluster world: ``model`` is the world's
    ``ClusterModel``, ``ranks[i]`` the world rank of communicator rank i (``range(size)``
    for the world itself), ``eager_limit`` the world's.

    Raises:
        TypeError, ValueError: as ``CollectiveCosts``.
    """
    return CollectiveCosts(model, ranks, eager_limit).chooser()
