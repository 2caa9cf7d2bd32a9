"""Claim 5: adaptive chunking, "16 MB chunks above 10 GB/s, 1 MB below 2 GB/s, 4 MB
otherwise, halved (down to 512 KB) when the latency passes 1 ms".

Against the model's rule, c* = sqrt(S * alpha * B / (k - 1)) (``asynccomm.sim.adaptive_chunk``,
what ``Pipelined()`` uses: alpha the largest stage latency, B the slowest stage's rate, k
the stages weighted by their speed), over sizes and links, and against the best chunk a
sweep finds (four chunk sizes per octave, 16 KiB to the message).  Times are the model's
own plan of one pipelined transfer on an idle path (``ClusterModel.transfer``); a run
through the engine confirms them, plus its two-latency rendezvous handshake.

The article's rule sees only the bandwidth and the latency, not the message size: on a
path whose stages are balanced it picks 16 MB for every size, which leaves a 16 MB
message unpipelined; c* grows with sqrt(S) and stays within a few percent of the best.
"""

from __future__ import annotations

import time
from typing import Any

from asynccomm.sim import (
    ChunkPlan,
    Cluster,
    ClusterModel,
    DeviceSpec,
    LinkSpec,
    Pipelined,
    adaptive_chunk,
)

from ._common import MiB, finish, format_table, parser, progress, size_label
from ._model import Path, geometric, one_transfer

NAME = "chunking"
KiB = 1 << 10
SIZES = (4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB, 1024 * MiB)
ROCE = 4096 / (4096 + 82)


def _custom(name: str, link: LinkSpec, copy: float) -> Cluster:
    return Cluster(nodes=None, devices_per_node=1, intra=link, inter=link,
                   device=DeviceSpec(f"{name}-host", 1e12, 64 << 30, copy, 1e-6), name=name)


def paths() -> dict[str, tuple[Cluster, int, int, int]]:
    """name: (cluster, world size, src, dst).  Two made-up links exercise the article's
    other branches: 10 Gb Ethernet (below 2 GB/s) and 100G RoCE over 400 km (2 ms)."""
    return {
        "roce100g": (Cluster.preset("roce100g"), 2, 0, 1),
        "ascend910 HCCS": (Cluster.preset("ascend910"), 2, 0, 1),
        "ascend910 RoCE": (Cluster.preset("ascend910"), 16, 0, 8),
        "ascend910b RoCE 200G": (Cluster.preset("ascend910b"), 16, 0, 8),
        "nvlink4 NVLink": (Cluster.preset("nvlink4"), 2, 0, 1),
        "10GbE (made up)": (_custom("eth10g", LinkSpec("eth10g", 1.25e9, 20e-6, 0.94), 10e9),
                            2, 0, 1),
        "RoCE 400 km (made up)": (_custom("wan", LinkSpec("wan100g", 12.5e9, 2e-3, ROCE),
                                          12.25e9), 2, 0, 1),
    }


def article_chunk(bandwidth_gib: float, latency_us: float) -> int:
    """The article's ``AdaptiveChunking.AdjustChunkSize``: bandwidth in GiB/s (its
    profiler divides by 1024^3), latency in microseconds."""
    chunk = 4 * MiB
    if bandwidth_gib > 10.0:
        chunk = 16 * MiB
    elif bandwidth_gib < 2.0:
        chunk = 1 * MiB
    if latency_us > 1000:
        chunk = max(chunk // 2, 512 * KiB)
    return chunk


def model_chunk(path: Path, nbytes: int) -> int:
    """c* for this path: ``adaptive_chunk`` with the path's alpha, bottleneck and stages."""
    return adaptive_chunk(nbytes, path.alpha, path.bottleneck, stages=path.stages)


def transfer_s(cluster: Cluster, world: int, src: int, dst: int, nbytes: int,
               chunk: int) -> float:
    plan = ClusterModel(cluster, world).transfer(src, dst, nbytes, now=0,
                                                 plan=ChunkPlan("pipelined", chunk))
    return plan.end * 1e-9


def sweep(cluster: Cluster, world: int, src: int, dst: int, nbytes: int,
          extra: tuple[int, ...] = ()) -> list[tuple[int, float]]:
    """Time of every chunk of a sweep: four per octave from 16 KiB to the message, and
    ``extra`` (so the best is never worse than a chunk we compare with it)."""
    octaves = max(1, (nbytes // (16 * KiB)).bit_length() - 1)
    chunks = sorted({min(nbytes, round(c)) for c in geometric(16 * KiB, nbytes, 1 + 4 * octaves)}
                    | {min(nbytes, c) for c in extra})
    return [(c, transfer_s(cluster, world, src, dst, nbytes, c)) for c in chunks]


def measure(sizes: tuple[int, ...] = SIZES, names: tuple[str, ...] | None = None,
            check_engine: bool = True) -> dict[str, Any]:
    rows = []
    chosen = paths()
    jobs = [(name, n) for name in chosen if names is None or name in names for n in sizes]
    curves: dict[str, list[tuple[int, float]]] = {}
    for name, nbytes in progress(jobs, NAME):
        cluster, world, src, dst = chosen[name]
        path = Path.of(cluster, world, src, dst)
        rule = article_chunk(path.bottleneck / (1 << 30), path.link.latency * 1e6)
        cstar = model_chunk(path, nbytes)
        assert cstar == Pipelined().choose(nbytes, path.link, path.device, world).chunk_bytes
        points = sweep(cluster, world, src, dst, nbytes, (rule, cstar))
        best_chunk, best = min(points, key=lambda p: p[1])
        rule_s = transfer_s(cluster, world, src, dst, nbytes, rule)
        cstar_s = transfer_s(cluster, world, src, dst, nbytes, cstar)
        row = {"path": name, "nbytes": nbytes, "bandwidth_gbps": path.bottleneck / 1e9,
               "latency_us": path.link.latency * 1e6, "stages": path.stages,
               "article_chunk": rule, "article_s": rule_s, "model_chunk": cstar,
               "model_s": cstar_s, "best_chunk": best_chunk, "best_s": best}
        if check_engine and nbytes == min(sizes):
            # the engine moves real bytes at the model's time, plus the handshake
            ran = one_transfer(cluster, nbytes, Pipelined(cstar), world=world, src=src,
                               dst=dst)
            row["engine_s"] = ran
            row["engine_minus_handshake_s"] = ran - path.handshake()
        if nbytes == 256 * MiB:
            curves[name] = points
        rows.append(row)
    return {"rows": rows, "curves": {k: [[c, t] for c, t in v] for k, v in curves.items()}}


def report(data: dict[str, Any]) -> str:
    rows = [[r["path"], size_label(r["nbytes"]), f"{r['bandwidth_gbps']:.3g}",
             f"{r['latency_us']:.3g}", size_label(r["article_chunk"]),
             f"{r['article_s'] * 1e3:.3f}", f"{r['article_s'] / r['best_s'] - 1:+.1%}",
             size_label(r["model_chunk"]), f"{r['model_s'] * 1e3:.3f}",
             f"{r['model_s'] / r['best_s'] - 1:+.1%}", size_label(r["best_chunk"]),
             f"{r['best_s'] * 1e3:.3f}"] for r in data["rows"]]
    table = format_table(
        "One pipelined transfer: the article's chunk rule, the model's c*, and the best "
        "chunk of a sweep (model ms; +x% = slower than the best)",
        ["path", "size", "GB/s", "latency us", "article chunk", "ms", "vs best", "c*", "ms",
         "vs best", "best chunk", "ms"], rows)
    worst_rule = max(data["rows"], key=lambda r: r["article_s"] / r["best_s"])
    worst_model = max(data["rows"], key=lambda r: r["model_s"] / r["best_s"])
    checked = [r for r in data["rows"] if "engine_s" in r]
    off_ns = max((abs(r["engine_minus_handshake_s"] - r["model_s"]) for r in checked),
                 default=0.0) * 1e9
    notes = [f"article's rule: worst {worst_rule['article_s'] / worst_rule['best_s'] - 1:.0%} "
             f"slower than the best ({worst_rule['path']}, {size_label(worst_rule['nbytes'])}: "
             f"{size_label(worst_rule['article_chunk'])} chunks where "
             f"{size_label(worst_rule['best_chunk'])} is best).",
             f"c*: worst {worst_model['model_s'] / worst_model['best_s'] - 1:.1%} slower than "
             f"the best ({worst_model['path']}, {size_label(worst_model['nbytes'])}).",
             "the rule ignores the message size: its chunk is the same for 4 MB and 1 GB; "
             "c* grows with sqrt(size) and with the latency.",
             "the model holds a link for a chunk's latency as well as its bytes (so chunking "
             "has a cost and an optimum); on the 2 ms link that makes the article's halving "
             "of the chunk costly, where a real network with many chunks in flight would "
             "hide much of the latency.",
             f"engine check: {len(checked)} transfers through asynccomm took the planned time "
             f"plus the two-latency handshake, to {off_ns:.0f} ns."]
    return table + "\n" + "\n".join(f"- {n}" for n in notes)


def draw(plt: Any, data: dict[str, Any]) -> Any:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    by = {(r["path"], r["nbytes"]): r for r in data["rows"]}
    for name, points in data["curves"].items():
        r = by[(name, 256 * MiB)]
        (line,) = ax1.plot([c / MiB for c, _ in points], [t / r["best_s"] for _, t in points],
                           "-", label=name, lw=1.2)
        ax1.plot(r["model_chunk"] / MiB, r["model_s"] / r["best_s"], "o", color=line.get_color(),
                 ms=7)
        ax1.plot(r["article_chunk"] / MiB, r["article_s"] / r["best_s"], "x",
                 color=line.get_color(), ms=9, mew=2)
    ax1.set_xscale("log", base=2)
    ax1.set_ylim(0.98, 1.6)
    ax1.set_xlabel("chunk (MiB)")
    ax1.set_ylabel("time / best time")
    ax1.set_title("256 MiB: time against chunk (o = c*, x = article)")
    ax1.legend(fontsize=7)
    names = list(dict.fromkeys(r["path"] for r in data["rows"]))
    worst = {n: (max(r["article_s"] / r["best_s"] for r in data["rows"] if r["path"] == n),
                 max(r["model_s"] / r["best_s"] for r in data["rows"] if r["path"] == n))
             for n in names}
    xs = range(len(names))
    ax2.bar([x - 0.2 for x in xs], [100 * (worst[n][0] - 1) for n in names], 0.4,
            color="tab:red", label="article's rule")
    ax2.bar([x + 0.2 for x in xs], [100 * (worst[n][1] - 1) for n in names], 0.4,
            color="tab:green", label="c* (adaptive_chunk)")
    ax2.set_xticks(list(xs), [n.replace(" (", "\n(").replace(" ", "\n", 1) for n in names],
                   fontsize=7)
    ax2.set_ylabel("worst slowdown vs best chunk (%)")
    ax2.set_title("worst over sizes 4 MiB - 1 GiB")
    ax2.legend(fontsize=8)
    return fig


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser(NAME, __doc__).parse_args(argv)
    started = time.perf_counter()
    data = measure((4 * MiB, 256 * MiB)) if args.quick else measure()
    print(report(data))
    finish(args, NAME, data, draw, started)
    return data


if __name__ == "__main__":
    main()
