"""The C lane and its declaration (``asynccomm._comm.native``) say the same, and the
declaration's checks refuse every assumption that does not hold.

The C is read as text: the structs of slot offsets in ``_lane.h``, the tables
``_lane_config.c`` fills from the declaration, the names it calls, the widths it reads the
wire header at, and which file calls which (a DAG).  The checks run on doctored copies of
the classes (subclasses, stand-ins), never on the real ones."""

from __future__ import annotations

import importlib.util
import os
import re
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import asynccomm as ac
from asynccomm._comm import native
from asynccomm._core import wire
from asynccomm._engine.engine import DeviceEngine
from asynccomm._engine.lane import LANE
from asynccomm._engine.stream import Stream
from asynccomm._types import Status
from asynccomm.transports._mpi_progress import Progress

NATIVE = Path(__file__).resolve().parents[2] / "asynccomm" / "_native"
BUILT = importlib.util.find_spec("asynccomm._native._lane") is not None
IN_USE = LANE is not None
needs_lane = pytest.mark.skipif(not IN_USE, reason="the C lane is not in use here")


def _source(name: str) -> str:
    """A C file without its comments."""
    text = (NATIVE / name).read_text()
    return re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.S)


def _table(name: str) -> list[str]:
    """The entries of a table ``name[] = { ... };`` in _lane_config.c."""
    m = re.search(rf"\b{name}\[\]\s*=\s*\{{(.*?)\}};", _source("_lane_config.c"), re.S)
    assert m, f"no table {name} in _lane_config.c"
    return [e.strip() for e in re.split(r",\s*(?![^()]*\))", m.group(1)) if e.strip()]


def _structs() -> dict[str, list[str]]:
    """The members of each ``extern struct ... { Py_ssize_t ...; } VAR;`` in _lane.h."""
    out = {}
    for body, var in re.findall(r"extern struct \w+\s*\{(.*?)\}\s*(\w+);", _source("_lane.h"),
                                re.S):
        members = re.sub(r"\bPy_ssize_t\b|;", " ", body)
        out[var] = [m.strip() for m in members.split(",") if m.strip()]
    return out


def _c_files() -> list[str]:
    return sorted(p.name for p in NATIVE.glob("*.c"))


# -- the C says what the declaration says ------------------------------------------------


def test_the_classes_table_is_the_declared_classes_in_order() -> None:
    assert _table("class_vars") == [f"&{name}Type" for name in native.CLASSES]


def test_each_struct_of_offsets_is_its_classes_declared_slots_in_order() -> None:
    layouts = [re.fullmatch(r"LAYOUT\((\w+), (\w+)\)", e) for e in _table("layouts")]
    assert all(layouts), _table("layouts")
    pairs = [(m.group(1), m.group(2)) for m in layouts if m]
    assert [cls for cls, _ in pairs] == [f"{name}Type" for name in native.SLOTS]
    structs = _structs()
    for (_, var), (name, slots) in zip(pairs, native.SLOTS.items(), strict=True):
        assert structs[var] == [s.lstrip("_") for s in slots], name


def test_the_objects_numbers_and_names_tables_are_the_declared_ones_in_order() -> None:
    assert _table("object_vars") == [f"&{key}" for key in native.OBJECTS]
    assert _table("number_vars") == [f"&{key}" for key in native.NUMBERS]
    assert _table("name_vars") == [f"&a_{key}" for key in native.NAMES]


def test_every_name_the_c_calls_is_declared() -> None:
    used = {n for f in _c_files() for n in re.findall(r"\ba_\w+", _source(f))}
    assert used == {f"a_{key}" for key in native.NAMES}


def test_the_c_spells_no_attribute_name_of_ours() -> None:
    """Names come from the declaration: no lookup by a C string but CPython's own
    running-loop key (3.11's, see _lane_config.c)."""
    lookups = r"(?:GetAttrString|InternFromString|SetAttrString|HasAttrString|CallMethod)"
    found = {lit for f in _c_files()
             for lit in re.findall(lookups + r"\([^;]*?\"([^\"]*)\"", _source(f))}
    assert found <= {"__asyncio_running_event_loop__"}


def test_the_entry_points_take_the_declared_arguments() -> None:
    """``send`` and ``recv`` check the declared count, say the declared arguments (their
    usage and their docstrings), and the stub types them so."""
    text = (NATIVE / "_lane.c").read_text()
    m = re.search(r"#define ENTRY_ARGS (\d+)", text)
    assert m and {len(args) for args in native.ENTRIES.values()} == {int(m.group(1))}
    stub = (NATIVE / "_lane.pyi").read_text()
    for name, args in native.ENTRIES.items():
        usage = f"{name}({', '.join(args)})"
        assert f'accept_call(args, nargs, {int(name == "recv")}, "{usage}"' in text
        assert f'"{usage} -> ' in text
        sig = re.search(rf"^def {name}\((.*?),\s*/\)", stub, re.S | re.M)
        assert sig and [p.split(":")[0].strip() for p in sig.group(1).split(",")] == list(args)


def test_the_status_the_c_builds_has_the_declared_fields() -> None:
    m = re.search(r"#define STATUS_FIELDS (\d+)", _source("_lane.h"))
    assert m and int(m.group(1)) == len(native.STATUS_FIELDS)
    assert Status._fields == native.STATUS_FIELDS


def test_the_c_reads_and_writes_each_header_field_at_its_declared_width() -> None:
    codes = dict(native.HEADER_FIELDS)
    text = _source("_lane_mpi.c")
    uses = (re.findall(r"get_le\(\w+ \+ H_(\w+), (\d+)\)", text)
            + re.findall(r"put_le\(\w+ \+ H_(\w+), [^;]*?, (\d+)\)", text))
    assert {field.lower() for field, _ in uses} == {"src", "tag", "nbytes", "count", "ident"}
    for field, width in uses:
        assert int(width) == struct.calcsize("<" + codes[field.lower()]), field


def test_the_header_numbers_come_from_the_wires_format() -> None:
    fmt = wire.HEADER.format
    assert native.numbers()["H_SIZE"] == wire.HEADER.size
    for field, _ in native.HEADER_FIELDS:
        at = native.header_offsets(fmt)[field]
        packed = wire.HEADER.pack(*[(1 if f == field else 0) if c != "48s" else
                                    (b"\x01" if f == field else b"") for f, c in
                                    native.HEADER_FIELDS])
        assert packed[at] == 1, field  # the field's first byte (little-endian) is there


def test_the_one_extension_is_built_from_every_c_file_here() -> None:
    setup = (NATIVE.parents[1] / "setup.py").read_text()
    m = re.search(r"^SOURCES = \[(.*?)\]", setup, re.S | re.M)
    assert m and sorted(re.findall(r'"(\w+\.c)"', m.group(1))) == _c_files()
    assert setup.count("Extension(") == 1


# -- the C files make a DAG ----------------------------------------------------------------


def _definitions(text: str) -> set[str]:
    """The functions and variables a C file gives the others (not static)."""
    funcs = re.findall(r"^(?!static\b)[A-Za-z_][\w \*]*\n(\w+)\(", text, re.M)
    variables: set[str] = set()
    for decl in re.findall(r"^(?!static\b|extern\b|typedef\b|#)(?:[A-Za-z_][\w]*\s+)+\**"
                           r"([^;(){}=]*?);", text, re.M):
        variables.update(re.findall(r"\*?\s*([A-Za-z_]\w*)", decl))
    types = re.findall(r"^PyTypeObject (\w+) = \{", text, re.M)
    return set(funcs) | variables | set(types)


def _unit_edges() -> dict[str, set[str]]:
    texts = {f: re.sub(r'"(?:[^"\\\n]|\\.)*"', '""', _source(f)) for f in _c_files()}
    owner = {name: f for f, text in texts.items() for name in _definitions(text)}
    edges: dict[str, set[str]] = {f: set() for f in texts}
    for f, text in texts.items():
        for ident in set(re.findall(r"(?<![.>])\b[A-Za-z_]\w*\b", text)):  # not a member
            if owner.get(ident, f) != f:
                edges[f].add(owner[ident])
    return edges


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_c_files_make_a_dag_the_entry_file_on_top() -> None:
    edges = _unit_edges()
    assert _cycle(edges) is None
    assert not any("_lane.c" in targets for targets in edges.values())  # nothing calls up
    assert edges["_lane_config.c"] == set()  # it holds what the others read
    assert {"_lane_steps.c", "_lane_recv.c", "_lane_config.c",
            "_lane_buffers.c"} <= edges["_lane.c"]


def test_the_dag_check_finds_a_cycle() -> None:
    edges = _unit_edges()
    edges["_lane_config.c"] = {"_lane.c"}
    assert _cycle(edges) is not None
    assert _cycle({"a.c": {"b.c"}, "b.c": {"c.c"}, "c.c": {"a.c"}}) == [
        "a.c", "b.c", "c.c", "a.c"]


def test_the_definitions_parser_sees_functions_variables_and_types() -> None:
    text = ("int\nrunning(PyObject *loop)\n{\n}\nstatic int\nhidden(void)\n{\n}\n"
            "long TAG_UB, MIN_BUCKET;\nstruct engine_slots EN;\nPyTypeObject PathType = {\n};\n")
    assert _definitions(text) == {"running", "TAG_UB", "MIN_BUCKET", "EN", "PathType"}


# -- the checks refuse what does not fit ---------------------------------------------------


def _classes(**doctored: type) -> dict[str, type]:
    return {**native._classes(ac.Communicator), **doctored}


def test_the_real_classes_pass_every_check() -> None:
    native.check(_classes())


def test_a_request_that_is_not_a_message_is_refused() -> None:
    class Loose:
        __slots__ = native.SLOTS["Request"]

    with pytest.raises(native.LaneMismatch, match="Request must subclass Message"):
        native.check(_classes(Request=Loose))


def test_a_status_of_other_fields_is_refused() -> None:
    class Short(NamedTuple):
        source: int
        tag: int
        nbytes: int
        count: int

    with pytest.raises(native.LaneMismatch, match="Status must be a tuple of the fields"):
        native.check(_classes(Status=Short))
    with pytest.raises(native.LaneMismatch, match="Status must be a tuple"):
        native.check(_classes(Status=list))


def test_a_declared_slot_that_is_not_a_slot_is_refused() -> None:
    class Unslotted(Stream):  # the field is a property here, not a slot
        @property
        def sid(self) -> int:
            return 0

    with pytest.raises(native.LaneMismatch, match=r"Unslotted\.sid is not a slot"):
        native.check(_classes(Stream=Unslotted))


def test_a_declared_method_that_is_missing_is_refused() -> None:
    class NoDrain(DeviceEngine):
        __slots__ = ()
        _drain = None  # type: ignore[assignment]

    with pytest.raises(native.LaneMismatch, match="NoDrain has no method '_drain'"):
        native.check(_classes(DeviceEngine=NoDrain))


def test_a_declared_attribute_that_no_method_sets_is_refused() -> None:
    class Bare:  # a Progress with none of its fields
        pass

    with pytest.raises(native.LaneMismatch, match="Bare has no attribute 'comm'"):
        native.check(_classes(Progress=Bare))
    assert native._is_field(Progress, "_dispatching")  # set by its __init__


@pytest.mark.parametrize("fmt", ["<BBxxiiqq48s4x", "<BBxxiqiqq48s4x", ">BBxxiiqqq48s4x"])
def test_a_wire_header_of_another_format_is_refused(fmt: str) -> None:
    with pytest.raises(native.LaneMismatch, match="the wire header"):
        native.check(_classes(), header=fmt)


def test_the_header_offsets_are_read_from_the_format() -> None:
    at = native.header_offsets("<BBxxiiqqq48s4x")
    assert at == {"kind": 0, "dlen": 1, "src": 4, "tag": 8, "nbytes": 12, "count": 20,
                  "ident": 28, "dtype": 36, "size": 88}
    assert native.header_offsets("<BBiiqqq48s")["size"] == 82  # no padding: moved up


@pytest.fixture
def reconfigured(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The lane configured again afterwards, as importing asynccomm configured it."""
    try:
        yield
    finally:
        monkeypatch.undo()
        native.configure_lane(ac.Communicator)
        assert native.CONFIGURED is LANE


@needs_lane
@pytest.mark.usefixtures("reconfigured")
def test_a_mismatch_is_a_warning_or_refused_import_and_the_python_steps_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    class Loose:
        __slots__ = ()

    doctored = _classes(Request=Loose)
    monkeypatch.setattr(native, "_classes", lambda communicator: doctored)
    monkeypatch.delenv("ASYNCCOMM_REQUIRE_NATIVE", raising=False)
    with pytest.warns(RuntimeWarning, match="Request must subclass Message"):
        assert native.configure_lane(ac.Communicator) == (None, None)
    assert native.CONFIGURED is None
    monkeypatch.setenv("ASYNCCOMM_REQUIRE_NATIVE", "1")
    with pytest.raises(ImportError, match="Request must subclass Message"):
        native.configure_lane(ac.Communicator)


@needs_lane
@pytest.mark.usefixtures("reconfigured")
@pytest.mark.parametrize("part", ["classes", "slots", "objects", "numbers", "names"])
def test_the_c_refuses_a_part_of_another_length_and_stays_off(part: str) -> None:
    assert LANE is not None
    spec = native.spec(_classes())
    spec[part] = spec[part][:-1]
    with pytest.raises(TypeError, match=f"spec\\['{part}'\\] must be a tuple of"):
        LANE.configure(spec)
    assert LANE.send(None, None, 0, 0, False, None, None) is False  # off: "not handled"
    assert LANE.recv(None, None, 0, 0, False, None, None) is None


@needs_lane
@pytest.mark.usefixtures("reconfigured")
def test_the_c_refuses_a_slot_list_of_another_length() -> None:
    assert LANE is not None
    spec = native.spec(_classes())
    spec["slots"] = (spec["slots"][0][:-1],) + spec["slots"][1:]
    with pytest.raises(TypeError, match=r"slots\[0\] must be a tuple of the 11 slots"):
        LANE.configure(spec)


# -- the C's arithmetic and clock are Python's ------------------------------------------------


@needs_lane
@settings(max_examples=300, deadline=None)
@given(st.integers(0, 1 << 40) | st.sampled_from([0, 1, 63, 64, 65, 4096, 4097]))
def test_the_c_charge_is_the_wires(nbytes: int) -> None:
    assert LANE is not None
    assert LANE.charge(nbytes) == wire.charge(nbytes)


@needs_lane
def test_the_c_clock_is_perf_counter() -> None:
    assert LANE is not None
    for _ in range(1000):
        before = time.perf_counter()
        now = LANE.perf_counter()
        after = time.perf_counter()
        assert before <= now <= after


def test_the_lane_is_in_use_exactly_where_built_and_not_pure_python() -> None:
    pure = os.environ.get("ASYNCCOMM_PURE_PYTHON", "") not in ("", "0")
    assert IN_USE is (BUILT and not pure)
    assert (native.CONFIGURED is not None) is IN_USE


