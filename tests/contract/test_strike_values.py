"""Strikes as pydocket has them as values, on every contract backend:
``Strike``/``Restore`` instructions, ``docket.strike_list``, and a standalone
``StrikeList(url=..., name=...)`` following a docket's strikes from its own
connection.  (What a strike does to adds and runs: ``test_striking.py``.)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import anyio
import pytest

from docket_core import Disposition, Docket, Execution, StrikeList
from docket_core.execution import Operator, Restore, Strike

pytestmark = pytest.mark.anyio


async def send(customer: int, region: str = "eu") -> None:
    pass


def call_of(docket: Docket, *args: object, **kwargs: object) -> Execution:
    return Execution(docket, send, args, dict(kwargs), "k", datetime.now(UTC), 1)


def test_strike_and_restore_are_values() -> None:
    strike = Strike("send", "customer", "==", 42)
    assert (strike.function, strike.parameter, strike.operator, strike.value) == (
        "send",
        "customer",
        Operator.EQUAL,
        42,
    )
    assert strike.direction == "strike" and Restore(None, "x").direction == "restore"
    assert strike == Strike("send", "customer", Operator.EQUAL, 42)
    assert strike != Restore("send", "customer", "==", 42)
    assert strike.call_repr() == "send(customer == 42)"
    assert Strike("send").call_repr() == "send(* == *)"
    assert (
        Strike(None, "region", "between", ("a", "m")).call_repr() == "*(region between ('a', 'm'))"
    )
    assert strike.labels() == {
        "docket.task": "send",
        "docket.parameter": "customer",
        "docket.operator": "==",
        "docket.value": "42",
    }
    with pytest.raises(ValueError):
        Strike("send", "customer", "~", 1)


async def test_a_local_strike_list_takes_instructions_by_update() -> None:
    strikes = StrikeList()  # no URL: local only
    async with strikes:
        assert not strikes.is_stricken({"customer": 1})
        strikes.update(Strike(None, "customer", ">", 10))
        strikes.update(Strike("send", "region", "==", "us"))
        strikes.update(Strike("other"))
        assert strikes.is_stricken({"customer": 11})
        assert not strikes.is_stricken({"customer": 10})
        # a mapping has no task: only strikes naming no task apply to it
        assert not strikes.is_stricken({"region": "us"})
        assert strikes.parameter_strikes == {"customer": {(Operator.GREATER_THAN, 10)}}
        assert strikes.task_strikes == {"send": {"region": {(Operator.EQUAL, "us")}}, "other": {}}
        strikes.update(Restore(None, "customer", ">", 10))
        assert not strikes.is_stricken({"customer": 11})
        with pytest.raises(RuntimeError, match="not connected"):
            await strikes.strike(None, "customer", "==", 1)


async def test_docket_strike_list_follows_the_dockets_strikes(docket: Docket) -> None:
    strike_list = docket.strike_list
    assert not strike_list.is_stricken(call_of(docket, 7))
    await docket.strike(send, "customer", "==", 7)
    await docket.strike(None, "region", "==", "us")
    assert strike_list.is_stricken(call_of(docket, 7))
    assert not strike_list.is_stricken(call_of(docket, 8))
    assert strike_list.is_stricken(call_of(docket, 8, region="us"))
    assert strike_list.is_stricken({"region": "us"})
    assert strike_list.task_strikes == {"send": {"customer": {(Operator.EQUAL, 7)}}}

    # instructions through the docket's list reach the store
    await strike_list.send_instruction(Restore("send", "customer", "==", 7))
    assert not strike_list.is_stricken(call_of(docket, 7))
    assert (await docket.add(send)(7)).disposition is Disposition.SCHEDULED
    await strike_list.strike("send")
    assert (await docket.add(send)(1)).disposition is Disposition.STRUCK
    await strike_list.restore("send")
    await docket.restore(None, "region", "==", "us")
    assert (await docket.add(send)(1, region="us")).disposition is Disposition.SCHEDULED

    # a local update stays in this list: the store never sees it
    strike_list.update(Strike(None, "customer", "==", 5))
    assert strike_list.is_stricken({"customer": 5})
    assert (await docket.add(send)(5)).disposition is Disposition.SCHEDULED


async def test_docket_add_honours_a_condition_of_its_strike_list(docket: Docket) -> None:
    def even(execution: Execution) -> bool:
        return execution.function_name == "send" and execution.args[0] % 2 == 0

    docket.strike_list.add_condition(even)
    assert docket.strike_list.is_stricken(call_of(docket, 2))
    assert (await docket.add(send)(2)).disposition is Disposition.STRUCK
    assert (await docket.add(send)(3)).disposition is Disposition.SCHEDULED
    later = datetime.now(UTC) + timedelta(hours=1)
    (struck, kept) = await docket.add_many(
        [docket.call(send, when=later)(4), docket.call(send, when=later, key="odd")(5)]
    )
    assert (struck.disposition, kept.disposition) == (Disposition.STRUCK, Disposition.SCHEDULED)
    docket.strike_list.remove_condition(even)
    assert (await docket.add(send)(2)).disposition is Disposition.SCHEDULED


async def until(check: Callable[[], bool], limit: float = 5.0) -> None:
    with anyio.fail_after(limit):
        while not check():
            await anyio.sleep(0.05)


async def test_a_standalone_strike_list_follows_a_docket(docket: Docket, docket_url: str) -> None:
    await docket.strike(None, "customer", "==", 1)
    async with StrikeList(url=docket_url, name=docket.name) as strikes:
        # what was struck before it connected is there once it is entered
        assert strikes.is_stricken({"customer": 1})
        await strikes.wait_for_strikes_loaded()
        # what the docket strikes later reaches it
        await docket.strike(None, "customer", "==", 2)
        await until(lambda: strikes.is_stricken({"customer": 2}))
        await docket.restore(None, "customer", "==", 1)
        await until(lambda: not strikes.is_stricken({"customer": 1}))

        # and what it strikes stops the docket's adds
        await strikes.strike("send")
        for _ in range(100):
            if (await docket.add(send)(3)).disposition is Disposition.STRUCK:
                break
            await anyio.sleep(0.05)
        else:
            raise AssertionError("the docket never saw the standalone list's strike")
        await strikes.restore("send")
        with pytest.raises(Exception, match="re-entrant"):
            await strikes.__aenter__()
    with pytest.raises(RuntimeError, match="not connected"):
        await strikes.strike("send")


async def test_a_dockets_strike_list_shows_earlier_strikes_once_entered(
    docket: Docket, make_docket: Callable[..., Awaitable[Docket]]
) -> None:
    await docket.strike(None, "customer", "==", 9)
    other = await make_docket(docket.name)  # another process's Docket, say
    assert other.strike_list.is_stricken({"customer": 9})
