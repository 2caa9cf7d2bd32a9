"""Cluster: placement, link kinds, presets and their sources, fit(), validation, purity."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from asynccomm.sim import Cluster, DeviceSpec, LinkSpec
from asynccomm.sim import cluster as cluster_module
from asynccomm.sim.cluster import LINK_KINDS, to_ns

LINK = LinkSpec("l", 10e9, 1e-6)
DEVICE = DeviceSpec("d", 1e12, 1 << 30, 100e9)


def exact(message: str) -> str:
    return "^" + re.escape(message) + "$"


def make(**overrides: Any) -> Cluster:
    kwargs: dict[str, Any] = {"nodes": 2, "devices_per_node": 4, "intra": LINK,
                              "inter": LINK, "device": DEVICE}
    kwargs.update(overrides)
    return Cluster(**kwargs)


# -- placement and link kinds -------------------------------------------------------------

@pytest.mark.parametrize(
    ("preset", "src", "dst", "kind", "link", "nodes"),
    [
        ("ascend910", 0, 3, "intra", "hccs", (0, 0)),
        ("ascend910", 4, 7, "intra", "hccs", (0, 0)),
        ("ascend910", 3, 4, "cross_group", "pcie4", (0, 0)),
        ("ascend910", 7, 0, "cross_group", "pcie4", (0, 0)),
        ("ascend910", 12, 8, "cross_group", "pcie4", (1, 1)),
        ("ascend910", 13, 15, "intra", "hccs", (1, 1)),
        ("ascend910", 0, 8, "inter", "roce100g", (0, 1)),
        ("ascend910", 5, 5, "self", "hccs", (0, 0)),
        ("ascend910b", 0, 7, "intra", "hccs", (0, 0)),
        ("ascend910b", 3, 4, "intra", "hccs", (0, 0)),
        ("ascend910b", 7, 8, "inter", "roce200g", (0, 1)),
        ("roce100g", 0, 1, "inter", "roce100g", (0, 1)),
        ("roce100g", 5, 2, "inter", "roce100g", (5, 2)),
        ("nvlink4", 0, 7, "intra", "nvlink4", (0, 0)),
        ("nvlink4", 15, 0, "inter", "ib-ndr", (1, 0)),
    ],
)
def test_placement_and_link_kinds(preset: str, src: int, dst: int, kind: str, link: str,
                                  nodes: tuple[int, int]) -> None:
    cluster = Cluster.preset(preset).fit(16)
    assert (cluster.node_of(src), cluster.node_of(dst)) == nodes
    assert cluster.link_kind(src, dst) == kind
    assert cluster.link(src, dst).name == link
    assert kind in LINK_KINDS


def test_ascend910_groups_split_each_server_in_two_fours() -> None:
    cluster = Cluster.preset("ascend910", nodes=2)
    assert [cluster.group_of(r) for r in range(16)] == [0] * 4 + [1] * 4 + [0] * 4 + [1] * 4
    assert cluster.link(0, 4) is cluster.cross_group
    assert cluster.cross_group is not None and cluster.cross_group.bandwidth == 20e9
    assert cluster.link(0, 8) is cluster.inter


def test_ranks_per_node_places_ranks_on_the_first_devices() -> None:
    cluster = Cluster.preset("ascend910", nodes=3, ranks_per_node=4)
    assert cluster.size == 12
    assert [cluster.node_of(r) for r in range(12)] == [0] * 4 + [1] * 4 + [2] * 4
    assert cluster.link_kind(0, 3) == "intra"  # devices 0-3: one HCCS group
    assert cluster.link_kind(3, 4) == "inter"


@pytest.mark.parametrize(
    ("name", "intra", "inter", "cross", "flops", "memory"),
    [
        ("ascend910", 18e9, 12.5e9, 20e9, 256e12, 32 << 30),
        ("ascend910b", 28e9, 25e9, None, 313e12, 64 << 30),
        ("roce100g", 12.5e9, 12.5e9, None, 256e12, 32 << 30),
        ("nvlink4", 450e9, 50e9, None, 989e12, 80 << 30),
    ],
)
def test_preset_figures(name: str, intra: float, inter: float, cross: float | None,
                        flops: float, memory: int) -> None:
    c = Cluster.preset(name)
    assert c.intra.bandwidth == intra
    assert c.inter is not None and c.inter.bandwidth == inter
    assert (c.cross_group.bandwidth if c.cross_group else None) == cross
    assert (c.device.flops, c.device.memory) == (flops, memory)


@pytest.mark.parametrize("name", Cluster.presets())
def test_presets_cite_sources_and_have_microsecond_latencies(name: str) -> None:
    doc = getattr(cluster_module, name).__doc__ or ""
    assert "Sources:" in doc and "Assumptions:" in doc
    c = Cluster.preset(name)
    links = [c.intra, c.inter, c.cross_group]
    for link in (x for x in links if x is not None):
        assert 0 < link.latency <= 5e-6
        assert link.effective_bandwidth <= link.bandwidth
    assert 0 < c.device.copy_latency <= 5e-6
    assert c.name == name


def test_roce100g_is_a_balanced_three_stage_path() -> None:
    c = Cluster.preset("roce100g")
    assert c.inter is not None
    assert c.device.copy_bandwidth == pytest.approx(c.inter.effective_bandwidth)
    assert c.inter.bandwidth == 12.5e9 < 35.4e9  # a published figure is impossible
    assert c.ranks_per_node == 1


def test_presets_are_listed_sorted() -> None:
    assert Cluster.presets() == ("ascend910", "ascend910b", "nvlink4", "roce100g")


# -- fit ----------------------------------------------------------------------------------

def test_fit_grows_a_cluster_without_a_node_count() -> None:
    base = Cluster.preset("ascend910b")
    assert (base.nodes, base.size, base.fixed) == (1, 8, False)
    assert base.fit(8) is base
    grown = base.fit(20)
    assert (grown.nodes, grown.size, grown.fixed) == (3, 24, False)
    assert (base.nodes, base.size) == (1, 8)  # the original is untouched
    assert Cluster.preset("roce100g").fit(64).nodes == 64


def test_fit_refuses_a_fixed_cluster_too_small() -> None:
    fixed = Cluster.preset("ascend910b", nodes=2)
    assert fixed.fit(16) is fixed
    with pytest.raises(ValueError, match=exact(
            "world_size 17 does not fit cluster 'ascend910b': 2 nodes x 8 ranks per node = "
            "16 ranks")):
        fixed.fit(17)


def test_fit_needs_an_inter_link_for_more_nodes() -> None:
    single = make(nodes=None, inter=None)
    assert single.fit(4) is single
    with pytest.raises(ValueError, match=exact(
            "world_size 5 needs more than one node, but cluster 'custom' has no inter link")):
        single.fit(5)


@pytest.mark.parametrize(("world", "exc", "message"), [
    (0, ValueError, "world_size must be >= 1, got 0"),
    (2.0, TypeError, "world_size must be an int, got float"),
    (True, TypeError, "world_size must be an int, got bool"),
])
def test_fit_rejects_bad_world_sizes(world: object, exc: type[Exception], message: str) -> None:
    with pytest.raises(exc, match=exact(message)):
        make().fit(world)  # type: ignore[arg-type]


# -- validation ---------------------------------------------------------------------------

@pytest.mark.parametrize(("overrides", "exc", "message"), [
    ({"nodes": 0}, ValueError, "nodes must be >= 1, got 0"),
    ({"nodes": 1.5}, TypeError, "nodes must be an int, got float"),
    ({"devices_per_node": 0}, ValueError, "devices_per_node must be >= 1, got 0"),
    ({"groups_per_node": 0}, ValueError, "groups_per_node must be >= 1, got 0"),
    ({"groups_per_node": 3, "cross_group": LINK}, ValueError,
     "groups_per_node (3) must divide devices_per_node (4)"),
    ({"groups_per_node": 2}, ValueError, "groups_per_node=2 needs a cross_group link"),
    ({"ranks_per_node": 5}, ValueError,
     "ranks_per_node (5) must be <= devices_per_node (4): one rank per device"),
    ({"ranks_per_node": 0}, ValueError, "ranks_per_node must be >= 1, got 0"),
    ({"inter": None}, ValueError, "a cluster of 2 nodes needs an inter link"),
    ({"intra": None}, TypeError, "intra must be a LinkSpec, got NoneType"),
    ({"inter": "roce"}, TypeError, "inter must be a LinkSpec or None, got str"),
    ({"cross_group": 1}, TypeError, "cross_group must be a LinkSpec or None, got int"),
    ({"device": "npu"}, TypeError, "device must be a DeviceSpec, got str"),
    ({"name": ""}, ValueError, "Cluster name must not be empty"),
    ({"name": 3}, TypeError, "Cluster name must be a str, got int"),
])
def test_cluster_validation(overrides: dict[str, Any], exc: type[Exception],
                            message: str) -> None:
    with pytest.raises(exc, match=exact(message)):
        make(**overrides)


@pytest.mark.parametrize(("args", "exc", "message"), [
    (("", 1e9, 0.0), ValueError, "LinkSpec name must not be empty"),
    (("l", 0, 0.0), ValueError, "LinkSpec bandwidth must be > 0 bytes/s, got 0"),
    (("l", float("nan"), 0.0), ValueError, "LinkSpec bandwidth must be > 0 bytes/s, got nan"),
    (("l", "fast", 0.0), TypeError, "LinkSpec bandwidth must be a number, got str"),
    (("l", 1e9, -1e-6), ValueError,
     "LinkSpec latency must be finite and >= 0 seconds, got -1e-06"),
    (("l", 1e9, float("inf")), ValueError,
     "LinkSpec latency must be finite and >= 0 seconds, got inf"),
    (("l", 1e9, 0.0, 0.0), ValueError, "LinkSpec efficiency must be in (0, 1], got 0.0"),
    (("l", 1e9, 0.0, 1.5), ValueError, "LinkSpec efficiency must be in (0, 1], got 1.5"),
])
def test_linkspec_validation(args: tuple[Any, ...], exc: type[Exception], message: str) -> None:
    with pytest.raises(exc, match=exact(message)):
        LinkSpec(*args)


@pytest.mark.parametrize(("args", "exc", "message"), [
    (("d", 0, 1, 1e9), ValueError, "DeviceSpec flops must be > 0 FLOP/s, got 0"),
    (("d", 1e12, 0, 1e9), ValueError, "DeviceSpec memory must be >= 1, got 0"),
    (("d", 1e12, 1.0, 1e9), TypeError, "DeviceSpec memory must be an int, got float"),
    (("d", 1e12, 1, -5), ValueError, "DeviceSpec copy_bandwidth must be > 0 bytes/s, got -5"),
    (("d", 1e12, 1, 1e9, -1), ValueError,
     "DeviceSpec copy_latency must be finite and >= 0 seconds, got -1"),
    ((None, 1e12, 1, 1e9), TypeError, "DeviceSpec name must be a str, got NoneType"),
])
def test_devicespec_validation(args: tuple[Any, ...], exc: type[Exception],
                               message: str) -> None:
    with pytest.raises(exc, match=exact(message)):
        DeviceSpec(*args)


def test_infinite_rates_are_allowed() -> None:
    assert DeviceSpec("d", 1e12, 1, float("inf")).copy_bandwidth == float("inf")
    assert LinkSpec("l", float("inf"), 0.0).effective_bandwidth == float("inf")
    assert LinkSpec("l", 10e9, 0.0, 0.5).effective_bandwidth == 5e9


@pytest.mark.parametrize(("call", "exc", "message"), [
    (lambda c: c.node_of(8), ValueError, "rank 8 out of range for cluster 'custom' of 8 ranks"),
    (lambda c: c.link(0, -1), ValueError,
     "rank -1 out of range for cluster 'custom' of 8 ranks"),
    (lambda c: c.link_kind("0", 1), TypeError, "rank must be an int, got str"),
    (lambda c: Cluster.preset("dgx"), ValueError,
     "unknown cluster preset 'dgx'; choose one of: ascend910, ascend910b, nvlink4, roce100g"),
])
def test_bad_ranks_and_names(call: Any, exc: type[Exception], message: str) -> None:
    with pytest.raises(exc, match=exact(message)):
        call(make())


def test_repr_says_whether_it_grows() -> None:
    assert "(grows)" in repr(Cluster.preset("nvlink4"))
    assert "(grows)" not in repr(Cluster.preset("nvlink4", nodes=1))


@pytest.mark.parametrize(("seconds", "ns"), [
    (0.0, 0), (1e-9, 1), (1.5e-9, 2), (2e-6, 2000), (3e-7, 300), (0.1 + 0.2, 300_000_000),
    (1 / 12.5e9, 1), (80e-3, 80_000_000), (2e-6 + 65536 / 12.5e9, 7243),
])
def test_to_ns_rounds_up_but_keeps_integers(seconds: float, ns: int) -> None:
    assert to_ns(seconds) == ns


# -- purity -------------------------------------------------------------------------------

SIM = Path(cluster_module.__file__).parent


@pytest.mark.parametrize("name", ["cluster.py", "faults.py", "host.py", "model.py", "records.py",
                                  "sharing.py"])
def test_pure_modules_import_only_the_standard_library(name: str) -> None:
    """The cost model is sans-IO: no asyncio, numpy or structlog, nothing but the stdlib
    and its own sibling modules."""
    tree = ast.parse((SIM / name).read_text(encoding="utf-8"))
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bad += [a.name for a in node.names if a.name.partition(".")[0]
                    not in sys.stdlib_module_names or a.name.startswith("asyncio")]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level == 1 and mod in {"cluster", "faults", "host", "model", "records",
                                           "sharing"}:
                continue
            if node.level or mod.partition(".")[0] not in sys.stdlib_module_names | {
                    "__future__"} or mod.startswith("asyncio"):
                bad.append(f"{'.' * node.level}{mod}")
    assert bad == []
