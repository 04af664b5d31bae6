"""Pickling task arguments, results and strikes, with errors that say what
went wrong, and signing them when the docket has a signing key.

A signed payload is ``SIGNED`` (one byte that no pickle starts with), the
32-byte HMAC-SHA256 of the pickle under the first key, then the pickle.  The
HMAC also covers what the payload is for (a call, a kept value, a strike), so
one kind cannot stand in for another.  Without a key, payloads are plain
pickles, as before; a signed payload is never unpickled without its key.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import cloudpickle

from .sansio.errors import DocketError, UsageError
from .sansio.strikes import Operator, StrikeInstruction

#: the first byte of a signed payload (version 1); not a pickle opcode
SIGNED = b"\xd1"
_DIGEST = 32
#: what a payload is for, covered by its signature
CALL, VALUE, STRIKE = b"call", b"value", b"strike"
#: the environment variable read when a ``Docket`` gets no ``signing_key``
SIGNING_KEY_VARIABLE = "DOCKET_SIGNING_KEY"

SigningKeys = str | bytes | Sequence[str | bytes]

_NO_KEY = (
    "the payload is signed, but this docket has no signing key "
    f"(give Docket a signing_key or set {SIGNING_KEY_VARIABLE})"
)
_UNSIGNED = "the payload is not signed, and this docket accepts only signed payloads"
_MISMATCH = "the payload's signature does not match the docket's signing key"


class SignatureError(DocketError):
    """A payload's signature is missing or wrong (or the payload is signed and
    the docket has no key): it was not unpickled."""


class Signing:
    """A docket's signing keys: the first signs, every one verifies (so keys
    can be rotated)."""

    __slots__ = ("_macs",)

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys or not all(keys):
            raise UsageError("signing keys must not be empty")
        # keyed once per purpose; each payload copies one (cheaper than keying)
        self._macs = {
            purpose: [hmac.new(key, purpose, "sha256") for key in keys]
            for purpose in (CALL, VALUE, STRIKE)
        }

    @classmethod
    def resolve(
        cls, keys: SigningKeys | None, environ: Mapping[str, str] = os.environ
    ) -> Signing | None:
        """The signing of ``keys`` (one key or a list); with ``None``, of the
        comma-separated keys in ``DOCKET_SIGNING_KEY``; ``None`` without keys."""
        if keys is None:
            found = [k.strip() for k in environ.get(SIGNING_KEY_VARIABLE, "").split(",")]
            keys = [k for k in found if k]
            if not keys:
                return None
        if isinstance(keys, str | bytes):
            keys = [keys]
        if not keys or not all(isinstance(k, str | bytes) for k in keys):
            raise UsageError("signing_key takes a key (str or bytes), a list of keys, or None")
        return cls([k.encode() if isinstance(k, str) else k for k in keys])

    def sign(self, purpose: bytes, data: bytes) -> bytes:
        """``data`` (a pickle) signed with the first key."""
        mac = self._macs[purpose][0].copy()
        mac.update(data)
        return SIGNED + mac.digest() + data

    def verify(self, purpose: bytes, payload: bytes) -> memoryview:
        """The pickle inside ``payload``; raises ``SignatureError`` unless one
        of the keys signed it for ``purpose``."""
        if payload[:1] != SIGNED:
            raise SignatureError(_UNSIGNED)
        view = memoryview(payload)
        signature, data = view[1 : 1 + _DIGEST], view[1 + _DIGEST :]
        for keyed in self._macs[purpose]:
            mac = keyed.copy()
            mac.update(data)
            if hmac.compare_digest(mac.digest(), signature):
                return data
        raise SignatureError(_MISMATCH)


def _unpickle(purpose: bytes, data: bytes, signing: Signing | None) -> Any:
    """Unpickle ``data`` kept for ``purpose``: only once ``signing`` verified
    it; without a key, a signed payload is a clear ``SignatureError``."""
    if signing is not None:
        return cloudpickle.loads(signing.verify(purpose, data))
    try:
        return cloudpickle.loads(data)
    except Exception:
        if data[:1] == SIGNED:
            raise SignatureError(_NO_KEY) from None
        raise


def dumps_call(
    function_name: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    headers: dict[str, str] | None = None,
    signing: Signing | None = None,
) -> bytes:
    """Pickle a call's arguments (and its ``headers``, such as the trace
    context of the code that scheduled it), signed with ``signing``; a value
    that cannot be pickled is the caller's error."""
    try:
        data: bytes = cloudpickle.dumps((args, kwargs, headers) if headers else (args, kwargs))
        return data if signing is None else signing.sign(CALL, data)
    except Exception as error:
        raise UsageError(
            f"the arguments of {function_name} cannot be pickled "
            f"({type(error).__name__}: {error}); nothing was scheduled"
        ) from error


def loads_message(
    payload: bytes, signing: Signing | None = None
) -> tuple[tuple[Any, ...], dict[str, Any], dict[str, str]]:
    """Unpickle a call's arguments and headers; raises ``SignatureError`` for
    a payload ``signing`` does not accept, or whatever unpickling raises."""
    call = _unpickle(CALL, payload, signing)
    if not isinstance(call, tuple) or len(call) not in (2, 3):
        raise TypeError("the message payload is not an (args, kwargs) pair")
    args, kwargs = call[0], call[1]
    headers = call[2] if len(call) == 3 else {}
    if not isinstance(args, tuple) or not isinstance(kwargs, dict) or not isinstance(headers, dict):
        raise TypeError("the message payload is not an (args, kwargs) pair")
    return args, kwargs, headers


def loads_call(
    payload: bytes, signing: Signing | None = None
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Unpickle a call's arguments; raises as ``loads_message`` does."""
    args, kwargs, _ = loads_message(payload, signing)
    return args, kwargs


def dumps_value(value: Any, signing: Signing | None = None) -> bytes | None:
    """Pickle a result or exception to keep, signed with ``signing``;
    ``None`` if it cannot be pickled."""
    try:
        data: bytes = cloudpickle.dumps(value)
    except Exception:
        return None
    return data if signing is None else signing.sign(VALUE, data)


def loads_value(data: bytes, signing: Signing | None = None) -> Any:
    """Unpickle a kept result or exception; raises ``SignatureError`` for
    data ``signing`` does not accept, or whatever unpickling raises."""
    return _unpickle(VALUE, data, signing)


@attrs.frozen(slots=True)
class MalformedStrike:
    """A strike stream entry that is not a usable instruction, and why."""

    reason: str


def dumps_strike(instruction: StrikeInstruction, signing: Signing | None = None) -> bytes:
    """The strike stream's ``i`` field for ``instruction``."""
    data: bytes = cloudpickle.dumps(instruction)
    return data if signing is None else signing.sign(STRIKE, data)


def parse_strike(
    fields: Sequence[Any], signing: Signing | None = None
) -> StrikeInstruction | MalformedStrike:
    """A strike stream entry's flat ``[field, value, ...]`` list as an
    instruction, or as a ``MalformedStrike`` that says why not; never raises."""
    try:
        found = {_raw(f): v for f, v in zip(fields[::2], fields[1::2], strict=True)}
        data = _raw(found[b"i"]) if b"i" in found else None
    except Exception as error:
        return MalformedStrike(f"the entry's fields do not parse ({describe(error)})")
    if data is None:
        return MalformedStrike("the entry lacks the field 'i'")
    try:
        instruction = _unpickle(STRIKE, data, signing)
    except SignatureError as error:
        return MalformedStrike(str(error))
    except Exception as error:
        return MalformedStrike(f"the entry does not unpickle ({describe(error)})")
    if not (
        isinstance(instruction, StrikeInstruction)
        and isinstance(instruction.function, str | None)
        and isinstance(instruction.parameter, str | None)
        and isinstance(instruction.operator, Operator)
        and isinstance(instruction.restore, bool)
    ):
        return MalformedStrike(f"the entry holds a {type(instruction).__name__}, not a strike")
    return instruction


def _raw(value: Any) -> bytes:
    """A field name or value as the server sent it (bytes or text)."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"a {type(value).__name__} field")


def describe(error: BaseException) -> str:
    """``"Type: message"``, the form errors are recorded in; an exception whose
    ``__str__`` itself raises reads as unprintable (a task's exception must
    never stop the worker that records it)."""
    try:
        message = str(error)
    except Exception:
        message = "<unprintable>"
    return f"{type(error).__name__}: {message}"
