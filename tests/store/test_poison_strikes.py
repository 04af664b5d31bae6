"""Malformed strike entries: skipped with a warning and counted, never raised.

Anyone who can write the strike stream (``{<docket name>}:strikes``) can put
entries there that no docket made: a missing field, bytes that do not
unpickle, a pickle that is not a strike, or (with a signing key) a payload the
key did not sign.  Adds go on, workers go on, and real strikes made after the
bad entries still apply.  These run on the server backends (redis-py and GLIDE).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

import anyio
import cloudpickle
import pytest
import redis
from backends import SERVER_BACKENDS
from helpers import finish, make_worker, running
from servers import Server

from docket_core import Disposition, Docket, ExecutionState
from docket_core.lua.base import STRIKE_REFRESH_SECONDS, ScriptedStore
from docket_core.sansio.strikes import Operator, StrikeInstruction
from docket_core.serialization import (
    MalformedStrike,
    Signing,
    dumps_strike,
    parse_strike,
)

pytestmark = pytest.mark.anyio


#: touched by ``_Booby`` when a pickle of it is loaded: it must never be
_LOADED: list[str] = []


def _spring() -> None:
    _LOADED.append("loaded")


class _Booby:
    """A pickle that runs code when loaded (``_spring``)."""

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return _spring, ()


def _instruction(function: str, restore: bool = False) -> StrikeInstruction:
    return StrikeInstruction(
        function=function, parameter=None, operator=Operator.EQUAL, value=None, restore=restore
    )


def _bad_entries(signed: bool) -> list[dict[str, bytes]]:
    """Entries no docket of ours would write."""
    entries = [
        {"x": b"1"},  # the instruction field is missing
        {"i": b"not a pickle"},
        {"i": cloudpickle.dumps(42)},  # a pickle, but not a strike
    ]
    if signed:
        forged = Signing.resolve("someone else's key")
        entries += [
            {"i": cloudpickle.dumps(_instruction("ok"))},  # unsigned
            {"i": dumps_strike(_instruction("ok"), forged)},  # signed with another key
            {"i": cloudpickle.dumps(_Booby())},  # unsigned: must never be loaded
        ]
    return entries


@pytest.mark.backends(*SERVER_BACKENDS)
@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed"])
async def test_bad_strike_entries_are_skipped_and_real_strikes_still_apply(
    backend: str,
    docket_url: str,
    server_for: Callable[[], Server | None],
    signed: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="docket.strikes")
    _LOADED.clear()
    name = f"poison-{uuid.uuid4().hex}"
    key = "a strike key" if signed else None
    ran: list[str] = []

    async def ok(n: int) -> None:
        ran.append(f"ok {n}")

    async def victim() -> None:
        ran.append("victim")

    async with Docket(name=name, url=docket_url, signing_key=key) as producer:
        queued = await producer.add(victim)()
        bad = _bad_entries(signed)
        server = server_for()
        assert server is not None
        direct = redis.Redis(host="127.0.0.1", port=server.port)
        strikes = f"{{{name}}}:strikes"
        for fields in bad:
            direct.xadd(strikes, fields)  # type: ignore[arg-type]
        await producer.strike(victim)  # a real strike, after the bad entries

        # adds go on, and the strike made after the bad entries applies
        assert (await producer.add(ok)(1)).disposition is Disposition.SCHEDULED
        assert (await producer.add(victim)()).disposition is Disposition.STRUCK
        assert isinstance(producer.adapter, ScriptedStore)
        assert producer.adapter.malformed_strikes == len(bad)

        # a fresh process reads the whole stream: its worker runs, and strikes
        async with Docket(name=name, url=docket_url, signing_key=key) as other:
            other.register(ok)
            other.register(victim)
            assert (await other.add(ok)(2)).disposition is Disposition.SCHEDULED
            worker = make_worker(other, schedule_automatic_tasks=False)
            await finish(worker, limit=10)
            assert sorted(ran) == ["ok 1", "ok 2"]
            stored = await other.get_execution(queued.key)
            assert stored is not None and stored.state is ExecutionState.CANCELLED
            assert isinstance(other.adapter, ScriptedStore)
            assert other.adapter.malformed_strikes == len(bad)

            # a bad entry that arrives while a worker runs: the worker goes on
            async with running(make_worker(other, schedule_automatic_tasks=False), limit=10):
                direct.xadd(strikes, {"x": b"late"})
                with anyio.fail_after(STRIKE_REFRESH_SECONDS + 3):  # the worker refreshes
                    while other.adapter.malformed_strikes < len(bad) + 1:
                        await anyio.sleep(0.01)
                await producer.add(ok)(3)
                while len(ran) < 3:
                    await anyio.sleep(0.01)
            assert sorted(ran) == ["ok 1", "ok 2", "ok 3"]

    direct.close()
    assert _LOADED == []
    warnings = [r.getMessage() for r in caplog.records if r.name == "docket.strikes"]
    assert len(warnings) == 2 * len(bad) + 2  # the late entry: the worker's and the producer's
    assert any("lacks the field 'i'" in w for w in warnings)
    if signed:  # with a key, nothing unsigned is unpickled
        assert sum("is not signed" in w for w in warnings) == 2 * (len(bad) - 2)
        assert any("does not match the docket's signing key" in w for w in warnings)
    else:
        assert any("does not unpickle" in w for w in warnings)
        assert any("not a strike" in w for w in warnings)


@pytest.mark.backends(*SERVER_BACKENDS)
async def test_a_signed_strike_is_skipped_by_a_docket_without_the_key(
    docket_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="docket.strikes")
    name = f"poison-{uuid.uuid4().hex}"

    async def job() -> None:
        pass

    async with Docket(name=name, url=docket_url, signing_key=["new", "old"]) as signer:
        await signer.strike(job)
        async with (
            Docket(name=name, url=docket_url, signing_key=["old", "new"]) as rotated,
            Docket(name=name, url=docket_url) as keyless,
        ):
            assert (await rotated.add(job)()).disposition is Disposition.STRUCK
            assert (await keyless.add(job)()).disposition is Disposition.SCHEDULED
            assert isinstance(keyless.adapter, ScriptedStore)
            assert keyless.adapter.malformed_strikes == 1
    assert any("has no signing key" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ([], "lacks the field 'i'"),
        ([b"i"], "fields do not parse"),  # fields that do not pair
        ([b"i", 7], "fields do not parse"),  # not bytes
        ([b"i", b"\x80\x05junk"], "does not unpickle"),
        ([b"i", cloudpickle.dumps("text")], "holds a str, not a strike"),
        (
            [
                b"i",
                cloudpickle.dumps(
                    StrikeInstruction(
                        function=["unhashable"],  # type: ignore[arg-type]
                        parameter=None,
                        operator=Operator.EQUAL,
                        value=None,
                    )
                ),
            ],
            "not a strike",
        ),
    ],
)
def test_parse_strike_names_what_is_wrong(fields: list[Any], reason: str) -> None:
    parsed = parse_strike(fields)
    assert isinstance(parsed, MalformedStrike)
    assert reason in parsed.reason


def test_parse_strike_reads_a_real_entry() -> None:
    signing = Signing.resolve("k")
    instruction = _instruction("job", restore=True)
    assert parse_strike([b"i", dumps_strike(instruction)]) == instruction
    assert parse_strike(["i", dumps_strike(instruction, signing)], signing) == instruction
    unsigned = parse_strike([b"i", dumps_strike(instruction)], signing)
    assert isinstance(unsigned, MalformedStrike)
