"""``docket_core.serialization`` on its own: what goes into the store as bytes
comes back as it went in, and what cannot says why."""

from __future__ import annotations

import threading
from typing import Any

import cloudpickle
import pytest

from docket_core.sansio.errors import UsageError
from docket_core.sansio.strikes import Operator, StrikeInstruction
from docket_core.serialization import (
    CALL,
    STRIKE,
    VALUE,
    MalformedStrike,
    SignatureError,
    Signing,
    describe,
    dumps_call,
    dumps_strike,
    dumps_value,
    loads_call,
    loads_message,
    loads_value,
    parse_strike,
)

SIGNING = Signing.resolve("k1")
OTHER = Signing.resolve("k2")
ROTATED = Signing.resolve(["k2", "k1"])
SIGNINGS = [None, SIGNING]
STRIKE_OF = StrikeInstruction(function="f", parameter="n", operator=Operator.BETWEEN, value=(1, 2))
#: an instruction whose function is not a name (attrs does not check types)
NUMBERED = StrikeInstruction(function=1, parameter=None, operator=Operator.EQUAL, value=0)  # type: ignore[arg-type]


@pytest.mark.parametrize("signing", SIGNINGS, ids=["plain", "signed"])
def test_a_call_comes_back_with_its_headers(signing: Signing | None) -> None:
    args, kwargs, headers = (1, "two"), {"three": [3]}, {"traceparent": "00-ab-cd-01"}
    payload = dumps_call("task", args, kwargs, headers, signing)
    assert loads_message(payload, signing) == (args, kwargs, headers)
    assert loads_call(payload, signing) == (args, kwargs)


def test_a_call_without_headers_has_empty_ones() -> None:
    payload = dumps_call("task", (1,), {})
    assert cloudpickle.loads(payload) == ((1,), {})  # no headers: the pydocket shape
    assert loads_message(payload) == ((1,), {}, {})


def test_an_unpicklable_argument_is_the_callers_error() -> None:
    with pytest.raises(UsageError, match=r"arguments of task cannot be pickled.*nothing"):
        dumps_call("task", (threading.Lock(),), {})


@pytest.mark.parametrize(
    "shape",
    [[(), {}], ((),), ((), {}, {}, {}), ([], {}), ((), []), ((), {}, [])],
    ids=["list", "one", "four", "args list", "kwargs list", "headers list"],
)
def test_a_payload_of_another_shape_is_refused(shape: Any) -> None:
    with pytest.raises(TypeError, match="not an"):
        loads_message(cloudpickle.dumps(shape))


def test_a_payload_that_is_not_a_pickle_raises_what_unpickling_raises() -> None:
    with pytest.raises(Exception) as caught:
        loads_call(b"not a pickle")
    assert not isinstance(caught.value, SignatureError)


@pytest.mark.parametrize("signing", SIGNINGS, ids=["plain", "signed"])
def test_a_value_comes_back(signing: Signing | None) -> None:
    for value in (None, 42, {"a": (1, 2)}, ValueError("boom")):
        data = dumps_value(value, signing)
        assert data is not None
        back = loads_value(data, signing)
        assert repr(back) == repr(value)


def test_a_value_that_cannot_be_pickled_is_not_kept() -> None:
    assert dumps_value(threading.Lock()) is None
    assert dumps_value(threading.Lock(), SIGNING) is None


def test_a_signed_payload_needs_a_key_that_signed_it() -> None:
    payload = dumps_call("task", (1,), {}, None, SIGNING)
    with pytest.raises(SignatureError, match="no signing key"):
        loads_call(payload)
    with pytest.raises(SignatureError, match="does not match"):
        loads_call(payload, OTHER)
    assert loads_call(payload, ROTATED) == ((1,), {})
    with pytest.raises(SignatureError, match="not signed"):
        loads_call(dumps_call("task", (1,), {}), SIGNING)


def test_a_signature_is_for_one_purpose() -> None:
    assert SIGNING is not None
    signed = SIGNING.sign(CALL, cloudpickle.dumps(((), {})))
    with pytest.raises(SignatureError):
        loads_value(signed, SIGNING)
    with pytest.raises(SignatureError):
        SIGNING.verify(STRIKE, signed)
    assert bytes(SIGNING.verify(CALL, signed)) == cloudpickle.dumps(((), {}))
    assert VALUE not in (CALL, STRIKE)


@pytest.mark.parametrize("signing", SIGNINGS, ids=["plain", "signed"])
@pytest.mark.parametrize("as_text", [False, True], ids=["bytes", "text names"])
def test_a_strike_entry_comes_back(signing: Signing | None, as_text: bool) -> None:
    name: Any = "i" if as_text else b"i"
    fields = [b"other", b"x", name, dumps_strike(STRIKE_OF, signing)]
    assert parse_strike(fields, signing) == STRIKE_OF


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ([b"i"], "do not parse"),
        ([b"x", b"y"], "lacks the field 'i'"),
        ([b"i", 7], "do not parse"),
        ([b"i", b"garbage"], "does not unpickle"),
        ([b"i", cloudpickle.dumps("a string")], "holds a str"),
        ([b"i", cloudpickle.dumps(NUMBERED)], "holds a StrikeInstruction, not a strike"),
    ],
    ids=["odd", "missing", "number", "garbage", "wrong type", "wrong field type"],
)
def test_a_bad_strike_entry_says_why_and_never_raises(fields: list[Any], reason: str) -> None:
    malformed = parse_strike(fields)
    assert isinstance(malformed, MalformedStrike)
    assert reason in malformed.reason


def test_a_strike_signed_by_another_key_is_malformed() -> None:
    fields = [b"i", dumps_strike(STRIKE_OF, OTHER)]
    malformed = parse_strike(fields, SIGNING)
    assert isinstance(malformed, MalformedStrike) and "does not match" in malformed.reason
    unsigned = parse_strike([b"i", dumps_strike(STRIKE_OF)], SIGNING)
    assert isinstance(unsigned, MalformedStrike) and "not signed" in unsigned.reason


def test_errors_are_described_by_type_and_message() -> None:
    assert describe(ValueError("bad value")) == "ValueError: bad value"
    assert describe(KeyError("k")) == "KeyError: 'k'"


@pytest.mark.parametrize("keys", ["", [], [b""], [1]], ids=["empty", "none", "empty key", "int"])
def test_unusable_keys_are_refused(keys: Any) -> None:
    with pytest.raises(UsageError):
        Signing.resolve(keys)


def test_without_keys_there_is_no_signing() -> None:
    assert Signing.resolve(None, environ={}) is None
    assert Signing.resolve(None, environ={"DOCKET_SIGNING_KEY": " , "}) is None
    assert Signing.resolve(None, environ={"DOCKET_SIGNING_KEY": "a, b"}) is not None
