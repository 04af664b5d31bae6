"""Signed payloads: with a signing key, nothing a docket did not sign is unpickled.

The contract tests run on every backend: task arguments (plain adds, batches,
perpetual follow-ups), results and exceptions are signed; a message whose
payload is unsigned or signed with another key ends FAILED with the reason,
without being unpickled; a result that is not signed with the reader's keys
raises ``SignatureError`` from ``get_result``.  Strikes are covered in
``tests/store/test_poison_strikes.py``.
"""

from __future__ import annotations

import pickletools
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import anyio
import pytest
from helpers import make_worker

from docket_core import Docket, ExecutionState, Perpetual, Timeout, UsageError
from docket_core.serialization import (
    CALL,
    SIGNED,
    STRIKE,
    VALUE,
    SignatureError,
    Signing,
    dumps_call,
    dumps_value,
    loads_message,
    loads_value,
)

pytestmark = pytest.mark.anyio

MakeDocket = Callable[..., Any]

#: touched by ``_Booby`` when a pickle of it is loaded: with a key it never is
_LOADED: list[str] = []


def _spring() -> None:
    _LOADED.append("loaded")


class _Booby:
    """A pickle that runs code when loaded (``_spring``)."""

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return _spring, ()


@pytest.fixture(autouse=True)
def _no_key_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DOCKET_SIGNING_KEY", raising=False)
    _LOADED.clear()


async def _drain(docket: Docket) -> None:
    with anyio.fail_after(10):
        await make_worker(docket, schedule_automatic_tasks=False).run_until_finished()


# -- the format ------------------------------------------------------------------------


def test_the_signed_marker_is_not_a_pickle_opcode() -> None:
    assert all(op.code.encode("latin-1") != SIGNED for op in pickletools.opcodes)


def test_keys_come_from_the_argument_or_the_environment() -> None:
    assert Signing.resolve(None, {}) is None
    assert Signing.resolve(None, {"DOCKET_SIGNING_KEY": " , "}) is None
    payload = Signing.resolve("old").sign(CALL, b"data")  # type: ignore[union-attr]
    rotated = Signing.resolve(None, {"DOCKET_SIGNING_KEY": "new, old"})
    assert rotated is not None
    assert bytes(rotated.verify(CALL, payload)) == b"data"  # all keys verify
    signed = rotated.sign(CALL, b"data")  # the first signs
    new = Signing.resolve([b"new"])
    assert new is not None and bytes(new.verify(CALL, signed)) == b"data"
    with pytest.raises(SignatureError):
        Signing.resolve("old").verify(CALL, signed)  # type: ignore[union-attr]
    with pytest.raises(UsageError):
        Signing.resolve([])
    with pytest.raises(UsageError):
        Signing.resolve(["key", ""])


def test_a_signature_covers_the_data_and_its_purpose() -> None:
    signing = Signing.resolve("key")
    assert signing is not None
    signed = signing.sign(VALUE, b"some pickle")
    assert signed[:1] == SIGNED and len(signed) == 1 + 32 + len(b"some pickle")
    assert bytes(signing.verify(VALUE, signed)) == b"some pickle"
    for tampered in (signed[:-1] + b"!", signed[:20], SIGNED):
        with pytest.raises(SignatureError, match="does not match"):
            signing.verify(VALUE, tampered)
    for purpose in (CALL, STRIKE):
        with pytest.raises(SignatureError, match="does not match"):
            signing.verify(purpose, signed)
    with pytest.raises(SignatureError, match="is not signed"):
        signing.verify(VALUE, b"some pickle")


def test_a_signed_payload_read_without_a_key_fails_clearly() -> None:
    signing = Signing.resolve("key")
    call = dumps_call("f", (1,), {"x": 2}, None, signing)
    assert loads_message(call, signing) == ((1,), {"x": 2}, {})
    with pytest.raises(SignatureError, match="has no signing key"):
        loads_message(call)
    value = dumps_value([1, 2], signing)
    assert value is not None and loads_value(value, signing) == [1, 2]
    with pytest.raises(SignatureError, match="has no signing key"):
        loads_value(value)
    with pytest.raises(SignatureError, match="is not signed"):
        loads_value(dumps_value(_Booby()) or b"", signing)
    assert _LOADED == []
    # without keys, payloads are plain pickles, as before
    assert loads_message(dumps_call("f", (1,), {})) == ((1,), {}, {})


# -- end to end, on every backend --------------------------------------------------------


async def test_a_signed_docket_signs_arguments_and_results(make_docket: MakeDocket) -> None:
    docket: Docket = await make_docket(signing_key="key")
    steps: list[int] = []

    async def double(n: int) -> int:
        return 2 * n

    async def fail() -> None:
        raise ValueError("no")

    async def slow(timeout: Timeout = Timeout(timedelta(milliseconds=20))) -> None:
        await anyio.sleep(5)

    async def step(n: int, perpetual: Perpetual = Perpetual(every=timedelta(0))) -> None:
        steps.append(n)
        if n >= 2:
            perpetual.cancel()
        else:
            perpetual.perpetuate(n + 1)  # the follow-up's arguments are signed too

    doubled = await docket.add(double)(21)
    failed = await docket.add(fail)()
    timed_out = await docket.add(slow)()
    await docket.add(step)(0)
    async with docket.batch() as batch:
        batched = batch.add(double)(5)
    record = await docket.adapter.get_record(doubled.key)
    assert record is not None and record.payload[:1] == SIGNED
    await _drain(docket)

    assert steps == [0, 1, 2]
    assert await doubled.get_result() == 42
    assert await batched.get_result() == 10
    record = await docket.adapter.get_record(doubled.key)
    assert record is not None and record.result is not None and record.result[:1] == SIGNED
    with pytest.raises(ValueError, match="no"):
        await failed.get_result()
    with pytest.raises(TimeoutError, match="timed out"):
        await timed_out.get_result()


async def test_payloads_it_did_not_sign_are_poison(make_docket: MakeDocket) -> None:
    worker_side: Docket = await make_docket(signing_key=["new", "old"])
    name = worker_side.name
    ran: list[Any] = []

    async def job(value: Any) -> None:
        ran.append(value)

    worker_side.register(job)
    keyless: Docket = await make_docket(name)
    unsigned = await keyless.add(job)(_Booby())  # would run code in the worker if loaded
    foreign: Docket = await make_docket(name, signing_key="someone else's")
    forged = await foreign.add(job)(1)
    rotated: Docket = await make_docket(name, signing_key="old")
    fine = await rotated.add(job)(2)  # signed with a key the worker still verifies
    await _drain(worker_side)

    assert ran == [2] and _LOADED == []
    reasons = {
        unsigned.key: "the payload is not signed, and this docket accepts only signed payloads",
        forged.key: "the payload's signature does not match the docket's signing key",
    }
    for key, reason in reasons.items():
        execution = await worker_side.get_execution(key)  # does not load the payload either
        assert execution is not None
        assert execution.state is ExecutionState.FAILED
        assert execution.error == reason
    assert _LOADED == []
    stored = await worker_side.get_execution(fine.key)
    assert stored is not None and stored.state is ExecutionState.COMPLETED

    # and a signed message reaching a worker without a key fails clearly too
    signed = await rotated.add(job)(3)
    await _drain(keyless)
    execution = await keyless.get_execution(signed.key)
    assert execution is not None and execution.state is ExecutionState.FAILED
    assert execution.error is not None and "has no signing key" in execution.error
    assert ran == [2]


async def test_results_it_did_not_sign_are_not_unpickled(make_docket: MakeDocket) -> None:
    keyless: Docket = await make_docket()
    name = keyless.name

    async def booby() -> _Booby:
        return _Booby()

    async def broken() -> None:
        raise RuntimeError("broken")

    async def answer() -> int:
        return 42

    keyless.register(booby)
    keyless.register(broken)
    trap = await keyless.add(booby)()
    failure = await keyless.add(broken)()
    await _drain(keyless)  # results kept unsigned
    _LOADED.clear()  # (the worker's own pickling does not load)

    keyed: Docket = await make_docket(name, signing_key="key")
    keyed.register(answer)
    for key in (trap.key, failure.key):
        execution = await keyed.get_execution(key)
        assert execution is not None
        with pytest.raises(SignatureError, match="is not signed"):
            await execution.get_result()
    with pytest.raises(SignatureError, match="broken"):  # the recorded error is named
        await (await keyed.get_execution(failure.key) or failure).get_result()
    assert _LOADED == []

    answered = await keyed.add(answer)()
    await _drain(keyed)
    assert await answered.get_result() == 42
    unkeyed = await keyless.get_execution(answered.key)
    assert unkeyed is not None
    with pytest.raises(SignatureError, match="has no signing key"):
        await unkeyed.get_result()
    rotated: Docket = await make_docket(name, signing_key=["newer", "key"])
    assert await (await rotated.get_execution(answered.key) or answered).get_result() == 42


async def test_the_environment_variable_holds_the_keys(
    make_docket: MakeDocket, monkeypatch: pytest.MonkeyPatch
) -> None:
    producer: Docket = await make_docket(signing_key="old")

    async def answer() -> int:
        return 42

    execution = await producer.add(answer)()
    monkeypatch.setenv("DOCKET_SIGNING_KEY", "new,old")
    worker_side: Docket = await make_docket(producer.name)
    assert worker_side.signing is not None
    worker_side.register(answer)
    await _drain(worker_side)
    stored = await worker_side.get_execution(execution.key)
    assert stored is not None and await stored.get_result() == 42
    with pytest.raises(SignatureError, match="does not match"):
        await execution.get_result()  # signed with "new", which the producer lacks
