"""Validation: the calibrated cluster model's predictions against measured runs.

On each real transport of this machine (in-process; ``processes``, ranks in processes of
their own that move data through shared memory; MPI when ``mpiexec`` is there; their
processes each bound to the CPU the model places its rank on:
``asynccomm.calibrate.placed``), the model is calibrated (``python -m
asynccomm.calibrate``: ping-pong, piecewise alpha-beta, and the CPU work of a collective
call), then a second, fresh measurement is set against what the
calibrated model predicts, run as the same program on the virtual clock, timed as the
calibration times it (the same loop of calls; in-process ranks on the process's CPU clock,
processes and MPI on the wall clock: ``asynccomm.calibrate.clock_of``):

- point-to-point, one way, 8 B to 64 MiB;
- ring allreduce, ring allgather and (pairwise) alltoall at 2, 3 and 4 ranks, at a few
  sizes each (the whole buffer, nccl-tests' convention).

Each cell's error is the geometric mean over its sizes of |log(predicted / measured)|,
shown as a percentage (exp(mean) - 1); beside it, the error of the same model without the
calls' CPU work (messages only, as the model was before it had a host), and the cell's
spread, its measurement's own (``spread``: its repeats against their median, reckoned as
the error is; a cell whose spread passes the target is marked noisy).  Each cell is
measured in two passes, every rank count's once and then again, and judged against their
geometric mean; how far the two fall from each other is its ``drift`` (a cell whose drift
passes the target is marked unsteady): no prediction made at one time, as the calibration
is, can be judged closer than that against a measurement made at another.  Targets: 5%
for point-to-point, 10% per (collective, ranks) cell.  The measurements are medians of
repeats on a shared machine, so they move from run to run; the JSON and picture go to
files git ignores.  The JSON keeps what each calibration measured, and ``--replay`` judges
the model as the code has it against a run's measurements again (``replay``).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

import asynccomm as ac
from asynccomm.calibrate import (
    CROSS_CPU_BYTES,
    MODEL_CALLS,
    SIZES,
    Record,
    calibrate,
    call_buffers,
    clock_of,
    cross_cpu,
    in_process_host,
    measure_pingpong,
    mpi_run,
    mpiexec,
    placed,
    recording,
    time_calls,
)
from asynccomm.sim import Cluster, HostSpec

from ._common import finish, format_table, parser, progress, size_label

NAME = "validation"
COLLECTIVES = ("allreduce", "allgather", "alltoall")
RANKS = (2, 3, 4)
COLL_SIZES = (4 << 10, 256 << 10, 4 << 20)
P2P_TARGET, COLL_TARGET = 0.05, 0.10
REPEATS = 5


async def _call(comm: ac.Communicator, name: str, bufs: tuple[Any, ...]) -> None:
    if name == "allreduce":
        await comm.allreduce(bufs[0], algorithm="ring")
    elif name == "allgather":
        await comm.allgather(bufs[0], bufs[1], algorithm="ring")
    else:
        await comm.alltoall(bufs[0], bufs[1])


async def collectives(comm: ac.Communicator, sizes: tuple[int, ...], *, model: bool,
                      repeats: int = REPEATS, transport: str = "mpi"
                      ) -> dict[str, dict[int, float]]:
    """Seconds per call of each collective and size (rank 0's), in the calibration's loop
    (``time_calls``): on the model's clock with ``model``, ``MODEL_CALLS`` calls back to
    back, else the median of ``repeats`` on ``transport``'s clock (``clock_of``); under
    ``"<collective> spread"`` the repeats' ``spread`` and ``"<collective> faults"`` this
    process's page faults per call (0 on the model's clock)."""
    out: dict[str, dict[int, float]] = {}
    for name in COLLECTIVES:
        out[name], out[f"{name} spread"], out[f"{name} faults"] = {}, {}, {}
        for nbytes in sizes:
            call = partial(_call, comm, name, call_buffers(name, nbytes, comm.size))
            # the calibration's loop; on the model's clock a few calls say it all
            samples: list[float] = []
            out[name][nbytes], faults = (await time_calls(
                comm, call, 1, comm.model_time, iterations=MODEL_CALLS) if model else
                await time_calls(comm, call, repeats, clock_of(transport),
                                 samples=samples))
            out[f"{name} spread"][nbytes] = spread(samples)
            out[f"{name} faults"][nbytes] = 0.0 if model else faults
    return out


def _measured_rows(name: str, sizes: tuple[int, ...],
                   runs: list[dict[str, dict[int, float]]]) -> list[dict[str, Any]]:
    """A cell's measurements from its ``runs`` (each a pass of ``collectives``): each
    size's the geometric mean of the passes' medians (``passes_s``), its spread and page
    faults their means."""
    return [{"nbytes": n,
             "measured_s": math.exp(statistics.fmean(math.log(r[name][n]) for r in runs)),
             "passes_s": [r[name][n] for r in runs],
             "spread": statistics.fmean(r[f"{name} spread"][n] for r in runs),
             "faults_per_call": statistics.fmean(r[f"{name} faults"][n] for r in runs)}
            for n in sizes]


def _cell(name: str, p: int, measured: list[dict[str, Any]],
          model: dict[str, dict[int, float]], messages: dict[str, dict[int, float]]
          ) -> dict[str, Any]:
    """One (collective, ranks) cell of the table: its ``measured`` rows
    (``_measured_rows``) beside the model's predictions, and their error."""
    rows = [{**{k: r[k] for k in ("nbytes", "measured_s", "passes_s", "spread",
                                  "faults_per_call")},
             "predicted_s": model[name][r["nbytes"]],
             "messages_only_s": messages[name][r["nbytes"]]} for r in measured]
    return {"collective": name, "ranks": p, "rows": rows,
            "spread": math.exp(statistics.fmean(math.log1p(r["spread"]) for r in rows)) - 1,
            "drift": drift([r["passes_s"] for r in rows]),
            "error": _error([(r["predicted_s"], r["measured_s"]) for r in rows]),
            "messages_only_error": _error([(r["messages_only_s"], r["measured_s"])
                                           for r in rows])}


def drift(passes: list[list[float]]) -> float:
    """How far a cell's passes fall from each other, as the error is reckoned (``_error``):
    exp(mean over its sizes of |log(last pass / first pass)|) - 1; 0 with one pass.  No
    prediction made at one time can be judged closer than this against a measurement made
    at another: the calibration and the check a minute apart differ as the passes do."""
    timed = [(p[-1], p[0]) for p in passes if len(p) > 1 and p[0] > 0 and p[-1] > 0]
    return _error(timed) if timed else 0.0


def spread(samples: list[float]) -> float:
    """How far repeats fall from their median, as the error is reckoned (``_error``):
    exp(mean |log(sample / median)|) - 1; 0 for fewer than two (of more than 0 s)."""
    samples = [t for t in samples if t > 0]
    if len(samples) < 2:
        return 0.0
    mid = statistics.median(samples)
    return _error([(t, mid) for t in samples])


def _p2p_model(cluster: Cluster, sizes: tuple[int, ...]) -> dict[int, float]:
    """One-way seconds of a ping-pong on the calibrated model (virtual clock)."""
    async def main(comm: ac.Communicator) -> dict[int, float]:
        out = {}
        buf = np.zeros(max(sizes), np.uint8)
        for n in sizes:
            t0 = comm.model_time()
            if comm.rank == 0:
                await comm.send(buf[:n], 1)
                await comm.recv(buf[:n], 1)
            else:
                await comm.recv(buf[:n], 0)
                await comm.send(buf[:n], 0)
            out[n] = (comm.model_time() - t0) / 2
        return out

    return ac.run(main, 2, cluster=cluster, clock="virtual")[0]


def _collectives_measured(transport: str, p: int, sizes: tuple[int, ...]
                          ) -> dict[str, dict[int, float]]:
    timed = partial(collectives, sizes=sizes, model=False, transport=transport)
    if transport == "local":
        return ac.run(timed, p, backend="local")[0]
    if transport == "processes":  # the program must pickle; its ranks placed as modelled
        return ac.run(placed(timed), p, backend="processes")[0]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "coll.json"
        mpi_run(["-m", "results.validation", "--mpi-worker", str(out),
                 "--sizes", *map(str, sizes)], p)
        raw = json.loads(out.read_text())
    return {name: {int(n): t for n, t in d.items()} for name, d in raw.items()}


def _error(pairs: list[tuple[float, float]]) -> float:
    """exp(mean |log(predicted / measured)|) - 1."""
    return math.exp(statistics.fmean(abs(math.log(p / m)) for p, m in pairs)) - 1


def measure(transports: tuple[str, ...], p2p_sizes: tuple[int, ...] = SIZES,
            coll_sizes: tuple[int, ...] = COLL_SIZES, ranks: tuple[int, ...] = RANKS,
            repeats: int = 7) -> dict[str, Any]:
    """Calibrate each transport (``repeats`` of each measurement), measure again, and
    predict; the tables' data, with what the calibration measured (``recorded``: see
    ``replay``)."""
    data: dict[str, Any] = {"transports": {}, "plan": {
        "p2p_sizes": list(p2p_sizes), "coll_sizes": list(coll_sizes), "ranks": list(ranks),
        "repeats": repeats}}
    started = time.perf_counter()
    host = in_process_host(repeats)  # once, on the CPU clock, for every transport
    data["in_process_host"] = host.to_dict()
    data["wall_s"] = round(time.perf_counter() - started, 2)
    for transport in progress(transports, NAME):
        walls, started = {}, time.perf_counter()
        with recording(Record()) as record:
            doc = calibrate(transport, p2p_sizes, repeats, host=host)
        walls["calibrate"] = time.perf_counter() - started
        cluster, bare = _clusters(doc)
        probed = "cross_cpu" in doc["calibration"]  # the machine's state (``cross_cpu``)
        probes: dict[str, Any] = {"calibration": doc["calibration"].get("cross_cpu"),
                                  "check": cross_cpu() if probed else None, "passes": {}}
        measured = measure_pingpong(transport, p2p_sizes, repeats)
        walls["p2p"] = time.perf_counter() - started - sum(walls.values())
        runs: dict[int, list[dict[str, dict[int, float]]]] = {}
        models = {}
        for p in ranks:
            probes["passes"][str(p)] = [cross_cpu() if probed else None]
            runs[p] = [_collectives_measured(transport, p, coll_sizes)]
            walls[f"measured {p}"] = time.perf_counter() - started - sum(walls.values())
            models[p] = _modelled(cluster, bare, p, coll_sizes)
            walls[f"model {p}"] = time.perf_counter() - started - sum(walls.values())
        for p in ranks:  # again, seconds later: how far a cell moves by itself (``drift``)
            probes["passes"][str(p)].append(cross_cpu() if probed else None)
            runs[p].append(_collectives_measured(transport, p, coll_sizes))
            walls[f"again {p}"] = time.perf_counter() - started - sum(walls.values())
        data["transports"][transport] = {
            **_judged(doc, cluster, measured, {
                (name, p): _measured_rows(name, coll_sizes, runs[p])
                for p in ranks for name in COLLECTIVES}, models),
            "recorded": record.taken, "cross_cpu": probes,
            "wall_s": {k: round(v, 2) for k, v in walls.items()}}
    return data


def replay(data: dict[str, Any]) -> dict[str, Any]:
    """The tables of a validation run (``measure``'s data, as its JSON keeps it) on the
    model as the code has it now: each transport's calibration solved again from what it
    measured then (``asynccomm.calibrate.recording``), its predictions set beside the
    same measurements.  A change to the model is judged so without the machine's noise:
    the measurements do not move.

    Raises:
        ValueError: data without what its calibration measured (an older run).
    """
    plan = data.get("plan")
    if plan is None or any("recorded" not in d for d in data["transports"].values()):
        raise ValueError("these results do not keep what their calibration measured: run "
                         "python -m results.validation again")
    host = HostSpec.from_dict(data["in_process_host"])
    out: dict[str, Any] = {"transports": {}, "plan": plan, "in_process_host": data[
        "in_process_host"], "replayed": True}
    for transport, d in data["transports"].items():
        with recording(Record(d["recorded"], replay=True)):
            doc = calibrate(transport, tuple(plan["p2p_sizes"]), plan["repeats"], host=host)
        cluster, bare = _clusters(doc)
        coll_sizes = tuple(plan["coll_sizes"])
        out["transports"][transport] = {
            **_judged(doc, cluster, {r["nbytes"]: r["measured_s"] for r in d["p2p"]},
                      {(c["collective"], c["ranks"]): c["rows"] for c in d["cells"]},
                      {p: _modelled(cluster, bare, p, coll_sizes) for p in plan["ranks"]}),
            "recorded": d["recorded"], "cross_cpu": d.get("cross_cpu")}
    return out


def _clusters(doc: dict[str, Any]) -> tuple[Cluster, Cluster]:
    """The calibrated cluster of a preset ``doc``, loaded through its file as a user
    would, and the same without the calls' CPU work (messages only)."""
    with tempfile.TemporaryDirectory() as tmp:
        preset = Path(tmp) / "preset.json"
        preset.write_text(json.dumps(doc))
        cluster = Cluster.load(preset)
    bare = copy.copy(cluster)
    bare.host = HostSpec()
    return cluster, bare


def _modelled(cluster: Cluster, bare: Cluster, p: int, sizes: tuple[int, ...]
              ) -> tuple[dict[str, dict[int, float]], dict[str, dict[int, float]]]:
    """Seconds per call of each collective and size on ``p`` ranks of the calibrated
    model and of the one of messages only."""
    model, messages = (ac.run(lambda comm: collectives(comm, sizes, model=True), p,
                              cluster=c, clock="virtual")[0] for c in (cluster, bare))
    return model, messages


def _judged(doc: dict[str, Any], cluster: Cluster, p2p_measured: dict[int, float],
            cells: dict[tuple[str, int], list[dict[str, Any]]],
            models: dict[int, tuple[dict[str, dict[int, float]], dict[str, dict[int, float]]]]
            ) -> dict[str, Any]:
    """A transport's tables: the preset's fit, point-to-point and each cell's measured
    rows beside the model's predictions."""
    predicted = _p2p_model(cluster, tuple(p2p_measured))
    p2p = [{"nbytes": n, "measured_s": t, "predicted_s": predicted[n]}
           for n, t in p2p_measured.items()]
    return {"segments": doc["calibration"]["segments"], "host": doc["cluster"]["host"],
            "crowded": doc["calibration"].get("crowded"), "p2p": p2p,
            "p2p_error": _error([(r["predicted_s"], r["measured_s"]) for r in p2p]),
            "cells": [_cell(name, p, rows, *models[p]) for (name, p), rows in cells.items()]}


def _segments(segments: list[dict[str, float]]) -> str:
    return ", ".join(f"<= {size_label(s['up_to'])}: {s['alpha'] * 1e6:.1f} us + "
                     f"n / {(1 / s['beta'] / 1e9 if s['beta'] else math.inf):.2f} GB/s"
                     for s in segments)


def report(data: dict[str, Any]) -> str:
    parts = ([f"in-process host work measured in {data['wall_s']:.1f} wall seconds"]
             if "wall_s" in data else [])
    if data.get("replayed"):
        parts.append("replayed: the model as this code has it, calibrated again from what an "
                     "earlier run measured, against that run's measurements")
    for transport, d in data["transports"].items():
        parts.append(f"{transport}: calibrated {_segments(d['segments'])}")
        if d.get("crowded"):
            parts.append(f"{transport}: on {d['crowded']['ranks']} ranks (more than the "
                         f"cores), less {d['crowded']['lift'] * 1e6:.1f} us a message "
                         f"{_segments(d['crowded']['segments'])}")
        if d.get("host"):
            parts.append(f"{transport}: host {HostSpec.from_dict(d['host']).describe()}")
        parts.append(format_table(
            f"{transport}: point-to-point one way, predicted (calibrated model) vs measured "
            f"(a fresh run); geomean error {d['p2p_error']:.1%} (target {P2P_TARGET:.0%})",
            ["bytes", "measured us", "predicted us", "error"],
            [[size_label(r["nbytes"]), f"{r['measured_s'] * 1e6:.2f}",
              f"{r['predicted_s'] * 1e6:.2f}", f"{r['predicted_s'] / r['measured_s'] - 1:+.1%}"]
             for r in d["p2p"]]))
        rows = [[c["collective"], c["ranks"],
                 *(f"{r['measured_s'] * 1e6:.0f}/{r['predicted_s'] * 1e6:.0f}"
                   for r in c["rows"]),
                 f"{c['error']:.1%}", f"{c['spread']:.1%}", f"{c.get('drift', 0.0):.1%}",
                 _met(c),
                 f"{c['messages_only_error']:.1%}"]
                for c in d["cells"]]
        sizes = [size_label(r["nbytes"]) for r in d["cells"][0]["rows"]] if d["cells"] else []
        parts.append(format_table(
            f"{transport}: collectives, measured/predicted us per call, geomean error per "
            f"cell (target {COLL_TARGET:.0%}) against the mean of two passes; spread: the "
            f"measurement's own, repeat to repeat (a cell whose spread passes the target is "
            f"noisy); drift: its two passes, seconds apart, against each other (past the "
            f"target: unsteady); the error of a noisy or unsteady cell may be the machine's"
            + _pace_moved(d),
            ["collective", "ranks", *sizes, "error", "spread", "drift", "met",
             "messages only"], rows))
        if d["cells"]:
            parts.append(f"{transport}: {_tally(d['cells'])}")
        if (probed := _probes(d.get("cross_cpu"))):
            parts.append(f"{transport}: {probed}")
        if "wall_s" in d:
            parts.append(f"{transport}: wall seconds, " + ", ".join(
                f"{part} {wall:.1f}" for part, wall in d["wall_s"].items()))
    return "\n\n".join(parts)


def _rate(seconds: float | None) -> str:
    """A ``cross_cpu`` probe as a rate (GB/s), or "-" where none was taken."""
    return "-" if not seconds else f"{CROSS_CPU_BYTES / seconds / 1e9:.1f}"


def _probes(probes: dict[str, Any] | None) -> str:
    """The ``cross_cpu`` probes of a transport's run, as rates: the state of the machine
    at each of its measurements; "" where none was taken."""
    if not probes or not (probes.get("check") or (probes.get("calibration") or [None])[0]):
        return ""
    passes = "; ".join(f"{p} ranks {', '.join(_rate(t) for t in ts)}"
                       for p, ts in probes.get("passes", {}).items())
    return (f"a {size_label(CROSS_CPU_BYTES)} block just written on another CPU copied out "
            f"at {_around(probes)}; before the cells' passes: {passes} (a CPU state the host "
            f"changes for spells of seconds to minutes: asynccomm.calibrate.cross_cpu)")


def _around(probes: dict[str, Any]) -> str:
    """The probes taken around the calibration's ping-pong and before the check, as
    rates."""
    return (f"{', '.join(_rate(t) for t in probes.get('calibration') or [])} GB/s around "
            f"the calibration's ping-pong, {_rate(probes.get('check'))} before the check")


def _moved(probes: dict[str, Any] | None) -> str:
    """What the ``cross_cpu`` probes say of a check that missed its target: the machine's
    CPUs were in another state (a rate 1.5 times another's) during the calibration's
    ping-pong and before the check, or ""."""
    if not probes or not probes.get("check"):
        return ""
    rates = [CROSS_CPU_BYTES / t for t in [*(probes.get("calibration") or []),
                                           probes["check"]] if t]
    if len(rates) < 2 or max(rates) < 1.5 * min(rates):
        return ""
    return (f" (a block just written on another CPU copied out at {_around(probes)}: the "
            f"host moved the CPUs)")


def _pace_moved(d: dict[str, Any]) -> str:
    """What a transport's cells are worth when its point-to-point check missed its target:
    the calibration's ping-pong and the check's, a minute apart, disagree, so the machine's
    pace moved between them (on the wall clock: processes and MPI), and the cells, measured
    later still, judge that as much as the model (the cells are judged all the same)."""
    if d["p2p_error"] <= P2P_TARGET:
        return ""
    return (f"; the point-to-point check above missed its target ({d['p2p_error']:.1%}): the "
            f"machine's pace moved between the calibration and the measurements"
            f"{_moved(d.get('cross_cpu'))}, which these cells judge as much as the model")


def _met(cell: dict[str, Any]) -> str:
    """Whether a cell met the target, and whether its measurement's own spread (noisy) or
    drift (unsteady) is past it."""
    met = "yes" if cell["error"] <= COLL_TARGET else "no"
    marks = [mark for mark, key in (("noisy", "spread"), ("unsteady", "drift"))
             if cell.get(key, 0.0) > COLL_TARGET]
    return f"{met} ({', '.join(marks)})" if marks else met


def _steady(cell: dict[str, Any]) -> bool:
    return max(cell.get("spread", 0.0), cell.get("drift", 0.0)) <= COLL_TARGET


def _tally(cells: list[dict[str, Any]]) -> str:
    """How many cells met the target, all and those whose measurement held still."""
    steady = [c for c in cells if _steady(c)]
    met = sum(c["error"] <= COLL_TARGET for c in cells)
    held = sum(c["error"] <= COLL_TARGET for c in steady)
    return (f"{met} of {len(cells)} cells met the target; of the {len(steady)} whose "
            f"measurement held within it (spread and drift), {held}")


def draw(plt: Any, data: dict[str, Any]) -> Any:
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for transport, d in data["transports"].items():
        xs = [r["nbytes"] for r in d["p2p"]]
        axes[0].plot(xs, [r["measured_s"] * 1e6 for r in d["p2p"]], "o", mfc="none",
                     label=f"{transport} measured")
        axes[0].plot(xs, [r["predicted_s"] * 1e6 for r in d["p2p"]], "-",
                     label=f"{transport} predicted")
        labels = [f"{c['collective'][:6]} {c['ranks']}" for c in d["cells"]]
        line, = axes[1].plot(range(len(labels)), [100 * c["error"] for c in d["cells"]],
                             "s-", label=transport)
        axes[1].plot(range(len(labels)), [100 * c.get("drift", 0.0) for c in d["cells"]],
                     ":", color=line.get_color(), label=f"{transport} drift")
        axes[1].set_xticks(range(len(labels)), labels, rotation=60, fontsize=7)
    axes[0].set_xscale("log", base=2)
    axes[0].set_yscale("log")
    axes[0].set_xlabel("bytes")
    axes[0].set_ylabel("one-way us")
    axes[0].set_title("point-to-point: calibrated model vs measured")
    axes[0].legend(fontsize=7)
    axes[1].axhline(100 * COLL_TARGET, color="k", ls="--", lw=1)
    axes[1].set_ylabel("geomean error, drift (%)")
    axes[1].set_title("collectives, per (collective, ranks)")
    axes[1].legend(fontsize=7)
    return fig


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if "--mpi-worker" in args_in:  # one rank of an MPI measurement
        worker = argparse.ArgumentParser()
        worker.add_argument("--mpi-worker", type=Path)
        worker.add_argument("--sizes", type=int, nargs="+")
        w = worker.parse_args(args_in)
        out = ac.run(placed(partial(collectives, sizes=tuple(w.sizes), model=False)),
                     backend="mpi")
        if out is not None and ac_rank() == 0:
            w.mpi_worker.write_text(json.dumps(out))
        return {}
    cli = parser(NAME, __doc__)
    cli.add_argument("--transport", action="append", choices=("local", "processes", "mpi"),
                     help="validate this transport only (again for more; default: each "
                     "there is)")
    cli.add_argument("--replay", type=Path, metavar="JSON",
                     help="judge the model as this code has it against the measurements "
                     "of an earlier run (its validation.json), its calibration solved "
                     "again from what it measured; writes validation.replay.json")
    args = cli.parse_args(args_in)
    started = time.perf_counter()
    transports = tuple(args.transport or (
        "local", "processes", *(("mpi",) if mpiexec() is not None else ())))
    if args.replay is not None:
        data = replay(json.loads(args.replay.read_text()))
    elif args.quick:
        data = measure(("local",), (8, 4096, 1 << 20), (4096,), (2, 3), repeats=3)
    else:
        data = measure(transports)
    print(report(data))
    finish(args, f"{NAME}.replay" if args.replay is not None else NAME, data, draw, started)
    return data


def ac_rank() -> int:
    """This process's MPI rank (0 outside MPI)."""
    from mpi4py import MPI

    return int(MPI.COMM_WORLD.Get_rank())


if __name__ == "__main__":
    main()
