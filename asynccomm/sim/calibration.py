"""Piecewise alpha-beta fits of measured message times, and the cluster they describe.

How it works
------------
``fit_segments`` takes (bytes, one-way seconds) points and cuts the sizes into at most
``max_segments`` contiguous segments, each with its own t = alpha + n * beta, as SMPI's
piecewise models do: the break points (where a transport switches from eager to
rendezvous, or out of the cache) are found from the data, not given.

Rule 1 (one segment).  alpha and beta minimise the sum of squared *relative* errors
((alpha + n beta - t) / t)^2, so an 8-byte message counts as much as a 64 MiB one;
beta >= 0 (a negative one is fitted again with it at 0), and the line is >= 0 from the
segment's floor on (0 for the first segment, whose alpha is a latency; for the others,
the size before their first: a line that would pass below 0 there is fitted again
through 0 at it).  A segment past the first is a line over its own sizes only, so its
alpha may be negative: where a message's working set (it and its copy) outgrows the
last cache, its time grows faster than its size, from about 2 MiB to 8 MiB on this
kind of machine, and a line through the origin (alpha clamped to 0, as it was) put a
4 MiB message 40% too dear and an 8 MiB one 20-40% too cheap.
Rule 2 (break points).  For each number of segments k the best cut is found by dynamic
programming over the sorted sizes (each segment at least ``min_points`` points); k is the
fewest whose root-mean-square relative error is within ``tolerance`` (2%: the noise of a
median on a busy machine) or within 10% of the best k's: a segment more must explain
more than noise.  A size in ``breaks`` (the eager limit: past it a message waits for a
clear-to-send, a step of a few microseconds between two sizes 8 bytes apart, which the
fit's error alone would not pay a segment for) always ends a segment, when at least
``min_points`` points lie on either side of it.
Rule 3 (the cluster).  ``calibrated_cluster`` gives one node whose devices are joined by a
link with those segments, free copies (the measured times hold every copy), and zero
control latency (the handshake is in the measured times too): a message of n bytes then
takes exactly its segment's alpha + n beta in the model.  A ``shared`` node (in-process
ranks: one CPU) puts every transfer on one resource, first come first served (``"fifo"``
sharing), which with a host of one core is that core too (``sim/host.py`` Rule 2): one
CPU that copies each message and does the ranks' work in turn.  ``crowded`` segments,
fitted alike on a ping-pong between two ranks of one process more than the cores, time
the link's transfers in a world whose ranks outnumber the host's cores
(``LinkSpec.crowded``).

Nothing here measures: ``python -m asynccomm.calibrate`` does, and writes the preset.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .cluster import Cluster, DeviceSpec, LinkSpec
from .host import HostSpec

__all__ = ["Segment", "calibrated_cluster", "fit_line", "fit_segments", "predict"]


@dataclass(frozen=True, slots=True)
class Segment:
    """t = alpha + n * beta for sizes up to ``up_to`` bytes (inclusive)."""

    up_to: int
    alpha: float  # seconds
    beta: float  # seconds per byte

    @property
    def bandwidth(self) -> float:
        """1 / beta, bytes/s (infinite for beta = 0)."""
        return 1 / self.beta if self.beta > 0 else math.inf


def fit_line(points: Sequence[tuple[int, float]],
             floor: int = 0) -> tuple[float, float, float]:
    """(alpha, beta, sum of squared relative errors) of one segment (Rule 1) of the sizes
    past ``floor`` (the segment before's last; 0 for the first): its line is >= 0 there.

    Raises:
        ValueError: no points, or a time that is not > 0.
    """
    if not points:
        raise ValueError("need at least one point")
    if any(not t > 0 for _, t in points):
        raise ValueError("every time must be > 0")
    # weighted least squares with weights 1/t^2: minimise sum(((a + b n) / t - 1)^2)
    s_11 = sum(1 / t**2 for _, t in points)
    s_1n = sum(n / t**2 for n, t in points)
    s_nn = sum(n * n / t**2 for n, t in points)
    s_1 = sum(1 / t for _, t in points)
    s_n = sum(n / t for n, t in points)
    det = s_11 * s_nn - s_1n**2
    if det > 1e-12 * s_11 * s_nn:
        alpha = (s_1 * s_nn - s_n * s_1n) / det
        beta = (s_11 * s_n - s_1n * s_1) / det
    else:  # one size only: a constant
        alpha, beta = s_1 / s_11, 0.0
    if beta < 0:
        alpha, beta = s_1 / s_11, 0.0
    if alpha + beta * floor < 0:  # the line through (floor, 0)
        beta = max(0.0, sum((n - floor) / t for n, t in points)
                   / sum(((n - floor) / t) ** 2 for n, t in points))
        alpha = -beta * floor
    cost = sum(((alpha + beta * n) / t - 1) ** 2 for n, t in points)
    return alpha, beta, cost


def fit_segments(points: Sequence[tuple[int, float]], *, max_segments: int = 4,
                 min_points: int = 3, tolerance: float = 0.02,
                 breaks: Sequence[int] = ()) -> list[Segment]:
    """The piecewise alpha-beta model of ``points`` (bytes, seconds) (Rules 1-2), a
    segment ending at each of ``breaks``; the last segment's ``up_to`` is the largest
    size measured (larger sizes use it too).

    Raises:
        ValueError: fewer than ``min_points`` points, a size repeated, a time <= 0,
            ``max_segments`` or ``min_points`` < 1.
    """
    if max_segments < 1 or min_points < 1:
        raise ValueError("max_segments and min_points must be >= 1")
    pts = sorted((int(n), float(t)) for n, t in points)
    if len(pts) < min_points:
        raise ValueError(f"need at least {min_points} points, got {len(pts)}")
    if len({n for n, _ in pts}) != len(pts):
        raise ValueError("each size must appear once (give the median of its repeats)")
    m = len(pts)
    # a break splits the points at its index, when both sides can hold a segment
    cuts_at = [i for i in (sum(1 for n, _ in pts if n <= b) for b in breaks)
               if min_points <= i <= m - min_points]
    def floor(i: int) -> int:  # the size before a segment's first: its line's floor
        return pts[i - 1][0] if i else 0

    cost = {(i, j): fit_line(pts[i:j], floor(i))[2]
            for i in range(m) for j in range(i + min_points, m + 1)
            if not any(i < c < j for c in cuts_at)}
    # best[k][j]: (cost, cut positions) of the first j points in k segments
    best: list[dict[int, tuple[float, tuple[int, ...]]]] = [{0: (0.0, ())}]
    for k in range(1, max_segments + 1):
        layer: dict[int, tuple[float, tuple[int, ...]]] = {}
        for j in range(k * min_points, m + 1):
            options = [(prev + cost[(i, j)], cuts + (i,)) for i, (prev, cuts) in best[-1].items()
                       if (i, j) in cost]
            if options:
                layer[j] = min(options)
        best.append(layer)
    fits = [(k, *best[k][m]) for k in range(1, max_segments + 1) if m in best[k]]
    rms = {k: math.sqrt(rss / m) for k, rss, _ in fits}
    good = max(tolerance, 1.1 * min(rms.values()))
    _, _, cuts = next(fit for fit in fits if rms[fit[0]] <= good)
    bounds = [*cuts[1:], m]
    out = []
    for i, j in zip(cuts, bounds, strict=True):
        alpha, beta, _ = fit_line(pts[i:j], floor(i))
        out.append(Segment(pts[j - 1][0], alpha, beta))
    return out


def predict(segments: Sequence[Segment], nbytes: int) -> float:
    """Seconds the fitted model gives a message of ``nbytes``.

    Raises:
        ValueError: no segments.
    """
    if not segments:
        raise ValueError("no segments")
    seg = next((s for s in segments if nbytes <= s.up_to), segments[-1])
    return seg.alpha + nbytes * seg.beta


def calibrated_cluster(segments: Sequence[Segment], *, name: str, ranks: int = 8,
                       shared: bool = False, host: HostSpec | None = None,
                       crowded: Sequence[Segment] = ()) -> Cluster:
    """One node of ``ranks`` devices joined by a link with ``segments`` (Rule 3);
    ``shared``: every transfer of the node crosses one resource in turn (in-process ranks
    on one event loop share its one CPU, Rule 3); ``host``: the CPU work of collective
    calls; ``crowded``: the link's segments where the world runs more ranks than
    ``host`` has cores (``LinkSpec.crowded``).

    Raises:
        ValueError: no segments, ``ranks`` < 1.
    """
    if not segments:
        raise ValueError("no segments")
    last = segments[-1]
    link = LinkSpec(name, last.bandwidth if last.beta > 0 else 1e15, 0.0,
                    segments=_link_segments(segments), sharing="fifo" if shared else "fair",
                    crowded=_link_segments(crowded))
    return Cluster(nodes=1, devices_per_node=ranks, intra=link, inter=None,
                   device=DeviceSpec("host", 1e11, 1 << 40, math.inf, 0.0),
                   shared_intra=shared, name=name, host=host)


def _link_segments(segments: Sequence[Segment]) -> tuple[tuple[int, float, float], ...]:
    """``segments`` as ``LinkSpec`` holds them (a free segment's bandwidth all but
    infinite)."""
    return tuple((s.up_to, s.alpha, s.bandwidth if s.beta > 0 else 1e15) for s in segments)
