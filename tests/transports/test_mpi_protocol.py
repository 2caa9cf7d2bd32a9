"""The MPI transport's pure pieces (no MPI needed): header layout, dtype fields, back-off."""

from __future__ import annotations

import numpy as np
import pytest

from asynccomm.transports import _mpi_protocol as proto
from asynccomm.transports._mpi_protocol import Backoff, decode_dtype, encode_dtype


def test_header_round_trips_and_keeps_payloads_aligned() -> None:
    assert proto.HEADER.size % 8 == 0
    fields = (proto.RTS, 3, 5, 2**31 - 1, 2**40, 2**37, 12345, b"<f8")
    raw = proto.HEADER.pack(*fields)
    kind, dlen, src, tag, nbytes, count, ident, dfield = proto.HEADER.unpack(raw)
    assert (kind, dlen, src, tag, nbytes, count, ident) == fields[:7]
    assert decode_dtype(dfield, dlen) == "<f8"


def test_message_kinds_are_distinct_and_named() -> None:
    kinds = [proto.EAGER, proto.RTS, proto.CTS, proto.WITHDRAW, proto.ACK, proto.GONE,
             proto.CLOSE, proto.FIN]
    assert len(set(kinds)) == len(kinds) and set(proto.KIND_NAMES) == set(kinds)
    assert all(0 < k < 256 for k in kinds)


@pytest.mark.parametrize("dtype", ["|u1", "<f4", "<c16", "|b1", ">i8", "<M8[ns]", "|S10"])
def test_every_travelling_dtype_name_fits_the_header(dtype: str) -> None:
    name = np.dtype(dtype).str
    field = encode_dtype(name)
    padded = proto.HEADER.unpack(proto.HEADER.pack(1, len(field), 0, 0, 0, 0, 0, field))[7]
    assert decode_dtype(padded, len(field)) == name


def test_a_dtype_name_too_long_for_the_header_is_refused() -> None:
    with pytest.raises(ValueError, match="longer than 16 bytes"):
        encode_dtype("<" + "x" * 20)


def test_backoff_spins_after_activity_then_doubles_to_its_cap() -> None:
    backoff = Backoff(tmax=1e-3, spin=5e-3)
    backoff.reset(now=10.0)
    assert [backoff.delay(now) for now in (10.0, 10.001, 10.0049)] == [0.0, 0.0, 0.0]
    delays = [backoff.delay(now=10.006) for _ in range(14)]
    assert delays[0] == 0.0
    assert delays[1] == pytest.approx(1e-3 / 1024)
    assert all(b == pytest.approx(2 * a) or b == pytest.approx(1e-3)
               for a, b in zip(delays[1:], delays[2:], strict=False))
    assert delays[-1] == pytest.approx(1e-3) and max(delays) <= 1e-3
    backoff.reset(now=20.0)
    assert backoff.delay(now=20.0) == 0.0
    assert backoff.delay(now=20.0051) == 0.0  # the first wait after the spin is a poll
    assert backoff.delay(now=20.0052) == pytest.approx(1e-3 / 1024)
