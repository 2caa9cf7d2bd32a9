"""The cost model: when each point-to-point transfer starts and ends on a cluster.

How it works
------------
Time is integer nanoseconds passed in as ``now=`` (sans-IO, like aioquic); nothing here
reads a clock.  Bandwidths are bytes/s, sizes bytes.

Rule 1 (resources).  Every copy engine, and every directed link or NIC port whose
``LinkSpec.sharing`` is ``"fifo"``, is a FIFO ``Resource`` with a ``free_at``.  A use ready
at t starts at max(t, free_at) and moves free_at to its end.  Uses are served in the order
they are planned: a later transfer never fills a gap an earlier one left, so concurrent
transfers on one resource queue (a DMA engine really does serialise).

Rule 1b (fair links).  A transfer over a link whose sharing is ``"fair"`` (the default)
shares its link and copy engines with the transfers that use them at the same time, max-min
fairly (``sim/sharing.py``, after SimGrid's flow model).  It is first planned as if every
resource it uses were idle (Rules 2-5), taking D.  Its first chunk's latencies (link and
both copies) are a delay that holds nothing, as in SimGrid, where latency is not shared;
the rest of D becomes one flow, which loads each of its resources by the fraction of that
time it held it (its busy time less the first latency).  Alone it ends when the idle plan
does; k equal transfers that fill one link each take k times as long; a copy-bound
transfer leaves the gaps in its link's use to others.  The rates change whenever a flow
starts or ends, so the end is known only when the flow has ended (``start``, ``advance``,
``settle``); ``transfer`` predicts it from the transfers known so far.  An eager ("async")
sender is free when its idle plan says (its staging copy is not stretched).  FIFO
reservations and fair flows do not see each other: a copy engine used by transfers over
both kinds of link serves each kind as if the other were absent.

Rule 2 (three stages).  A chunk of c bytes crosses copy-out (the source device's copy
engine, user buffer -> staging: copy_latency + c/copy_bandwidth), the link (held for
latency + c/effective_bandwidth, or its ``LinkSpec.segments`` when measured: the per-chunk
alpha is paid as occupancy, so chunking costs something and an optimal chunk exists) and
copy-in (the destination's copy engine).  A stage starts when the chunk's previous stage
has ended and its resource is free.

Rule 3 (double buffering).  With ``staging_slots`` = s, chunk i's copy-out waits until chunk
i-s has left the source staging (its link stage ended), and chunk i's link stage waits until
chunk i-s has left the destination staging (its copy-in ended).

Rule 4 (which resources).  Same node and group: the directed (src, dst) link, or with
``switched_intra`` the source's egress and destination's ingress switch ports, or with
``shared_intra`` one resource for the whole node (a bus).  Different nodes: the source
device's NIC egress and the destination's NIC ingress, both held for the whole link
stage.  Different groups of a node: one resource per node and directed group
pair (the PCIe switch).  Copy engines are per device and per direction (PCIe and DMA are
full duplex), so a rank that sends and receives at once does not halve its copy rate.
Rule 4b (crowded cores).  Where the ranks share cores (``Cluster.host`` ``cores`` > 0, a
node that is not ``shared_intra``: processes of one machine, whose CPUs copy each
message's bytes), a same-node, same-group transfer is held on the core of its
destination, which copies it in: ranks on one core share its rate (fairly, on a
``"fair"`` link), where on cores of their own each pair's transfers are as on a link of
their own, as before.  There, too, a link with ``crowded`` segments times each transfer by
them (``LinkSpec.crowded``): on a node whose ranks outnumber its cores one process copies a
message that on cores of their own its two processes may copy together.
Rule 4c (a crowded core copies).  On such a node a transfer also holds its destination's
core (``core``: the ranks' own work queues there, ``sim/host.py``) for its link time, from
its start: the process that copies it in runs nothing else meanwhile, so the work queued
after it waits (transfers into one core share its rate among themselves, Rule 4b, and hold
it one after another, as long in all).  Calibrated against the same measurements
(processes and MPI, 4 KiB to 4 MiB calls on 3 and 4 ranks, the switches solved again on
this model), the cells' mean error fell from 11-12% to 8.8-10%, most on 3 ranks
(allgather 14-18% to 4.6-8.3%, allreduce 10-13% to 5.0-6.5%).
Rule 4d (the sender's half).  There a transfer between ranks on two cores also takes
``SENDER_SHARE`` (half) of its link time on its source's core, from its start: the link
time of a crowded ping-pong holds both sides' work, and the sender does its part (an eager
message is copied into the ring by its sender and out by its receiver; a rendezvous
sender announces, polls and answers).  Transfers between ranks of one core hold that core
once (Rule 4c).  Against the same measurements (five runs, the switches solved again),
the cells met rose from 17 to 24 of 45 on processes and 19 to 24 on MPI, the mean error
from 12.4 to 10.2% and 11.0 to 9.3%; the 4-rank allgather and alltoall of 256 KiB (13-56%
under before) moved most.
Rule 4e (both cores copy a large message).  Where the ranks have cores of their own (a
node that is not crowded, ``Cluster.host`` ``cores`` > 0), a same-node transfer of
``SHARED_COPY_MIN`` bytes or more between ranks on two cores also loads its source's core
(the same fair resource as a transfer into that core, Rule 4b) by ``host.shared_copy`` of
its link time: the shared-memory link splits such a copy between the two processes
(``transports.shm``, ``SHARE_MIN``), and MPICH's shared-memory path keeps both busy too.
Alone a transfer ends as before; two crossing each other (an exchange, each step of a
ring on two ranks) each take (1 + share) link times.  Measured on 2 bound processes, an
exchange of m bytes each way (``sendrecv``) against one message of m and a byte back,
same run, interleaved: 96-192 KiB 1.13-1.25x, 256 KiB 1.21-1.37x, 512 KiB 1.35-1.42x,
1-8 MiB 1.62-1.86x, on processes and MPI alike; the model had 0.95-0.99x, and priced
4 MiB calls on two ranks (2 MiB messages) 16-39% under.  The share is calibrated
(``asynccomm.calibrate.measure_shared_copy``, an exchange of 2 MiB): 0.74-0.87 on
processes and 0.92-0.99 on MPI in four readings each; 0 (the default, presets of
published hardware) leaves every transfer as before.

Rule 5 (modes).  "sync" and "async" move one chunk, stages in series (store-and-forward);
"async" frees the sender when its data is in staging, the others at the end.  "pipelined"
moves equal chunks (the last may be shorter) that flow through the stages.  A same-rank
transfer is one device copy; zero bytes cost the latencies only.

So store-and-forward costs the sum of the stages, pipelined about the fill plus n times the
slowest stage: the speed-up approaches the number of stages and never passes it, and no
transfer is faster than its slowest stage's effective bandwidth.

Rule 6 (faults).  With a fault plan (``faults``, ``sim/faults.py``), a transfer or control
message between two ranks leaves when the plan lets it (after its pair's delays, jitter
and partitions), over its link with the plan's bandwidth then, its copies slowed by each
end's slowdown; one from a hung rank never leaves (``HELD``: it holds nothing).

Planning is chunk by chunk, but the recurrence is max-plus linear: once every stage's end
advances by the same period for a whole staging window, each further full chunk only
shifts the state by that period, so the rest is added in closed form.  Results equal the
chunk-by-chunk simulation exactly (``trace=`` forces it; the tests compare the two).
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

from .cluster import Cluster, DeviceSpec, LinkSpec, to_ns
from .cluster import _check_int as _int
from .faults import HELD, PlannedFaults
from .sharing import FairShare, Flow

__all__ = ["MODES", "ChunkPlan", "ChunkTiming", "ClusterModel", "DefaultStrategy", "Pipelined",
           "Resource", "StoreAndForward", "Strategy", "Transfer", "TransferPlan",
           "adaptive_chunk"]

MODES = ("sync", "async", "pipelined")
#: The share of a crowded transfer's link time its sender's core spends on it (Rule 4d).
SENDER_SHARE = 0.5
#: Transfers of at least this many bytes are copied by both their ranks' cores, where the
#: ranks have cores of their own (Rule 4e): where the shared-memory link starts to split a
#: message's copy between its two processes (``transports.shm.SHARE_MIN``).
SHARED_COPY_MIN = 256 << 10


class Resource:
    """A FIFO resource (a directed link, a NIC port, a copy engine); times in ns."""

    __slots__ = ("busy", "free_at", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.free_at = 0
        self.busy = 0  # total ns held

    def reserve(self, ready: int, duration: int) -> tuple[int, int]:
        """Hold the resource for ``duration`` ns from when it is free and ``ready``.

        Raises:
            ValueError: ``duration`` < 0.
        """
        if duration < 0:
            raise ValueError(f"duration must be >= 0 ns, got {duration}")
        start = max(ready, self.free_at)
        self.free_at = end = start + duration
        self.busy += duration
        return start, end

    def release(self, start: int, end: int, now: int) -> None:
        """Give back what is left after ``now`` of the hold ``start``..``end`` that
        ``reserve`` returned, when nothing has been reserved after it (work abandoned)."""
        if self.free_at == end and now < end:
            cut = max(now, start)
            self.busy -= end - cut
            self.free_at = cut

    def __repr__(self) -> str:
        return f"Resource({self.name!r}, free_at={self.free_at}, busy={self.busy})"


@dataclass(frozen=True, slots=True)
class ChunkPlan:
    """How to move one transfer: a mode of ``MODES`` and the chunk size for "pipelined"
    ("sync" and "async" always move one chunk).

    Raises:
        ValueError: unknown mode, ``chunk_bytes`` < 1.
        TypeError: ``chunk_bytes`` not an int.
    """

    mode: str
    chunk_bytes: int

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}; got {self.mode!r}")
        _int("chunk_bytes", self.chunk_bytes, 1)


class Strategy(Protocol):
    """Chooses a ``ChunkPlan`` for a transfer of ``nbytes`` over ``link``."""

    def choose(self, nbytes: int, link: LinkSpec, device: DeviceSpec,
               world_size: int) -> ChunkPlan: ...


def adaptive_chunk(nbytes: int, latency: float, bandwidth: float, *, stages: float = 3,
                   min_chunk: int = 65536) -> int:
    """The chunk that minimises a pipelined transfer's time, clamped to [min_chunk, nbytes].

    With n = S/c chunks through k balanced stages of time alpha + c/B each, the time is
    (n + k - 1)(alpha + c/B); its minimum is at c* = sqrt(S*alpha*B/(k-1)).  The transfer is
    then cut into round(S/c*) equal chunks (so no short last chunk pays a whole alpha, and a
    c* near S gives one chunk rather than a big and a small one).  ``stages`` may be
    fractional: a stage faster than the bottleneck counts as the ratio of their rates.

    Raises:
        TypeError: ``nbytes`` or ``min_chunk`` not an int.
        ValueError: ``nbytes`` < 0, ``min_chunk`` < 1, ``latency`` < 0, ``bandwidth`` <= 0,
            ``stages`` < 1 (or NaN anywhere).
    """
    _int("nbytes", nbytes, 0)
    _int("min_chunk", min_chunk, 1)
    if not latency >= 0 or not bandwidth > 0 or not stages >= 1:
        raise ValueError(f"need latency >= 0, bandwidth > 0 and stages >= 1; got "
                         f"latency={latency!r}, bandwidth={bandwidth!r}, stages={stages!r}")
    if nbytes <= 1 or stages == 1 or math.isinf(bandwidth):
        return max(1, nbytes)  # nothing to overlap, or bytes cost nothing: one chunk
    ideal = math.sqrt(nbytes * latency * bandwidth / (stages - 1))
    chunks = max(1, round(nbytes / ideal)) if ideal > 0 else nbytes
    return min(nbytes, max(min_chunk, -(-nbytes // chunks)))


def _profile(link: LinkSpec, device: DeviceSpec) -> tuple[float, float, float]:
    """(alpha, bottleneck bandwidth, effective stage count) of the three-stage path."""
    rates = (device.copy_bandwidth, link.effective_bandwidth, device.copy_bandwidth)
    slowest = min(rates)
    # k - 1 = sum over the other stages of (their time per byte / the bottleneck's)
    stages = 1.0 if math.isinf(slowest) else sum(slowest / r for r in rates)
    # alpha: the largest per-chunk latency bounds the period from above (conservative)
    return max(link.latency, device.copy_latency), slowest, stages


class StoreAndForward:
    """Always one chunk, stages in series ("sync")."""

    def choose(self, nbytes: int, link: LinkSpec, device: DeviceSpec,
               world_size: int) -> ChunkPlan:
        return ChunkPlan("sync", max(1, nbytes))


class Pipelined:
    """Always "pipelined", with a fixed chunk or (``chunk_bytes=None``) the adaptive one.

    Raises:
        TypeError, ValueError: ``chunk_bytes`` or ``min_chunk`` not an int >= 1.
    """

    def __init__(self, chunk_bytes: int | None = None, *, min_chunk: int = 65536) -> None:
        self.chunk_bytes = None if chunk_bytes is None else _int("chunk_bytes", chunk_bytes, 1)
        self.min_chunk = _int("min_chunk", min_chunk, 1)

    def choose(self, nbytes: int, link: LinkSpec, device: DeviceSpec,
               world_size: int) -> ChunkPlan:
        if self.chunk_bytes is not None:
            return ChunkPlan("pipelined", self.chunk_bytes)
        alpha, bandwidth, stages = _profile(link, device)
        return ChunkPlan("pipelined", adaptive_chunk(nbytes, alpha, bandwidth, stages=stages,
                                                     min_chunk=self.min_chunk))


class DefaultStrategy:
    """Small messages "async" (eager: the sender is free once its data is staged), medium
    "sync" (store-and-forward), large "pipelined" with the adaptive chunk.

    ``nbytes <= async_max`` is small (the eager limit, inclusive); ``nbytes >= pipeline_min``
    is large.  ``world_size`` does not move the thresholds: the cost of one transfer depends
    on its link, and the contention a large world brings (many peers on one port or copy
    engine) is already modelled by the shared resources, so folding rank count into the
    thresholds too would count it twice.

    Raises:
        TypeError, ValueError: ``async_max`` < 0, ``pipeline_min`` or ``min_chunk`` < 1, or
            ``async_max >= pipeline_min``.
    """

    def __init__(self, *, async_max: int = 65536, pipeline_min: int = 1 << 20,
                 min_chunk: int = 65536) -> None:
        self.async_max = _int("async_max", async_max, 0)
        self.pipeline_min = _int("pipeline_min", pipeline_min, 1)
        if async_max >= pipeline_min:
            raise ValueError(f"async_max ({async_max}) must be < pipeline_min ({pipeline_min})")
        self._pipelined = Pipelined(min_chunk=min_chunk)

    def choose(self, nbytes: int, link: LinkSpec, device: DeviceSpec,
               world_size: int) -> ChunkPlan:
        if nbytes <= self.async_max:
            return ChunkPlan("async", max(1, nbytes))
        if nbytes < self.pipeline_min:
            return ChunkPlan("sync", nbytes)
        return self._pipelined.choose(nbytes, link, device, world_size)


@dataclass(frozen=True, slots=True)
class TransferPlan:
    """The modelled timing of one transfer (ns)."""

    nbytes: int
    mode: str
    chunks: int
    chunk_bytes: int  # bytes per chunk but the last
    start: int  # when the first stage began
    end: int  # when the last byte is in the destination buffer
    sender_done: int  # when the sender's buffer may be reused
    link_busy: int  # ns the link stage was held

    @property
    def duration(self) -> int:
        """``end - start`` in ns."""
        return self.end - self.start

    @property
    def bandwidth(self) -> float:
        """Bytes/s from the first stage's start to the end (0 for an instant transfer)."""
        return self.nbytes * 1e9 / self.duration if self.duration else 0.0


class Transfer:
    """A transfer as it moves: a ``TransferPlan`` whose ``end`` is None while it shares a
    fair link (the rates of its flow may still change), and known at once on a FIFO link.

    ``when_done`` holds what the timing layer calls at its end (not used by the model).
    """

    __slots__ = ("chunk_bytes", "chunks", "end", "flow", "link_busy", "mode", "nbytes",
                 "sender_done", "start", "when_done")

    def __init__(self, nbytes: int, mode: str, chunks: int, chunk_bytes: int, start: int,
                 sender_done: int, link_busy: int, *, end: int | None = None,
                 flow: Flow | None = None) -> None:
        self.nbytes, self.mode, self.chunks, self.chunk_bytes = nbytes, mode, chunks, chunk_bytes
        self.start, self.sender_done, self.link_busy = start, sender_done, link_busy
        self.end = end
        self.flow = flow
        self.when_done: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []

    def plan_ending(self, end: int) -> TransferPlan:
        """This transfer's plan if it ends at ``end``."""
        return TransferPlan(self.nbytes, self.mode, self.chunks, self.chunk_bytes, self.start,
                            end, min(self.sender_done, end) if self.mode == "async" else end,
                            self.link_busy)

    @property
    def plan(self) -> TransferPlan:
        """The final plan.

        Raises:
            RuntimeError: it has not ended yet.
        """
        if self.end is None:
            raise RuntimeError("the transfer is still moving: its end is not known yet")
        return self.plan_ending(self.end)

    def __repr__(self) -> str:
        return (f"Transfer({self.nbytes} B, {self.mode}, start={self.start}, "
                f"end={self.end}, sender_done={self.sender_done})")


@dataclass(frozen=True, slots=True)
class ChunkTiming:
    """One chunk's (start, end) in each stage, from ``ClusterModel.transfer(trace=...)``."""

    index: int
    nbytes: int
    copy_out: tuple[int, int]
    link: tuple[int, int]
    copy_in: tuple[int, int]


class ClusterModel:
    """Plans transfers on a cluster for a world of ``world_size`` ranks (see module docs).

    Raises:
        TypeError: ``cluster`` not a Cluster, a count not an int.
        ValueError: ``world_size`` < 1 or too large for a fixed cluster,
            ``staging_slots`` < 1.
    """

    def __init__(self, cluster: Cluster, world_size: int, *, strategy: Strategy | None = None,
                 staging_slots: int = 2) -> None:
        if not isinstance(cluster, Cluster):
            raise TypeError(f"cluster must be a Cluster, got {type(cluster).__name__}")
        self.cluster = cluster.fit(world_size)
        self.world_size = world_size
        self.strategy: Strategy = strategy if strategy is not None else DefaultStrategy()
        self.staging_slots = _int("staging_slots", staging_slots, 1)
        self._resources: dict[str, Resource] = {}
        self._link_busy = [0] * world_size
        self._sharing = FairShare()
        self._moving: dict[Flow, Transfer] = {}
        #: A fault plan compiled for this world (``sim/faults.py``), or None: what delays
        #: messages, degrades links and slows ranks down.
        self.faults: PlannedFaults | None = None
        #: The nodes that run more of this world's ranks than their host has cores: their
        #: links time transfers by their ``crowded`` segments (Rule 4b).
        cores = self.cluster.host.cores
        self._crowded = frozenset() if not cores else frozenset(
            node for node, ranks in Counter(map(self.cluster.node_of, range(world_size))).items()
            if ranks > cores)

    def _rank(self, name: str, rank: object) -> int:
        if (checked := _int(name, rank, 0)) >= self.world_size:
            raise ValueError(f"{name} {rank} out of range for a world of {self.world_size}")
        return checked

    def _resource(self, name: str) -> Resource:
        res = self._resources.get(name)
        if res is None:
            res = self._resources[name] = Resource(name)
        return res

    def _link_resources(self, src: int, dst: int) -> tuple[Resource, ...]:
        c = self.cluster
        kind = c.link_kind(src, dst)
        name = f"{kind}:{c.link(src, dst).name}"
        if kind == "intra" and c.shared_intra:  # one bus per node
            return (self._bus(c.node_of(src)),)
        if kind == "intra" and c.host.cores and not c.switched_intra:  # Rule 4b
            return (self._core_link(name, dst),)
        if kind == "inter" or (kind == "intra" and c.switched_intra):  # a port per device
            return self._resource(f"{name}-out[{src}]"), self._resource(f"{name}-in[{dst}]")
        if kind == "cross_group":  # one per node and directed group pair
            return (self._resource(f"{name}[node{c.node_of(src)}:"
                                   f"g{c.group_of(src)}->g{c.group_of(dst)}]"),)
        return (self._resource(f"{name}[{src}->{dst}]"),)

    def core(self, rank: int) -> Resource:
        """The FIFO resource of the core ``rank`` runs on (``Cluster.host``, Rule 2 of
        ``sim/host.py``): the ranks' own CPU work queues on it.  On a node whose transfers
        take turns on one bus (``shared_intra`` with a ``"fifo"`` link) and whose ranks
        share one core, that core is the bus: the work and the messages take turns.

        Raises:
            TypeError, ValueError: a bad rank.
        """
        c, r = self.cluster, self._rank("rank", rank)
        if c.shared_intra and c.intra.sharing == "fifo" and c.host.cores == 1:
            # one CPU moves every message of the node in turn and does the ranks' work:
            # in-process ranks on one event loop (``calibrated_cluster``)
            return self._bus(c.node_of(r))
        return self._resource(f"core[{c.host.core(r)}]")

    def _bus(self, node: int) -> Resource:
        """The one resource of a ``shared_intra`` node's transfers."""
        return self._resource(f"intra:{self.cluster.intra.name}[node{node}]")

    @property
    def resources(self) -> MappingProxyType[str, Resource]:
        """Every resource used so far, by name (read-only view)."""
        return MappingProxyType(self._resources)

    def transfer(self, src: int, dst: int, nbytes: int, *, now: int,
                 plan: ChunkPlan | None = None,
                 trace: list[ChunkTiming] | None = None) -> TransferPlan:
        """Plan a transfer of ``nbytes`` from ``src`` to ``dst`` ready at ``now`` and reserve
        its resources.  ``plan`` overrides the strategy; ``trace``, when given, receives
        every chunk's timings (and forces the chunk-by-chunk simulation).

        On a fair link the plan's end is a prediction: it holds if no other transfer joins
        the links this one shares (``start`` and ``settle`` give the final times of
        transfers planned together).

        Raises:
            TypeError: a rank, ``nbytes`` or ``now`` not an int; ``plan`` (or the strategy's
                choice) not a ChunkPlan.
            ValueError: a rank out of range, ``nbytes`` or ``now`` < 0.
        """
        moving = self.start(src, dst, nbytes, now=now, plan=plan, trace=trace)
        if moving.end is None:
            assert moving.flow is not None
            return moving.plan_ending(self._sharing.predict(moving.flow))
        return moving.plan

    def start(self, src: int, dst: int, nbytes: int, *, now: int,
              plan: ChunkPlan | None = None,
              trace: list[ChunkTiming] | None = None) -> Transfer:
        """Start a transfer as ``transfer`` plans it, and return it as it moves: on a fair
        link its ``end`` is None until ``advance`` (or ``settle``) has seen it end.

        Raises:
            TypeError, ValueError: as ``transfer``.
        """
        self._rank("src", src)
        self._rank("dst", dst)
        _int("nbytes", nbytes, 0)
        _int("now", now, 0)
        if plan is not None and not isinstance(plan, ChunkPlan):
            raise TypeError(f"plan must be a ChunkPlan or None, got {type(plan).__name__}")
        moving = self._planned(src, dst, nbytes, now, plan, trace)
        core = self._copying_core(src, dst)
        if core is not None and moving.start < HELD:  # Rule 4c (a held one holds nothing)
            core.reserve(moving.start, moving.link_busy)
            if (sender := self.core(src)) is not core:  # Rule 4d
                sender.reserve(moving.start, round(moving.link_busy * SENDER_SHARE))
        return moving

    def _crowded_link(self, src: int, dst: int) -> bool:
        """A transfer between two ranks of one node that runs more ranks than its host has
        cores (Rule 4b)."""
        c = self.cluster
        return (bool(self._crowded) and c.node_of(dst) in self._crowded
                and c.link_kind(src, dst) == "intra")

    def _sharing_core(self, src: int, dst: int, nbytes: int) -> Resource | None:
        """The link resource of ``src``'s core, where a transfer of ``nbytes`` from it to
        ``dst`` is copied by both their processes (Rule 4e): one of ``SHARED_COPY_MIN``
        bytes or more between ranks of one node with cores of their own, on a host that
        shares copies; else None."""
        c = self.cluster
        if (nbytes < SHARED_COPY_MIN or not c.host.shared_copy or src == dst
                or not c.host.cores or c.shared_intra
                or c.switched_intra or c.link_kind(src, dst) != "intra"
                or c.node_of(src) in self._crowded
                or c.host.core(src) == c.host.core(dst)):
            return None
        return self._core_link(f"intra:{c.link(src, dst).name}", src)

    def _core_link(self, name: str, rank: int) -> Resource:
        """The fair resource of link ``name`` on the core ``rank`` runs on: what transfers
        into that core share (Rule 4b), and those out of it load too (Rule 4e)."""
        c = self.cluster
        return self._resource(f"{name}[node{c.node_of(rank)}:core{c.host.core(rank)}]")

    def _copying_core(self, src: int, dst: int) -> Resource | None:
        """The core that copies a transfer from ``src`` in at ``dst``, where it also runs
        other ranks' work (Rule 4c): a crowded node's, else None."""
        c = self.cluster
        if (src == dst or c.shared_intra or c.switched_intra
                or not self._crowded_link(src, dst)):
            return None
        return self.core(dst)

    def _planned(self, src: int, dst: int, nbytes: int, now: int, plan: ChunkPlan | None,
                 trace: list[ChunkTiming] | None) -> Transfer:
        device = self.cluster.device
        faults = self.faults
        if src == dst:  # a device copy, no link
            d = to_ns((device.copy_latency + nbytes / device.copy_bandwidth)
                      * (1.0 if faults is None else faults.slowdown(src)))
            start, end = self._resource(f"copy-out[{src}]").reserve(now, d)
            if trace is not None:
                trace.append(ChunkTiming(0, nbytes, (start, end), (end, end), (end, end)))
            return Transfer(nbytes, "sync", 1, nbytes, start, end, 0, end=end)
        link = self.cluster.link(src, dst)
        if faults is not None:
            now = faults.depart(src, dst, now)
            if now >= HELD:  # its sender hung: it never leaves, and holds nothing
                return Transfer(nbytes, "sync", 1, nbytes, HELD, HELD, 0, end=HELD)
            link = faults.link(src, dst, link, now)
        if plan is None:
            plan = self.strategy.choose(nbytes, link, device, self.world_size)
            if not isinstance(plan, ChunkPlan):
                raise TypeError(f"the strategy must return a ChunkPlan, "
                                f"got {type(plan).__name__}")
        chunk = min(plan.chunk_bytes, nbytes) if plan.mode == "pipelined" else nbytes
        n = -(-nbytes // chunk) if chunk else 1
        last = nbytes - (n - 1) * chunk
        full_d, last_d = self._durations(chunk, link, src, dst), self._durations(last, link,
                                                                                 src, dst)
        links = self._link_resources(src, dst)
        copy_out, copy_in = self._resource(f"copy-out[{src}]"), self._resource(f"copy-in[{dst}]")
        link_busy = (n - 1) * full_d[1] + last_d[1]
        self._link_busy[src] += link_busy
        if link.sharing == "fifo":
            start, staged, end = _flow((copy_out, links, copy_in), full_d, last_d, n, now,
                                       self.staging_slots, trace, chunk, last)
            sender_done = staged if plan.mode == "async" else end
            return Transfer(nbytes, plan.mode, n, chunk, start, sender_done, link_busy, end=end)
        # Fair (Rule 1b): planned on idle resources, then one flow through all of them.
        idle = (Resource("idle-out"), (Resource("idle-link"),), Resource("idle-in"))
        start, staged, end = _flow(idle, full_d, last_d, n, now, self.staging_slots, trace,
                                   chunk, last)
        sender_done = staged if plan.mode == "async" else end
        # The first chunk's latencies delay the transfer without holding anything (the
        # wire carries other packets meanwhile); the rest is one flow.
        delay = min(end - start, to_ns(link.latency + 2 * device.copy_latency))
        work = end - start - delay
        copy_busy = (n - 1) * full_d[0] + last_d[0]
        held = ((copy_out, copy_busy, to_ns(device.copy_latency)),
                *((res, link_busy, to_ns(link.latency)) for res in links),
                (copy_in, copy_busy, to_ns(device.copy_latency)))
        if (sender := self._sharing_core(src, dst, nbytes)) is not None:  # Rule 4e
            held += ((sender, round(link_busy * self.cluster.host.shared_copy),
                      to_ns(link.latency)),)
        for res, busy, _ in held:
            res.busy += busy
        if work == 0:  # nothing to share
            return Transfer(nbytes, plan.mode, n, chunk, start, sender_done, link_busy, end=end)
        flow = Flow(tuple((res.name, min(1.0, max(0, busy - latency) / work))
                          for res, busy, latency in held), work, start + delay)
        self._sharing.add(flow)
        moving = self._moving[flow] = Transfer(nbytes, plan.mode, n, chunk, start, sender_done,
                                               link_busy, flow=flow)
        return moving

    def next_event(self) -> int | None:
        """When a transfer on a fair link may next end (or the rates change); None when
        none is moving."""
        return self._sharing.next_time()

    def advance(self, now: int) -> list[Transfer]:
        """Move the fair links' flows on to ``now``; return the transfers that ended by
        then (their ``end`` now set), in the order they ended."""
        return [self._ended(flow) for flow in self._sharing.advance(now)]

    def settle(self) -> list[Transfer]:
        """Run every transfer to its end (as if no other were started); return them in
        the order they ended."""
        return [self._ended(flow) for flow in self._sharing.advance()]

    def _ended(self, flow: Flow) -> Transfer:
        moving = self._moving.pop(flow)
        moving.end = flow.finish
        return moving

    def _durations(self, nbytes: int, link: LinkSpec, src: int,
                   dst: int) -> tuple[int, int, int]:
        device = self.cluster.device
        copy = device.copy_latency + nbytes / device.copy_bandwidth
        crowded = self._crowded_link(src, dst)  # Rule 4b
        faults = self.faults
        if faults is None:
            ns = to_ns(copy)
            return ns, to_ns(link.stage_time(nbytes, crowded)), ns
        return (to_ns(copy * faults.slowdown(src)), to_ns(link.stage_time(nbytes, crowded)),
                to_ns(copy * faults.slowdown(dst)))

    def control(self, src: int, dst: int, *, now: int) -> int:
        """When a control message (RTS/CTS) sent at ``now`` arrives: one link latency later
        (it takes no bandwidth and holds nothing); at once for the same rank.

        Raises:
            TypeError, ValueError: as ``transfer``.
        """
        self._rank("src", src)
        self._rank("dst", dst)
        _int("now", now, 0)
        if src == dst:
            return now
        if self.faults is not None:
            now = self.faults.depart(src, dst, now)
            if now >= HELD:
                return HELD
        return now + to_ns(self.cluster.link(src, dst).latency)

    def compute_ns(self, rank: int, *, seconds: float | None = None,
                   flops: float | None = None) -> int:
        """How long a compute task of ``seconds``, or of ``flops`` at the device's rate, takes.

        Raises:
            TypeError: neither or both of ``seconds``/``flops``, or not a number.
            ValueError: a negative or non-finite amount, a bad rank.
        """
        self._rank("rank", rank)
        if (seconds is None) == (flops is None):
            raise TypeError("compute takes exactly one of seconds= or flops=")
        name, amount = ("seconds", seconds) if seconds is not None else ("flops", flops)
        if isinstance(amount, bool) or not isinstance(amount, int | float):
            raise TypeError(f"{name} must be a number, got {type(amount).__name__}")
        if not (math.isfinite(amount) and amount >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {amount}")
        return to_ns(amount if seconds is not None else amount / self.cluster.device.flops)

    def link_busy(self, rank: int) -> int:
        """Ns of link time held by transfers from ``rank``.

        Raises:
            TypeError, ValueError: a bad rank.
        """
        return self._link_busy[self._rank("rank", rank)]


def _flow(stages: tuple[Resource, tuple[Resource, ...], Resource],
          full: tuple[int, int, int], last: tuple[int, int, int], n: int, now: int,
          slots: int, trace: list[ChunkTiming] | None, chunk: int,
          last_bytes: int) -> tuple[int, int, int]:
    """Push ``n`` chunks through the three stages (Rules 1-3); return (first start, last
    copy-out end, last copy-in end) and leave each resource free at its last chunk's end."""
    res1, links, res3 = stages
    # e1, e2, e3: when each stage last became free (our previous chunk, or earlier uses)
    e1 = max(now, res1.free_at)
    e2 = max(now, *(r.free_at for r in links))
    e3 = max(now, res3.free_at)
    w2: deque[int] = deque(maxlen=slots)  # link ends of the last `slots` chunks
    w3: deque[int] = deque(maxlen=slots)  # copy-in ends of the last `slots` chunks
    d1, d2, d3 = full
    start = period = -1
    streak = i = 0
    while i < n:
        if i == n - 1:
            d1, d2, d3 = last
        s1 = e1 if len(w2) < slots else max(e1, w2[0])
        n1 = s1 + d1
        s2 = max(n1, e2) if len(w3) < slots else max(n1, e2, w3[0])
        n2 = s2 + d2
        n3 = max(n2, e3) + d3
        if i == 0:
            start = s1
        if trace is not None:
            trace.append(ChunkTiming(i, chunk if i < n - 1 else last_bytes, (s1, n1), (s2, n2),
                                     (n3 - d3, n3)))
        elif i > 0 and n1 - e1 == n2 - e2 == n3 - e3:
            streak = streak + 1 if n1 - e1 == period else 1
            period = n1 - e1
        else:
            streak = 0
        e1, e2, e3 = n1, n2, n3
        w2.append(n2)
        w3.append(n3)
        i += 1
        if streak > slots and i < n - 1:
            # Steady state: the state (e1, w2, w3) moved by `period` in every component for a
            # whole window, and the step is shift-invariant, so each remaining full chunk
            # moves it by `period` again.
            shift = (n - 1 - i) * period
            e1, e2, e3 = e1 + shift, e2 + shift, e3 + shift
            w2 = deque((t + shift for t in w2), maxlen=slots)
            w3 = deque((t + shift for t in w3), maxlen=slots)
            i = n - 1
    res1.free_at, res3.free_at = e1, e3
    res1.busy += (n - 1) * full[0] + last[0]
    res3.busy += (n - 1) * full[2] + last[2]
    for res in links:
        res.free_at = e2
        res.busy += (n - 1) * full[1] + last[1]
    return start, e1, e3
