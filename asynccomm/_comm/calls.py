"""Collective calls that take their place in the sequence when they are called.

Every rank must make the collective calls of a communicator (collectives, ``split``,
``dup``) in the same order, and each call's messages use the tags of its place in that
order.  A coroutine function's body runs only when its coroutine is first resumed, so a
call whose task was cancelled before it ran (``task.cancel()`` right after
``create_task``, ``asyncio.wait_for(call, 0)``) would never take its place on that rank,
and every later call there would pair with the other ranks' earlier ones: wrong data
reported as success.  So the public methods are plain functions that take the call's
place at once and return a ``Call``: a coroutine (it can be awaited, given to
``create_task``, ``gather``, ``wait_for``...) that also hears of being thrown into or
closed before it ever ran, and then tells its owner (``abandon``), who can clean up the
place it held.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Generator
from typing import Any, TypeVar

__all__ = ["Call"]

T = TypeVar("T")


class Call(Coroutine[Any, Any, T]):
    """A coroutine that wraps ``coro`` and calls ``abandon(exc)`` if it is thrown into, or
    closed, before it ever ran (``exc``: what was thrown, or None when closed).  Once it
    ran, the body handles its own failures."""

    __slots__ = ("_abandon", "_coro", "_started")

    def __init__(self, coro: Coroutine[Any, Any, T],
                 abandon: Callable[[BaseException | None], None]) -> None:
        self._coro = coro
        self._abandon = abandon
        self._started = False

    # What asyncio's task repr and debug mode read of a coroutine: the wrapped one's.
    @property
    def cr_frame(self) -> Any:
        return self._inner().cr_frame

    @property
    def cr_running(self) -> bool:
        return bool(self._inner().cr_running)

    @property
    def cr_await(self) -> Any:
        return self._inner().cr_await

    @property
    def cr_code(self) -> Any:
        return self._inner().cr_code

    def _inner(self) -> Any:
        return self._coro

    def send(self, value: Any) -> Any:
        self._started = True
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        if not self._started:
            self._started = True
            exc = typ if isinstance(typ, BaseException) else (
                typ() if val is None else val if isinstance(val, BaseException) else typ(val))
            self._coro.close()
            self._abandon(exc)
            raise exc
        if val is None and tb is None:
            return self._coro.throw(typ)
        return self._coro.throw(typ, val, tb)

    def close(self) -> None:
        if not self._started:
            self._started = True
            self._coro.close()
            self._abandon(None)
            return
        self._coro.close()

    def __await__(self) -> Generator[Any, None, T]:
        return self

    def __iter__(self) -> Call[T]:
        return self

    def __next__(self) -> Any:
        return self.send(None)

    def __repr__(self) -> str:  # (asyncio's task repr shows this)
        return f"<Call {self._coro!r}>"
