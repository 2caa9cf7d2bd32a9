"""The wire protocol of the MPI transport, and its progress back-off (no mpi4py here).

How it works
------------
Every control message travels on one MPI tag (``CTRL_TAG``) of a communicator private to
one world, so MPI's pairwise FIFO order on one (communicator, tag) carries our ordering
rules.  A message is a fixed header (``HEADER``), optionally followed by a payload.

Rule 1 (eager).  A message of at most ``inline_max`` bytes travels whole: ``EAGER`` header
plus payload in one MPI message.  Its send completes as soon as it is packed.
Rule 2 (rendezvous).  A larger one is announced by ``RTS`` (header only, with the sender's
message id).  When a recv matches it, the receiver posts its MPI recvs for the data straight
into the recv buffer on a fresh data tag and answers ``CTS`` (message id, data tag); the
sender then sends the data from its buffer.  Both sides cut it into chunks with a window.
Rule 3 (withdrawal).  A rendezvous send withdrawn before its ``CTS`` arrived sends
``WITHDRAW``; the receiver drops the announcement if it is still unmatched and always
answers ``ACK``.  A ``CTS`` that crosses the ``WITHDRAW`` is answered ``GONE``: the receiver
cancels its data recvs and puts its recv back in its place.  ``ACK`` follows any ``CTS`` for
the same message (FIFO), so the sender forgets a withdrawn id on ``ACK``.
Rule 4 (closing, barrier-free).  A rank whose engine closed sends ``CLOSE`` (payload: why)
to every rank, itself included; after it, it starts nothing new and only answers
``WITHDRAW``/``CTS``.  Once it has sent ``CLOSE`` to a rank and received that rank's
``CLOSE``, neither side can need an answer from the other, so it sends ``FIN``: its last
message to that rank.  A world is torn down when ``FIN`` went to and came from every rank,
so no message of a freed communicator is ever left in flight.
"""

from __future__ import annotations

import struct
from typing import Final

__all__ = [
    "ACK",
    "CLOSE",
    "CTRL_TAG",
    "CTS",
    "DTYPE_FIELDS",
    "DTYPE_NAMES",
    "EAGER",
    "FIN",
    "GONE",
    "HEADER",
    "INLINE_MAX",
    "KIND_NAMES",
    "RTS",
    "WITHDRAW",
    "Backoff",
    "decode_dtype",
    "encode_dtype",
]

#: The MPI tag of every control message; data tags are 1 and up.
CTRL_TAG: Final = 0
#: The largest payload that travels inside a control message (the rest use rendezvous),
#: which bounds the preallocated control recv buffers.
INLINE_MAX: Final = 65_536

EAGER: Final = 1
RTS: Final = 2
CTS: Final = 3
WITHDRAW: Final = 4
ACK: Final = 5
GONE: Final = 6
CLOSE: Final = 7
FIN: Final = 8
KIND_NAMES: Final = {EAGER: "EAGER", RTS: "RTS", CTS: "CTS", WITHDRAW: "WITHDRAW", ACK: "ACK",
                     GONE: "GONE", CLOSE: "CLOSE", FIN: "FIN"}

#: kind, dtype name length, source rank, tag (user tag; data tag in CTS), nbytes, count,
#: message id, dtype name; padded to 56 bytes so payloads start 8-byte aligned.
HEADER: Final = struct.Struct("<BBxxiiqqq16s4x")
_DTYPE_MAX = 16

#: Caches of both directions (a program sends few dtypes); the hot paths look here first.
DTYPE_FIELDS: dict[str, bytes] = {}
DTYPE_NAMES: dict[bytes, str] = {}


def encode_dtype(name: str) -> bytes:
    """The header field for a dtype name (``numpy.dtype.str``).

    Raises:
        ValueError: if the name does not fit the header.
    """
    raw = DTYPE_FIELDS.get(name)
    if raw is None:
        raw = name.encode("ascii")
        if len(raw) > _DTYPE_MAX:
            raise ValueError(f"dtype name {name!r} is longer than {_DTYPE_MAX} bytes")
        DTYPE_FIELDS[name] = raw
    return raw


def decode_dtype(field: bytes, length: int) -> str:
    """The dtype name of a header's (padded) field."""
    name = DTYPE_NAMES.get(field)
    if name is None:
        name = DTYPE_NAMES[field] = field[:length].decode("ascii")
    return name


class Backoff:
    """How long the progress task waits between polls (mpi4py.futures' ``Backoff``, plus a
    spin phase for latency).

    After activity it polls back to back (delay 0) for ``spin`` seconds, so a reply that
    comes within that window is seen at once; then it sleeps ``tmin`` (``tmax / 1024``),
    doubling up to ``tmax``, so an idle rank costs almost nothing.  Time is passed in.
    """

    __slots__ = ("spin", "spin_until", "tmax", "tmin", "tval")

    def __init__(self, *, tmax: float = 1e-3, spin: float = 1e-3) -> None:
        self.tmax = tmax
        self.tmin = tmax / 1024
        self.spin = spin
        self.spin_until = 0.0
        self.tval = 0.0

    def reset(self, now: float) -> None:
        """Something happened: spin again."""
        self.spin_until = now + self.spin
        self.tval = 0.0

    def delay(self, now: float) -> float:
        """The next wait, in seconds (0: poll again as soon as other tasks ran)."""
        if now < self.spin_until:
            return 0.0
        tval = self.tval
        self.tval = min(self.tmax, max(self.tmin, tval * 2))
        return tval
