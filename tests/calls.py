"""A test's record of the calls a method gets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


def counted(monkeypatch: pytest.MonkeyPatch, owner: type, name: str,
            key: Callable[[Any], Any]) -> list[Any]:
    """Replace the method ``owner.name`` (for the test) with one that records ``key`` of
    its first argument and then does what it did; the list it records into."""
    seen: list[Any] = []
    original = getattr(owner, name)

    def wrapper(self: Any, arg: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(key(arg))
        return original(self, arg, *args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)
    return seen
