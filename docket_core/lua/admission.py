"""``Admit`` as a call of the ``admit`` script, and its replies as outcomes.

Pure translation, as ``protocol`` does it for the other effects: every
argument is ``bytes``, every reply is decoded from the shapes both clients
return.  An admission runs in the namespace of its controls (``admit_layout``:
the docket's, or the scope's, so that a cluster routes the call to that
slot); consecutive admissions of one namespace share one call
(``admit_fields`` packs one admission; the script answers one reply per
admission).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..sansio.admission import (
    Admit,
    Admitted,
    Control,
    DebouncePolicy,
    RateLimitPolicy,
    Verdict,
)
from ..sansio.effects import StoreEffect
from ..sansio.errors import StoreError
from .entries import pack, text

if TYPE_CHECKING:  # (``protocol`` imports this module: no edge back)
    from .protocol import Layout


def admit_layout(layout: Layout, effect: StoreEffect) -> Layout:
    """The layout an admission's call runs in: ``layout`` (the docket's) for
    controls without a scope, else the scope's (its prefix is the scope's
    namespace, ``layout.namespace(scope)``)."""
    assert isinstance(effect, Admit)
    scope = effect.scope
    return layout if scope is None else type(layout)(scope)


#: the script's name (``docket_core/lua/admit.lua``)
SCRIPT = "admit"


def _number(value: float) -> bytes:
    """A float as exact decimal text (``batch_fields.number``)."""
    return repr(float(value)).encode()


def _request_seq(effect: Admit) -> bytes:
    """The request number, empty without one (``batch_fields.request_seq``)."""
    return b"" if effect.request is None else b"%d" % effect.request.seq


def control_fields(layout: Layout, control: Control) -> list[bytes]:
    """The six fields of one control: kind, namespace, key, then its numbers."""
    head = [
        control.kind.value.encode(),
        layout.namespace(control.scope).encode(),
        control.key.encode(),
    ]
    if isinstance(control, DebouncePolicy):
        return [*head, _number(control.settle), b"", b""]
    if isinstance(control, RateLimitPolicy):
        drop = b"1" if control.drop else b"0"
        return [*head, b"%d" % control.limit, _number(control.per), drop]
    return [*head, _number(control.window), b"", b""]


def admit_fields(layout: Layout, effect: StoreEffect) -> bytes:
    """One admission's twelve fields for the ``admit`` script (the last but
    one: ``1`` when it runs in the docket's own namespace, ``Admit.settles``)."""
    assert isinstance(effect, Admit)
    message = effect.message
    controls = [field for c in effect.controls for field in control_fields(layout, c)]
    return pack(
        [
            effect.delivery_id.encode(),
            message.key.encode(),
            b"%d" % message.generation,
            message.function.encode(),
            message.payload,
            b"%d" % message.attempt,
            _number(effect.now),
            _number(effect.stale_after),
            _number(effect.ttl),
            pack(controls),
            b"1" if effect.settles else b"0",
            _request_seq(effect),
        ]
    )


def admitted_from_reply(effect: Admit, reply: Any) -> Admitted:
    """Decode one admission's reply ``{verdict, at, blocker, repeat}``."""
    try:
        verdict_text, at_text, blocker_text, repeat_text = (text(part) for part in reply)
        verdict = Verdict(verdict_text)
        at = float(at_text) if at_text else None
        blocker = int(blocker_text)
        blocked_by = effect.controls[blocker - 1] if blocker > 0 else None
    except (TypeError, ValueError, IndexError) as error:
        raise StoreError(f"unexpected reply {reply!r} to {effect!r}") from error
    if (verdict is Verdict.RESCHEDULE) != (at is not None):
        raise StoreError(f"unexpected reply {reply!r} to {effect!r}")
    return Admitted(
        delivery_id=effect.delivery_id,
        verdict=verdict,
        at=at,
        blocked_by=blocked_by,
        repeat=repeat_text == "1",
    )
