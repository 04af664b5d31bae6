"""The fields of the store effects that go to the scripts in batches (the
hot ones: ``Finish``, ``Schedule``, the slot steps...), in the two packed
forms the scripts unpack, and the few encodings every call shares: numbers,
the memo header and request number of a remembered effect.  Pure, for both
clients; ``protocol.BATCHED`` names the script of each kind.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..sansio.effects import (
    AcquireSlot,
    ConfirmSlot,
    Finish,
    Park,
    Request,
    Schedule,
    StoreEffect,
    TakeSlot,
)
from ..sansio.partitions import entry_of
from .entries import pack

if TYPE_CHECKING:
    from .protocol import Layout


def number(value: float) -> str:
    """A float as the exact decimal text scripts and scores take."""
    return repr(float(value))


def number_bytes(value: float) -> bytes:
    """``number`` as bytes."""
    return b"%a" % float(value)


def memo_header(request: Request | None) -> bytes:
    """The floor, the memory in ms, the worker and the origin as packed
    fields (``open_memo`` in the prelude); empty for an effect nobody resends."""
    if request is None:
        return b""
    fields = (
        b"%d" % request.floor,
        b"%d" % int(request.remember * 1000),
        request.worker.encode(),
        request.origin.encode(),
    )
    return pack(fields)


def request_seq(effect: StoreEffect) -> bytes:
    """The request number of a remembered effect, empty when it has none."""
    request: Request | None = getattr(effect, "request", None)
    return b"" if request is None else b"%d" % request.seq


#: a field's length as ``pack_batch`` writes it
_LENGTH = struct.Struct("<I").pack
_TEN_ITEMS = b"%b%b" * 10


def pack_batch(fields: Sequence[bytes]) -> bytes:
    """Fields as a hot batch's items carry them (``unpack_batch`` in the
    scripts): each its length (4 bytes, little-endian), then its bytes.  The
    server reads an item with one ``struct.unpack``, four times faster than
    ``pack``'s ``<length>:<bytes>``."""
    return b"".join([part for field in fields for part in (_LENGTH(len(field)), field)])


def unpack_batch(blob: bytes) -> list[bytes]:
    """The inverse of ``pack_batch``; stops at the first field cut short."""
    out: list[bytes] = []
    position = 0
    while position + 4 <= len(blob):
        (length,) = struct.unpack_from("<I", blob, position)
        start = position + 4
        if start + length > len(blob):
            break
        out.append(blob[start : start + length])
        position = start + length
    return out


_TEN_FIELDS = b"%d:%b" * 10


def pack_fields(
    f0: bytes, f1: bytes, f2: bytes, f3: bytes, f4: bytes,
    f5: bytes, f6: bytes, f7: bytes, f8: bytes, f9: bytes,
) -> bytes:  # fmt: skip
    """Ten fields as ``<length>:<bytes>`` each (``unpack_fields`` in the
    scripts): a batch costs the clients one argument to encode, not 10 an
    effect.  Spelled out, as it runs once an effect (three times faster).
    The last field of every batched effect is its request number."""
    return _TEN_FIELDS % (
        len(f0), f0, len(f1), f1, len(f2), f2, len(f3), f3, len(f4), f4,
        len(f5), f5, len(f6), f6, len(f7), f7, len(f8), f8, len(f9), f9,
    )  # fmt: skip


def finish_fields(layout: Layout, effect: StoreEffect) -> bytes:
    """One delivery's fields for the ``finish`` script (``pack_batch``'s form)."""
    assert isinstance(effect, Finish)
    f0 = entry_of(effect.delivery_id).encode()  # (a partition's Finish keeps its prefix)
    f1 = effect.key.encode()
    f2 = b"%d" % effect.generation
    f3 = effect.state.value.encode()
    f4 = number_bytes(effect.now)
    f5 = number_bytes(effect.ttl)
    f6 = (effect.error or "").encode()
    f7 = b"0" if effect.result is None else b"1"
    f8 = effect.result or b""
    f9 = request_seq(effect)
    return _TEN_ITEMS % (
        _LENGTH(len(f0)), f0, _LENGTH(len(f1)), f1, _LENGTH(len(f2)), f2,
        _LENGTH(len(f3)), f3, _LENGTH(len(f4)), f4, _LENGTH(len(f5)), f5,
        _LENGTH(len(f6)), f6, _LENGTH(len(f7)), f7, _LENGTH(len(f8)), f8,
        _LENGTH(len(f9)), f9,
    )  # fmt: skip


def schedule_fields(layout: Layout, effect: StoreEffect) -> bytes:
    """One message's 12 fields for the ``schedule`` script (``pack_batch``'s form)."""
    assert isinstance(effect, Schedule)
    m = effect.message
    return pack_batch(
        (
            m.key.encode(),
            m.function.encode(),
            m.payload,
            number_bytes(m.when),
            b"%d" % m.attempt,
            effect.mode.value.encode(),
            number_bytes(effect.now),
            (effect.acknowledge or "").encode(),
            b"" if effect.expect_generation is None else b"%d" % effect.expect_generation,
            b"" if effect.ended is None else effect.ended.value.encode(),
            (effect.ended_error or "").encode(),
            request_seq(effect),
        )
    )


def acquire_fields(layout: Layout, effect: StoreEffect) -> bytes:
    """One acquisition's fields for the ``acquire`` script (a limit without a
    scope: a scoped one takes the chain, ``TakeSlot``)."""
    assert isinstance(effect, AcquireSlot)
    if layout.namespace(effect.scope) != layout.prefix:
        raise ValueError(f"a scoped limit is taken with TakeSlot, not {effect!r}")
    return pack_fields(
        effect.limit_key.encode(),
        effect.holder.encode(),
        b"%d" % effect.max_concurrent,
        number_bytes(effect.now),
        number_bytes(effect.stale_after),
        effect.delivery_id.encode(),
        effect.message.key.encode(),
        b"%d" % effect.message.generation,
        layout.prefix.encode(),
        request_seq(effect),
    )


def take_fields(layout: Layout, effect: StoreEffect) -> bytes:
    """One take's fields for the ``take`` script (run in the scope's namespace)."""
    assert isinstance(effect, TakeSlot)
    return pack(
        (
            effect.limit_key.encode(),
            effect.holder.encode(),
            b"%d" % effect.max_concurrent,
            number_bytes(effect.now),
            number_bytes(effect.stale_after),
            effect.docket.encode(),
            request_seq(effect),
        )
    )


def confirm_fields(layout: Layout, effect: StoreEffect) -> bytes:
    """One confirmation's fields for the ``confirm`` script."""
    assert isinstance(effect, ConfirmSlot)
    return pack(
        (
            effect.worker.encode(),
            effect.delivery_id.encode(),
            effect.key.encode(),
            b"%d" % effect.generation,
            effect.limit_key.encode(),
            layout.namespace(effect.scope).encode(),
        )
    )


def park_fields(layout: Layout, effect: StoreEffect) -> bytes:
    """One parking's 12 fields for the ``park`` script."""
    assert isinstance(effect, Park)
    m = effect.message
    return pack(
        (
            effect.delivery_id.encode(),
            m.key.encode(),
            m.function.encode(),
            m.payload,
            number_bytes(m.when),
            b"%d" % m.attempt,
            b"%d" % m.generation,
            effect.limit_key.encode(),
            layout.namespace(effect.scope).encode(),
            number_bytes(effect.now),
            number_bytes(effect.retry_at),
            request_seq(effect),
        )
    )
