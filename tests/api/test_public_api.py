"""The public surface (trio's test_exports): what ``asynccomm`` exports, the error hierarchy
and the dtype constants."""

from __future__ import annotations

import importlib
import importlib.resources
import pkgutil
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import asynccomm as ac
from asynccomm import _exceptions, _types


def _all_modules() -> list[ModuleType]:
    return [ac] + [importlib.import_module(info.name)
                   for info in pkgutil.walk_packages(ac.__path__, prefix="asynccomm.")]


MODULES = _all_modules()
EXCEPTIONS = [getattr(ac, name) for name in ac.__all__
              if isinstance(getattr(ac, name), type)
              and issubclass(getattr(ac, name), BaseException)]


def test_all_names_resolve() -> None:
    for name in ac.__all__:
        assert hasattr(ac, name), f"asynccomm.__all__ names {name!r}, which does not exist"


def test_all_has_no_duplicates_and_no_private_names() -> None:
    assert len(ac.__all__) == len(set(ac.__all__))
    assert [n for n in ac.__all__ if n.startswith("_")] == []


def test_every_public_name_is_exported() -> None:
    """Nothing public in the package namespace is missing from ``__all__`` (submodules and
    ``__version__`` and the ``__future__`` import aside)."""
    extra = {name for name in vars(ac) if not name.startswith("_")
             and not isinstance(getattr(ac, name), ModuleType)} - set(ac.__all__)
    extra.discard("annotations")
    assert extra == set()


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_module_all_names_exist(module: ModuleType) -> None:
    names = getattr(module, "__all__", ())
    assert len(names) == len(set(names)), f"{module.__name__}.__all__ has duplicates"
    missing = [n for n in names if not hasattr(module, n)]
    assert missing == [], f"{module.__name__}.__all__ names missing objects: {missing}"


@pytest.mark.parametrize("module", [m for m in MODULES if m.__file__
                                    and not m.__file__.endswith("__init__.py")],
                         ids=lambda m: m.__name__)
def test_every_module_declares_all(module: ModuleType) -> None:
    assert hasattr(module, "__all__"), f"{module.__name__} has no __all__"


def test_public_names_come_from_their_modules_all() -> None:
    """Every exported class or function is listed in the ``__all__`` of the module that
    defines it, and the leaf modules export everything they list."""
    for name in ac.__all__:
        obj = getattr(ac, name)
        mod_name = getattr(obj, "__module__", None)
        if not isinstance(obj, type) and not callable(obj):
            continue
        assert mod_name is not None and mod_name.startswith("asynccomm.")
        home = importlib.import_module(mod_name)
        assert name in getattr(home, "__all__", ()), f"{name} is not in {mod_name}.__all__"
    for leaf in (_exceptions, _types):
        assert set(leaf.__all__) <= set(ac.__all__), f"{leaf.__name__} exports are not public"


def test_version() -> None:
    assert isinstance(ac.__version__, str)
    assert ac.__version__.count(".") >= 1


def test_py_typed_is_shipped() -> None:
    assert importlib.resources.files("asynccomm").joinpath("py.typed").is_file()


# -- errors ----------------------------------------------------------------------------------


def test_exported_exceptions_are_the_hierarchy() -> None:
    names = {e.__name__ for e in EXCEPTIONS}
    assert names == set(_exceptions.__all__)
    assert names >= {"AsyncCommError", "CommClosedError", "CommBrokenError", "MatchError",
                     "TruncationError", "DTypeMismatchError", "CommTimeoutError",
                     "DeadlockError", "OutOfDeviceMemoryError", "TransportError"}


@pytest.mark.parametrize("exc", EXCEPTIONS, ids=lambda e: e.__name__)
def test_every_exception_subclasses_asynccommerror(exc: type[BaseException]) -> None:
    assert issubclass(exc, ac.AsyncCommError)
    assert issubclass(exc, Exception)


def test_asynccommerror_is_abstract() -> None:
    with pytest.raises(TypeError, match="abstract"):
        ac.AsyncCommError("x")


def test_subclasses_are_not_abstract() -> None:
    assert str(ac.CommClosedError("closed", rank=3)) == "closed"
    assert isinstance(ac.TransportError("boom"), ac.AsyncCommError)


@pytest.mark.parametrize(("sub", "base"), [
    (ac.CommTimeoutError, TimeoutError),
    (ac.DTypeMismatchError, ac.MatchError),
    (ac.DTypeMismatchError, TypeError),
    (ac.TruncationError, ac.MatchError),
    (ac.OutOfDeviceMemoryError, MemoryError),
])
def test_exception_bases(sub: type[BaseException], base: type[BaseException]) -> None:
    assert issubclass(sub, base)


@pytest.mark.parametrize(("sub", "not_base"), [
    (ac.TruncationError, TypeError),
    (ac.CommClosedError, ac.CommBrokenError),
    (ac.CommBrokenError, ac.CommClosedError),
    (ac.MatchError, ValueError),
])
def test_exception_non_bases(sub: type[BaseException], not_base: type[BaseException]) -> None:
    assert not issubclass(sub, not_base)


# -- surface of the handles -------------------------------------------------------


@pytest.mark.parametrize(("cls", "names"), [
    (ac.Communicator, ["rank", "size", "device", "send", "recv", "isend", "irecv", "sendrecv",
                       "batch", "probe", "iprobe", "recv_new", "stream", "compute", "aclose"]),
    (ac.Request, ["done", "cancel", "cancelled", "status", "exception"]),
    (ac.Stream, ["synchronize", "record", "wait"]),
    (ac.Event, ["synchronize", "done"]),
    (ac.World, ["comms", "size"]),
])
def test_handles_have_the_documented_members(cls: type, names: list[str]) -> None:
    # rank/size/device are set per instance
    instance_attrs = {"rank", "size", "device", "comms"}
    missing = [n for n in names if n not in instance_attrs and not hasattr(cls, n)]
    assert missing == []


#: The names the public API fixes ("the contract; names are fixed").
API_NAMES = ["run", "open_world", "Communicator", "Status", "Request", "Stream", "Event",
                "run_async", "wait_all", "wait_any", "SendOp", "RecvOp", "ANY_SOURCE", "ANY_TAG",
                "Cluster", "float32"]


@pytest.mark.parametrize("name", API_NAMES)
def test_design_names_are_exported(name: str) -> None:
    assert name in ac.__all__
    assert hasattr(ac, name)


def test_status_fields() -> None:
    assert ac.Status._fields == ("source", "tag", "nbytes", "count", "shape")
    assert ac.Status(0, 1, 16, 4) == ac.Status(0, 1, 16, 4, (4,))  # flat unless told
    assert ac.Status(0, 1, 16, 4, [2, 2]).shape == (2, 2)


def test_constants() -> None:
    assert ac.ANY_SOURCE == -1
    assert ac.ANY_TAG == -1
    assert ac.TAG_UB >= 32767
    assert ac.EAGER_LIMIT == 65_536


async def test_world_exposes_ranks_in_order() -> None:
    async with ac.open_world(3) as world:
        assert world.size == 3
        assert [c.rank for c in world.comms] == [0, 1, 2]
        assert {c.size for c in world.comms} == {3}
        assert [c.device.index for c in world.comms] == [0, 1, 2]


# -- dtypes ----------------------------------------------------------------------------------

DTYPE_CONSTANTS = {
    "bool_": np.bool_, "int8": np.int8, "int16": np.int16, "int32": np.int32,
    "int64": np.int64, "uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32,
    "uint64": np.uint64, "float16": np.float16, "float32": np.float32, "float64": np.float64,
    "complex64": np.complex64, "complex128": np.complex128,
}


def test_every_datatype_has_an_exported_constant() -> None:
    exported = {getattr(ac, name) for name in DTYPE_CONSTANTS}
    assert exported == set(ac.DataType)
    assert set(DTYPE_CONSTANTS) <= set(ac.__all__)


@pytest.mark.parametrize("name", list(DTYPE_CONSTANTS))
def test_dtype_constant_maps_to_numpy(name: str) -> None:
    const = getattr(ac, name)
    assert isinstance(const, ac.DataType)
    assert np.dtype(const.value) == np.dtype(DTYPE_CONSTANTS[name])


@pytest.mark.parametrize("name", list(DTYPE_CONSTANTS))
async def test_hccl_form_with_dtype_constant(name: str) -> None:
    """``send(buf, dst, count=n, dtype=ac.float32)`` moves ``n`` elements of that type."""
    const = getattr(ac, name)
    np_type: Any = DTYPE_CONSTANTS[name]
    data = (np.arange(6) % 2).astype(np_type) if name == "bool_" else np.arange(6).astype(np_type)
    out = np.zeros(6, dtype=np_type)
    async with ac.open_world(2) as world:
        c0, c1 = world.comms
        rreq = c1.irecv(out, 0, 1, count=6, dtype=const)
        await c0.send(data, 1, 1, count=4, dtype=const)
        itemsize = np.dtype(np_type).itemsize
        assert await rreq == ac.Status(0, 1, 4 * itemsize, 4)
        np.testing.assert_array_equal(out[:4], data[:4])
        np.testing.assert_array_equal(out[4:], np.zeros(2, dtype=np_type))
