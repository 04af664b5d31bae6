"""``SlotStep`` (``docket_core.sansio.local_slots``) as ``step`` script calls,
and their replies as ``SlotStepped`` outcomes (pure, for both clients).

A step travels as one item of 21 fields a take (one item when it has none),
in the binary form of the hot batches (``batch_fields.pack_batch``: each field
its length, 4 bytes little-endian, then its bytes), all the steps of a call
in its one argument (``unpack_batch`` in the script):

- '1' for a step's first item, '0' for each further take of the step;
- its finish: delivery id, key, generation, state ('' without a finish),
  ttl, error, has_result, result (empty in the further items);
- its release: limit ('' without a release), holder (empty likewise);
- a take: limit ('' without one), holder, max, delivery id, key, generation;
- stale_after, now, the request number, renew ('1' or '0': ``SlotStep.renew``).

Every part runs in the docket's own namespace: a release of another is
refused here, before anything is sent.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

from ..sansio.effects import Finish, ReleaseSlot, StoreEffect
from ..sansio.local_slots import SlotStep, SlotStepped, SlotTake
from .entries import text

if TYPE_CHECKING:
    from .protocol import Layout

_LENGTH = struct.Struct("<I").pack
_EMPTY = _LENGTH(0)
_ONE, _ZERO = _LENGTH(1) + b"1", _LENGTH(1) + b"0"
_NO_FINISH = _EMPTY * 8
_NO_RELEASE = _EMPTY * 2
_NO_TAKE = _EMPTY * 6
_TWO, _THREE, _SIX, _EIGHT = b"%b%b" * 2, b"%b%b" * 3, b"%b%b" * 6, b"%b%b" * 8
_RENEW = {True: _ONE, False: _ZERO}
#: a run's end that hands its slot to one take (a drain's step): one format
_WHOLE = b"%b%b" * 19 + b"%b"
#: the settings a worker's steps repeat (ttl, stale_after) as written
_SETTINGS: dict[float, bytes] = {}


def _setting(value: float) -> bytes:
    """A setting as written (``%a``), kept: few settings, many steps."""
    written = _SETTINGS.get(value)
    if written is None:
        if len(_SETTINGS) > 64:
            _SETTINGS.clear()
        written = _SETTINGS[value] = b"%a" % float(value)
    return written


def step_fields(layout: Layout, effect: StoreEffect) -> bytes:
    """One step's items for the ``step`` script (spelled out: it runs once a
    task)."""
    assert isinstance(effect, SlotStep)
    finish, release, takes = effect.finish, effect.release, effect.takes
    if finish is not None and release is not None and len(takes) == 1:
        return _hand_on_fields(layout, effect, finish, release, takes[0])
    if finish is None:
        head = _ONE + _NO_FINISH
    else:
        f0, f1 = finish.delivery_id.encode(), finish.key.encode()
        f2, f3 = b"%d" % finish.generation, finish.state.value.encode()
        f4, f5 = _setting(finish.ttl), (finish.error or "").encode()
        f6, f7 = (b"0", b"") if finish.result is None else (b"1", finish.result)
        head = _ONE + _EIGHT % (
            _LENGTH(len(f0)), f0, _LENGTH(len(f1)), f1, _LENGTH(len(f2)), f2,
            _LENGTH(len(f3)), f3, _LENGTH(len(f4)), f4, _LENGTH(len(f5)), f5,
            _LENGTH(len(f6)), f6, _LENGTH(len(f7)), f7,
        )  # fmt: skip
    if release is None:
        head += _NO_RELEASE
    else:
        if release.scope is not None and "{" + release.scope + "}" != layout.prefix:
            raise ValueError(f"a step releases a slot of its docket's own only: {release!r}")
        limit, holder = release.limit_key.encode(), release.holder.encode()
        head += _TWO % (_LENGTH(len(limit)), limit, _LENGTH(len(holder)), holder)
    stale, now = _setting(effect.stale_after), b"%a" % float(effect.now)
    request = effect.request
    seq = b"" if request is None else b"%d" % request.seq
    tail = _THREE % (
        _LENGTH(len(stale)), stale, _LENGTH(len(now)), now, _LENGTH(len(seq)), seq,
    ) + _RENEW[effect.renew]  # fmt: skip
    if not takes:
        return head + _NO_TAKE + tail
    items = []
    for take in takes:
        limit, holder = take.limit_key.encode(), take.holder.encode()
        most, did = b"%d" % take.max_concurrent, take.delivery_id.encode()
        key, gen = take.message.key.encode(), b"%d" % take.message.generation
        fields = _SIX % (
            _LENGTH(len(limit)), limit, _LENGTH(len(holder)), holder, _LENGTH(len(most)), most,
            _LENGTH(len(did)), did, _LENGTH(len(key)), key, _LENGTH(len(gen)), gen,
        )  # fmt: skip
        items.append(head + fields + tail)
        head = _ZERO + _NO_FINISH + _NO_RELEASE
    return b"".join(items)


def _hand_on_fields(
    layout: Layout, effect: SlotStep, finish: Finish, release: ReleaseSlot, take: SlotTake
) -> bytes:
    """``step_fields`` of a run's end that hands its slot to one take, in
    one format (as ``step_fields`` lays it out)."""
    if release.scope is not None and "{" + release.scope + "}" != layout.prefix:
        raise ValueError(f"a step releases a slot of its docket's own only: {release!r}")
    f0, f1 = finish.delivery_id.encode(), finish.key.encode()
    f2, f3 = b"%d" % finish.generation, finish.state.value.encode()
    f4, f5 = _setting(finish.ttl), (finish.error or "").encode()
    f6, f7 = (b"0", b"") if finish.result is None else (b"1", finish.result)
    r0, r1 = release.limit_key.encode(), release.holder.encode()
    t0, t1 = take.limit_key.encode(), take.holder.encode()
    t2, t3 = b"%d" % take.max_concurrent, take.delivery_id.encode()
    message = take.message
    t4, t5 = message.key.encode(), b"%d" % message.generation
    stale, now = _setting(effect.stale_after), b"%a" % float(effect.now)
    request = effect.request
    seq = b"" if request is None else b"%d" % request.seq
    n = _LENGTH
    return _ONE + _WHOLE % (
        n(len(f0)), f0, n(len(f1)), f1, n(len(f2)), f2, n(len(f3)), f3,
        n(len(f4)), f4, n(len(f5)), f5, n(len(f6)), f6, n(len(f7)), f7,
        n(len(r0)), r0, n(len(r1)), r1,
        n(len(t0)), t0, n(len(t1)), t1, n(len(t2)), t2, n(len(t3)), t3, n(len(t4)), t4,
        n(len(t5)), t5,
        n(len(stale)), stale, n(len(now)), now, n(len(seq)), seq, _RENEW[effect.renew],
    )  # fmt: skip


def stepped_from_reply(effect: SlotStep, reply: Any) -> SlotStepped:
    """The outcome of one step from its reply: recorded (-1 without a
    finish), woken, wake, then one answer a take (``TAKE_*``)."""
    recorded, woken, wake, *takes = reply
    answers = (int(takes[0]),) if len(takes) == 1 else tuple(int(answer) for answer in takes)
    if len(answers) != len(effect.takes):
        raise ValueError(f"a step of {len(effect.takes)} takes answered {reply!r}")
    return SlotStepped(
        recorded=None if effect.finish is None else int(recorded) == 1,
        woken=int(woken),
        wake=text(wake) or None,
        takes=answers,
    )
