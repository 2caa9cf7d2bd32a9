"""What a modelled cluster is made of: links, devices, placement, and presets.

A ``Cluster`` says where each rank lives and which link a transfer between two ranks uses;
``asynccomm.sim.model`` turns that into time.  Placement is fixed and simple: rank ``r``
lives on node ``r // ranks_per_node`` at local index ``r % ranks_per_node``, and a node's
devices are split into ``groups_per_node`` equal groups (Ascend 910 servers: two groups of
four).  A transfer between two ranks is

- ``"self"``: the same rank (a device copy, no link);
- ``"intra"``: the same node and group, over ``intra`` (HCCS, NVLink);
- ``"cross_group"``: the same node, different groups, over ``cross_group`` (PCIe);
- ``"inter"``: different nodes, over ``inter`` (RoCE, InfiniBand), one NIC per device.

Presets use published figures; each preset function's docstring cites its sources and says
which numbers are assumptions.  Bandwidths are bytes/s, latencies seconds, sizes bytes.
"""

from __future__ import annotations

import copy
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .host import HostSpec

__all__ = ["LINK_KINDS", "SHARING", "Cluster", "DeviceSpec", "LinkSpec", "ascend910", "ascend910b",
           "nvlink4", "roce100g", "to_ns"]

#: How a link is shared by concurrent transfers (``LinkSpec.sharing``).
SHARING = ("fair", "fifo")
#: Every value ``Cluster.link_kind`` returns.
LINK_KINDS = ("self", "intra", "cross_group", "inter")

GB = 1e9
GiB = 1 << 30
#: RoCE v2 payload fraction at a 4096-byte MTU: per packet 82 bytes of preamble, inter-frame
#: gap, Ethernet, IPv4, UDP, BTH, ICRC and FCS.
ROCE_EFFICIENCY = 4096 / (4096 + 82)
#: InfiniBand payload fraction at a 4096-byte MTU: LRH 8 + BTH 12 + ICRC 4 + VCRC 2 bytes.
IB_EFFICIENCY = 4096 / (4096 + 26)


def to_ns(seconds: float) -> int:
    """Seconds as integer nanoseconds, rounded up so no cost is ever rounded away, except
    that a value within float error of an integer is that integer (2e-6 s is 2000 ns)."""
    t = seconds * 1e9
    r = round(t)
    if abs(t - r) <= 1e-9 * max(1.0, t):
        return int(r)
    return math.ceil(t)


def _number(owner: str, field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{owner} {field} must be a number, got {type(value).__name__}")
    return float(value)


def _positive(owner: str, field: str, value: object, unit: str) -> None:
    """> 0; infinity allowed (an infinitely fast stage costs only its latency)."""
    if not _number(owner, field, value) > 0:  # also rejects NaN
        raise ValueError(f"{owner} {field} must be > 0 {unit}, got {value!r}")


def _nonnegative_finite(owner: str, field: str, value: object, unit: str) -> None:
    v = _number(owner, field, value)
    if not (v >= 0 and math.isfinite(v)):
        raise ValueError(f"{owner} {field} must be finite and >= 0 {unit}, got {value!r}")


def _name(owner: str, value: object) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{owner} name must be a str, got {type(value).__name__}")
    if not value:
        raise ValueError(f"{owner} name must not be empty")


def _check_int(field: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{field} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{field} must be >= {minimum}, got {value}")
    return value


def _segments(segments: object, field: str) -> None:
    """Check a ``LinkSpec`` field of measured segments (see ``LinkSpec.segments``)."""
    if not isinstance(segments, tuple):
        raise TypeError(f"LinkSpec {field} must be a tuple, got {type(segments).__name__}")
    last = -1
    for segment in segments:
        if not (isinstance(segment, tuple) and len(segment) == 3):
            raise TypeError(f"a LinkSpec segment is (up_to_bytes, latency, bandwidth), "
                            f"got {segment!r}")
        up_to, latency, bandwidth = segment
        if _check_int("segment up_to_bytes", up_to, 0) <= last:
            raise ValueError(f"LinkSpec {field} must be in increasing size, got "
                             f"{up_to} after {last}")
        _positive("LinkSpec", "segment bandwidth", bandwidth, "bytes/s")
        if last < 0:  # the first: a message of 0 bytes takes its latency
            _nonnegative_finite("LinkSpec", "segment latency", latency, "seconds")
        elif not (math.isfinite(_number("LinkSpec", "segment latency", latency))
                  and latency + (last + 1) / bandwidth > 0):
            raise ValueError(f"LinkSpec segment latency must be finite, and leave a time "
                             f"> 0 at the segment's smallest size ({last + 1} B), got "
                             f"{latency!r}")
        last = up_to


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """A link type: line rate, per-message latency, the achievable fraction of the rate,
    and how concurrent transfers share it.

    Raises:
        TypeError: a field of the wrong type.
        ValueError: ``bandwidth`` <= 0, ``latency`` < 0 or infinite, ``efficiency``
            outside (0, 1], ``sharing`` not one of ``SHARING``.
    """

    name: str
    bandwidth: float  # bytes/s, line rate
    latency: float  # seconds per message or chunk (alpha)
    efficiency: float = 1.0  # achievable fraction of the line rate (protocol overhead)
    #: How concurrent transfers use the link: ``"fair"`` (they share its bandwidth max-min
    #: fairly, as packets of several flows interleave on a wire) or ``"fifo"`` (one at a
    #: time in the order they were planned, as a DMA engine serialises its descriptors).
    sharing: str = "fair"
    #: Measured piecewise alpha-beta costs, as SMPI's: ``(up_to_bytes, latency,
    #: bandwidth)`` in increasing ``up_to_bytes``, the last one covering every larger
    #: size.  A stage of n bytes then takes the first segment with n <= up_to_bytes's
    #: latency + n / bandwidth (``stage_time``) instead of ``latency + n /
    #: effective_bandwidth``; the fields above still time control messages.  A segment
    #: past the first is a line over its sizes only: its latency (the line's intercept)
    #: may be below 0 where its time grows faster than in proportion to the size (out of
    #: a cache), as long as its time at its smallest size is above 0.
    segments: tuple[tuple[int, float, float], ...] = ()
    #: Measured segments, as ``segments``, of a link whose node runs more ranks than its
    #: host has cores (``HostSpec.cores``; ``sim/model.py`` Rule 4b): there a transfer is
    #: copied by one process, where two processes on cores of their own may copy a large
    #: one together (the shared-memory link does from 256 KiB: a 4 MiB message took twice
    #: as long on 3 processes of a 2-core machine as on 2).  Empty: ``segments`` there too.
    crowded: tuple[tuple[int, float, float], ...] = ()

    def __post_init__(self) -> None:
        _name("LinkSpec", self.name)
        _positive("LinkSpec", "bandwidth", self.bandwidth, "bytes/s")
        _nonnegative_finite("LinkSpec", "latency", self.latency, "seconds")
        if not 0 < _number("LinkSpec", "efficiency", self.efficiency) <= 1:
            raise ValueError(f"LinkSpec efficiency must be in (0, 1], got {self.efficiency!r}")
        if self.sharing not in SHARING:
            raise ValueError(f"LinkSpec sharing must be one of {', '.join(SHARING)}, "
                             f"got {self.sharing!r}")
        _segments(self.segments, "segments")
        _segments(self.crowded, "crowded")

    def stage_time(self, nbytes: int, crowded: bool = False) -> float:
        """Seconds a stage of ``nbytes`` holds the link: its segment's latency + nbytes /
        bandwidth (``crowded``: of the ``crowded`` segments, if any), or without segments
        latency + nbytes / effective bandwidth."""
        segments = self.crowded if crowded and self.crowded else self.segments
        for up_to, latency, bandwidth in segments:
            if nbytes <= up_to:
                return latency + nbytes / bandwidth
        if segments:
            _, latency, bandwidth = segments[-1]
            return latency + nbytes / bandwidth
        return self.latency + nbytes / self.effective_bandwidth

    @property
    def effective_bandwidth(self) -> float:
        """Bytes/s that payload can actually move at: line rate x efficiency."""
        return self.bandwidth * self.efficiency


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """An accelerator: compute rate, memory, and the copy engine that stages transfers.

    Raises:
        TypeError: a field of the wrong type.
        ValueError: ``flops`` or ``copy_bandwidth`` <= 0, ``memory`` < 1, ``copy_latency``
            < 0 or infinite.
    """

    name: str
    flops: float  # FLOP/s, dense, in the precision the preset names
    memory: int  # bytes
    copy_bandwidth: float  # bytes/s, user buffer <-> staging buffer
    copy_latency: float = 0.0  # seconds per copy

    def __post_init__(self) -> None:
        _name("DeviceSpec", self.name)
        _positive("DeviceSpec", "flops", self.flops, "FLOP/s")
        _check_int("DeviceSpec memory", self.memory)
        _positive("DeviceSpec", "copy_bandwidth", self.copy_bandwidth, "bytes/s")
        _nonnegative_finite("DeviceSpec", "copy_latency", self.copy_latency, "seconds")


class Cluster:
    """Nodes of devices joined by links, and where each rank lives (see module docs).

    Args:
        nodes: number of nodes; None for as many as the world needs (``fit`` adds them).
        devices_per_node: devices (accelerators) per node.
        intra: the link between two devices of one group.
        inter: the link between nodes (one NIC per device); None for a one-node cluster.
        device: the device every rank runs on.
        groups_per_node: equal groups a node's devices are split into.
        cross_group: the link between groups of one node (needed when there are groups).
        ranks_per_node: ranks placed on each node (default: one per device).
        switched_intra: True when ``intra`` is a switch port per device shared by all its
            peers (NVSwitch), False for a dedicated link per device pair (HCCS full mesh).
        shared_intra: True when every ``intra`` transfer of a node crosses one resource (a
            bus; or one CPU moving every message, as in-process ranks on one event loop).
        name: shown in messages and device names.
        host: the CPU work of collective calls and the cores ranks share
            (``asynccomm.sim.host``); None costs nothing.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: a count below 1, groups that do not divide the devices, more ranks per
            node than devices, a missing ``cross_group`` or ``inter`` link that is needed.
    """

    __slots__ = ("cross_group", "device", "devices_per_node", "fixed", "groups_per_node",
                 "host", "inter", "intra", "name", "nodes", "ranks_per_node", "shared_intra",
                 "switched_intra")

    def __init__(self, *, nodes: int | None, devices_per_node: int, intra: LinkSpec,
                 inter: LinkSpec | None, device: DeviceSpec, groups_per_node: int = 1,
                 cross_group: LinkSpec | None = None, ranks_per_node: int | None = None,
                 switched_intra: bool = False, shared_intra: bool = False,
                 name: str = "custom", host: HostSpec | None = None) -> None:
        _name("Cluster", name)
        if host is not None and not isinstance(host, HostSpec):
            raise TypeError(f"host must be a HostSpec or None, got {type(host).__name__}")
        self.host = host if host is not None else HostSpec()
        self.fixed = nodes is not None
        self.nodes = _check_int("nodes", 1 if nodes is None else nodes)
        self.devices_per_node = _check_int("devices_per_node", devices_per_node)
        self.groups_per_node = _check_int("groups_per_node", groups_per_node)
        for field, value, optional in (("intra", intra, False), ("inter", inter, True),
                                       ("cross_group", cross_group, True)):
            if not isinstance(value, LinkSpec) and not (optional and value is None):
                raise TypeError(f"{field} must be a LinkSpec{' or None' if optional else ''}, "
                                f"got {type(value).__name__}")
        if not isinstance(device, DeviceSpec):
            raise TypeError(f"device must be a DeviceSpec, got {type(device).__name__}")
        if devices_per_node % groups_per_node:
            raise ValueError(f"groups_per_node ({groups_per_node}) must divide "
                             f"devices_per_node ({devices_per_node})")
        if groups_per_node > 1 and cross_group is None:
            raise ValueError(f"groups_per_node={groups_per_node} needs a cross_group link")
        rpn = (devices_per_node if ranks_per_node is None
               else _check_int("ranks_per_node", ranks_per_node))
        if rpn > devices_per_node:
            raise ValueError(f"ranks_per_node ({rpn}) must be <= devices_per_node "
                             f"({devices_per_node}): one rank per device")
        if self.nodes > 1 and inter is None:
            raise ValueError(f"a cluster of {self.nodes} nodes needs an inter link")
        self.ranks_per_node = rpn
        self.intra, self.inter, self.cross_group = intra, inter, cross_group
        self.device = device
        self.switched_intra = bool(switched_intra)
        self.shared_intra = bool(shared_intra)
        self.name = name

    # -- presets --------------------------------------------------------------------------

    @classmethod
    def preset(cls, name: str, *, nodes: int | None = None,
               ranks_per_node: int | None = None) -> Cluster:
        """A cluster of published hardware (``Cluster.presets()`` lists them).

        With ``nodes=None`` the cluster grows to fit the world (``fit``); with a number it
        is fixed and a larger world is an error.

        Raises:
            ValueError: unknown name, or a bad ``nodes``/``ranks_per_node``.
        """
        builder = _PRESETS.get(name) if isinstance(name, str) else None
        if builder is None:
            raise ValueError(f"unknown cluster preset {name!r}; "
                             f"choose one of: {', '.join(cls.presets())}")
        return builder(nodes, ranks_per_node)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Cluster:
        """A cluster from a preset file (JSON) as ``python -m asynccomm.sim.calibrate``
        writes: ``{"name", "nodes", "devices_per_node", "intra": {LinkSpec fields},
        "device": {DeviceSpec fields}, "shared_intra", ...}`` (``inter`` and
        ``cross_group`` as ``intra``, or null).

        Raises:
            OSError: the file cannot be read.
            ValueError: not a preset (bad JSON, a missing or unknown field).
            TypeError: a field of the wrong type.
        """
        try:
            doc = json.loads(Path(path).read_text(encoding="utf-8"))
            cluster = doc["cluster"] if "cluster" in doc else doc
            links: dict[str, LinkSpec | None] = {}
            for field in ("intra", "inter", "cross_group"):
                spec = cluster.get(field)
                if spec is not None:
                    spec = dict(spec)
                    for key in ("segments", "crowded"):
                        spec[key] = tuple(tuple(seg) for seg in spec.get(key, ()))
                    links[field] = LinkSpec(**spec)
                else:
                    links[field] = None
            intra = links["intra"]
            if intra is None:
                raise KeyError("intra")
            return cls(nodes=cluster.get("nodes"), devices_per_node=cluster["devices_per_node"],
                       intra=intra, inter=links["inter"],
                       cross_group=links["cross_group"], device=DeviceSpec(**cluster["device"]),
                       groups_per_node=cluster.get("groups_per_node", 1),
                       ranks_per_node=cluster.get("ranks_per_node"),
                       switched_intra=cluster.get("switched_intra", False),
                       shared_intra=cluster.get("shared_intra", False),
                       name=cluster.get("name", "custom"),
                       host=HostSpec.from_dict(cluster.get("host") or {}))
        except (KeyError, json.JSONDecodeError, AttributeError) as exc:
            raise ValueError(f"{path}: not a cluster preset ({type(exc).__name__}: {exc})") \
                from exc

    def to_dict(self) -> dict[str, Any]:
        """This cluster as ``load`` reads it (JSON-ready)."""
        def link(spec: LinkSpec | None) -> dict[str, Any] | None:
            return None if spec is None else {
                "name": spec.name, "bandwidth": spec.bandwidth, "latency": spec.latency,
                "efficiency": spec.efficiency, "sharing": spec.sharing,
                "segments": [list(seg) for seg in spec.segments],
                "crowded": [list(seg) for seg in spec.crowded]}
        d = self.device
        return {"name": self.name, "nodes": self.nodes if self.fixed else None,
                "devices_per_node": self.devices_per_node,
                "groups_per_node": self.groups_per_node, "ranks_per_node": self.ranks_per_node,
                "switched_intra": self.switched_intra, "shared_intra": self.shared_intra,
                "intra": link(self.intra), "inter": link(self.inter),
                "cross_group": link(self.cross_group),
                "device": {"name": d.name, "flops": d.flops, "memory": d.memory,
                           "copy_bandwidth": d.copy_bandwidth, "copy_latency": d.copy_latency},
                "host": self.host.to_dict()}

    @staticmethod
    def presets() -> tuple[str, ...]:
        """The preset names, sorted."""
        return tuple(sorted(_PRESETS))

    # -- placement ------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Ranks the cluster can host: nodes x ranks_per_node."""
        return self.nodes * self.ranks_per_node

    def _check_rank(self, rank: object) -> int:
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise TypeError(f"rank must be an int, got {type(rank).__name__}")
        if not 0 <= rank < self.size:
            raise ValueError(f"rank {rank} out of range for cluster {self.name!r} "
                             f"of {self.size} ranks")
        return rank

    def node_of(self, rank: int) -> int:
        """The node rank ``rank`` lives on.

        Raises:
            TypeError, ValueError: ``rank`` is not an int in [0, size).
        """
        return self._check_rank(rank) // self.ranks_per_node

    def group_of(self, rank: int) -> int:
        """The device group (within its node) of rank ``rank``.

        Raises:
            TypeError, ValueError: as ``node_of``.
        """
        local = self._check_rank(rank) % self.ranks_per_node
        return local // (self.devices_per_node // self.groups_per_node)

    def link_kind(self, src: int, dst: int) -> str:
        """How ``src`` reaches ``dst``: one of ``LINK_KINDS``.

        Raises:
            TypeError, ValueError: as ``node_of``.
        """
        if self.node_of(src) != self.node_of(dst):
            return "inter"
        if src == dst:
            return "self"
        return "intra" if self.group_of(src) == self.group_of(dst) else "cross_group"

    def link(self, src: int, dst: int) -> LinkSpec:
        """The link a transfer from ``src`` to ``dst`` uses (``intra`` for the same rank,
        nominally: a same-rank transfer is a device copy and holds no link).

        Raises:
            TypeError, ValueError: as ``node_of``.
        """
        kind = self.link_kind(src, dst)
        link = {"inter": self.inter, "cross_group": self.cross_group}.get(kind, self.intra)
        assert link is not None  # __init__ insists on the links its shape needs
        return link

    def fit(self, world_size: int) -> Cluster:
        """This cluster if ``world_size`` ranks fit, else (when ``nodes`` was not given) a
        copy with just enough nodes.

        Raises:
            TypeError: ``world_size`` is not an int.
            ValueError: ``world_size`` < 1, a fixed cluster too small for it, or more than
                one node needed without an inter link.
        """
        _check_int("world_size", world_size)
        if world_size <= self.size:
            return self
        if self.fixed:
            raise ValueError(f"world_size {world_size} does not fit cluster {self.name!r}: "
                             f"{self.nodes} nodes x {self.ranks_per_node} ranks per node = "
                             f"{self.size} ranks")
        if self.inter is None:
            raise ValueError(f"world_size {world_size} needs more than one node, but cluster "
                             f"{self.name!r} has no inter link")
        grown = copy.copy(self)
        grown.nodes = -(-world_size // self.ranks_per_node)
        return grown

    def __repr__(self) -> str:
        return (f"Cluster({self.name!r}, nodes={self.nodes}{'' if self.fixed else ' (grows)'}, "
                f"devices_per_node={self.devices_per_node}, "
                f"ranks_per_node={self.ranks_per_node}, groups_per_node={self.groups_per_node})")


# -- presets ------------------------------------------------------------------------------


def ascend910(nodes: int | None = None, ranks_per_node: int | None = None) -> Cluster:
    """Atlas 800 training servers (model 9000): 8 Ascend 910 NPUs per server.

    Sources: Huawei's Atlas 900 launch (2019-09): Ascend 910 256 TFLOPS FP16, servers
    joined by HCCS, PCIe 4.0 and 100G Ethernet; Huawei Cloud CCE "Ascend HCCS-interconnected
    NPU affinity": eight chips per server in two groups of four, HCCS inside a group, a PCIe
    switch between them; Ascend training docs: devices 0-3 and 4-7 form separate networks,
    one 100GE RoCE port per NPU.  Ascend 910: 32 GB HBM2.

    Assumptions: HCCS 18 GB/s and PCIe 20 GB/s per direction between two cards (the
    project's design figures, not a datasheet's); RoCE efficiency 4096/4178 (header
    overhead at a 4096-byte MTU); latencies (HCCS 2 us, PCIe switch 3 us, RoCE 2 us, copy
    1 us); copy engine 600 GB/s (half of the ~1.2 TB/s HBM2 usually reported: a copy reads
    and writes).
    """
    return Cluster(
        nodes=nodes, devices_per_node=8, groups_per_node=2, ranks_per_node=ranks_per_node,
        intra=LinkSpec("hccs", 18 * GB, 2e-6),
        cross_group=LinkSpec("pcie4", 20 * GB, 3e-6),
        inter=LinkSpec("roce100g", 12.5 * GB, 2e-6, ROCE_EFFICIENCY),
        device=DeviceSpec("ascend910", 256e12, 32 * GiB, 600 * GB, 1e-6),
        name="ascend910")


def ascend910b(nodes: int | None = None, ranks_per_node: int | None = None) -> Cluster:
    """Atlas 800T A2 training servers: 8 Ascend 910B NPUs in an HCCS full mesh.

    Sources: Huawei Atlas 800T A2 product page (8 NPUs, 8 x 200GE RoCE ports, one per NPU;
    64 GB HBM per NPU); Ascend docs (Atlas A2: any 1-8 NPUs of a server form one network,
    i.e. a full mesh).  HCCS 28 GB/s per direction per pair; 200G RoCE = 25 GB/s line
    rate.

    Assumptions: 313 TFLOPS FP16 (a widely reported third-party figure; Huawei publishes no
    per-chip number for the 910B); RoCE efficiency 4096/4178; latencies (HCCS 2 us, RoCE
    2 us, copy 1 us); copy engine 800 GB/s (half of the ~1.6 TB/s HBM2e usually reported).
    """
    return Cluster(
        nodes=nodes, devices_per_node=8, ranks_per_node=ranks_per_node,
        intra=LinkSpec("hccs", 28 * GB, 2e-6),
        inter=LinkSpec("roce200g", 25 * GB, 2e-6, ROCE_EFFICIENCY),
        device=DeviceSpec("ascend910b", 313e12, 64 * GiB, 800 * GB, 1e-6),
        name="ascend910b")


def roce100g(nodes: int | None = None, ranks_per_node: int | None = None) -> Cluster:
    """One NPU per host on 100 Gb/s RoCE v2, staging through host memory: a published
    setup (8 NPUs with 32 GB each on 100G RoCE) with every transfer crossing three
    balanced stages (device -> host staging, wire, host staging -> device).

    Sources: IEEE 802.3 100GBASE (100 Gb/s = 12.5 GB/s line rate); RoCE v2 (InfiniBand
    Architecture Specification Annex A17) headers give efficiency 4096/4178 at a 4096-byte
    MTU; Ascend 910 256 TFLOPS FP16, 32 GB (Huawei Atlas 900 launch).

    Assumptions: staging copies over PCIe at the wire's effective rate (~12.25 GB/s, what a
    PCIe 3.0 x16 DMA reaches in practice), so the three stages are balanced, the case where
    pipelining can approach its 3x; latencies (RoCE 2 us, copy 1 us).  A published claim of
    "35.4 GB/s over 100G RoCE" is 2.8x this link's line rate: impossible here.
    """
    link = LinkSpec("roce100g", 12.5 * GB, 2e-6, ROCE_EFFICIENCY)
    return Cluster(
        nodes=nodes, devices_per_node=1, ranks_per_node=ranks_per_node,
        intra=link,  # unused: one device per host, so ranks on one host are the same rank
        inter=link,
        device=DeviceSpec("npu-host-staged", 256e12, 32 * GiB, link.effective_bandwidth, 1e-6),
        name="roce100g")


def nvlink4(nodes: int | None = None, ranks_per_node: int | None = None) -> Cluster:
    """DGX/HGX H100: 8 H100 SXM GPUs per node on NVSwitch, 400 Gb/s InfiniBand NDR.

    Sources: NVIDIA H100 Tensor Core GPU datasheet (SXM: 989 TFLOPS BF16 dense, 80 GB HBM3,
    3.35 TB/s, NVLink 900 GB/s = 450 GB/s per direction); NVIDIA DGX H100 user guide (8 x
    ConnectX-7 400 Gb/s NDR, one per GPU; 50 GB/s line rate each).

    Assumptions: NVSwitch is a port per GPU shared by all its peers (``switched_intra``);
    NVLink efficiency 0.94 (one 16-byte header flit per 256-byte payload); IB efficiency
    4096/4122 (LRH, BTH, ICRC, VCRC at a 4096-byte MTU); latencies (NVLink 1 us, IB 1.5 us,
    copy 1 us); copy engine 1.6 TB/s (half of HBM3: a copy reads and writes).
    """
    return Cluster(
        nodes=nodes, devices_per_node=8, ranks_per_node=ranks_per_node, switched_intra=True,
        intra=LinkSpec("nvlink4", 450 * GB, 1e-6, 0.94),
        inter=LinkSpec("ib-ndr", 50 * GB, 1.5e-6, IB_EFFICIENCY),
        device=DeviceSpec("h100-sxm", 989e12, 80 * GiB, 1600 * GB, 1e-6),
        name="nvlink4")


_PRESETS: dict[str, Callable[[int | None, int | None], Cluster]] = {
    "ascend910": ascend910, "ascend910b": ascend910b, "nvlink4": nvlink4,
    "roce100g": roce100g,
}
