"""A malformed queue entry is a recorded outcome, never a crash: the worker
moves it to the dead letters with the reason (and fails its key when it is the
key's current message), goes on with the rest of its read, and snapshots
still work.  The entries are written straight into a real server's stream, as
an older docket, an operator or a bug could."""

from __future__ import annotations

import io
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import anyio
import pytest
import redis
from servers import Server

from docket_core import Docket, ExecutionState, Worker
from docket_core.cli import main
from docket_core.sansio.effects import BuryMalformed, Request
from docket_core.sansio.inputs import Buried
from docket_core.sansio.values import MalformedEntry

pytestmark = pytest.mark.anyio

SERVERS = pytest.mark.backends(
    "redis-asyncio", "valkey-asyncio", "glide_valkey-asyncio", "glide_valkey-trio"
)


def _worker(docket: Docket) -> Worker:
    return Worker(
        docket,
        name=f"worker-{uuid.uuid4().hex[:8]}",
        minimum_check_interval=timedelta(milliseconds=10),
        reconnection_delay=timedelta(milliseconds=50),
    )


def _client(server_for: Callable[[], Server | None]) -> redis.Redis:
    server = server_for()
    assert server is not None
    return redis.Redis(host="127.0.0.1", port=server.port)  # sync: a side connection


@SERVERS
async def test_malformed_entries_go_to_the_dead_letters_and_the_rest_runs(
    docket: Docket, server_for: Callable[[], Server | None]
) -> None:
    ran: list[int] = []

    async def job(n: int) -> None:
        ran.append(n)

    docket.register(job)
    client = _client(server_for)
    stream = "{" + docket.name + "}:q"
    try:
        await docket.add(job, key="good-1")(1)
        client.xadd(stream, {"k": "lacks-g", "f": "job", "p": b"x", "w": "0", "a": "1"})
        client.xadd(
            stream, {"k": "bad-when", "f": "job", "p": b"x", "w": "soon", "a": "1", "g": "1"}
        )
        client.xadd(stream, {"junk": "yes"})
        client.xadd(
            stream, {"k": b"\xff\xfe", "f": "job", "p": b"", "w": "nan", "a": "1", "g": "1"}
        )
        await docket.add(job, key="good-2")(2)
    finally:
        client.close()

    before = await docket.snapshot()
    assert before.total_tasks == 6
    assert len(before.malformed) == 4
    assert sorted(e.key for e in before.future) == ["good-1", "good-2"]

    worker = _worker(docket)
    with anyio.fail_after(20):
        await worker.run_until_finished()
    assert sorted(ran) == [1, 2]
    assert worker.counters["malformed"] == 4
    assert worker.counters["dead_lettered"] == 4

    total, letters = await docket.dead_letters()
    assert total == 4
    reasons = {letter.key: letter.reason for letter in letters}
    assert "lacks the field(s) g" in reasons["lacks-g"]
    assert "does not parse" in reasons["bad-when"]
    assert None in reasons  # the entry without a key, and the one whose key is not text
    after = await docket.snapshot()
    assert after.total_tasks == 0 and after.malformed == [] and after.dead_letters == 4


@SERVERS
async def test_a_scheduled_message_that_lost_a_field_fails_its_key(
    docket: Docket, server_for: Callable[[], Server | None]
) -> None:
    """The read script used to remove the due entry, then fail at its XADD:
    the message vanished without a record."""

    async def job() -> None:
        raise AssertionError("a malformed message must never run")

    docket.register(job)
    await docket.add(job, key="later", when=_in(3600))()
    client = _client(server_for)
    try:
        prefix = "{" + docket.name + "}"
        assert client.hdel(f"{prefix}:msg:later", "a") == 1
        client.zadd(f"{prefix}:due", {"later": 0})  # due now
    finally:
        client.close()
    worker = _worker(docket)
    with anyio.fail_after(20):
        await worker.run_until_finished()
    execution = await docket.get_execution("later")
    assert execution is not None
    assert execution.state is ExecutionState.FAILED
    record = await docket.adapter.get_record("later")
    assert record is not None and record.error is not None and "field(s) a" in record.error
    total, letters = await docket.dead_letters()
    assert total == 1 and letters[0].key == "later"


@SERVERS
async def test_a_queued_message_replaced_by_a_malformed_one_fails_its_key(
    docket: Docket, server_for: Callable[[], Server | None]
) -> None:
    async def job() -> None:
        raise AssertionError("a malformed message must never run")

    docket.register(job)
    execution = await docket.add(job, key="now")()
    client = _client(server_for)
    stream = "{" + docket.name + "}:q"
    try:
        ((entry_id, fields),) = client.xrange(stream)
        client.xdel(stream, entry_id)
        fields[b"a"] = b"first"
        client.xadd(stream, fields)
    finally:
        client.close()
    with anyio.fail_after(20):
        await _worker(docket).run_until_finished()
    record = await docket.adapter.get_record("now")
    assert record is not None and record.state is ExecutionState.FAILED
    assert record.generation == execution.generation
    assert record.error is not None and "does not parse" in record.error


@SERVERS
async def test_the_dead_letters_command_lists_replays_and_drops(
    docket: Docket, docket_url: str, server_for: Callable[[], Server | None]
) -> None:
    client = _client(server_for)
    stream = "{" + docket.name + "}:q"
    try:
        client.xadd(stream, {"k": "poison", "f": "job", "p": b"x", "w": "x", "a": "1", "g": "1"})
    finally:
        client.close()
    with anyio.fail_after(20):
        await _worker(docket).run_until_finished()

    def run(*argv: str) -> str:
        out = io.StringIO()
        import contextlib

        with contextlib.redirect_stdout(out):
            status = main([*argv, "--url", docket_url, "--docket", docket.name])
        assert status == 0, out.getvalue()
        return out.getvalue()

    listing = await anyio.to_thread.run_sync(run, "dead-letters", "ls")
    assert "1 dead letter(s)" in listing and "poison" in listing
    _, (letter,) = await docket.dead_letters()
    assert letter.entry_id in listing
    assert ("w", b"x") in letter.fields

    replayed = await anyio.to_thread.run_sync(run, "dead-letters", "replay", letter.entry_id)
    assert "Replayed 1" in replayed
    assert (await docket.dead_letters())[0] == 0
    assert len((await docket.snapshot()).malformed) == 1  # back in the queue, as it was
    with anyio.fail_after(20):
        await _worker(docket).run_until_finished()
    assert (await docket.dead_letters())[0] == 1  # and set aside again

    dropped = await anyio.to_thread.run_sync(run, "dead-letters", "drop", "--all")
    assert "Dropped 1" in dropped
    assert (await docket.dead_letters())[0] == 0


async def test_bury_moves_only_an_entry_its_sender_holds(docket: Docket) -> None:
    """The effect itself, on every backend: a delivery the worker holds is
    set aside and fails its key; a second bury, or another worker's, does
    nothing; a resend answers its first outcome."""

    async def job() -> None: ...

    docket.register(job)
    execution = await docket.add(job, key="held")()
    adapter = docket.adapter
    result = await adapter.read(
        worker="w1", count=10, now=time.time(), redelivery_timeout=60, block=0
    )
    (delivery,) = result.deliveries
    entry = MalformedEntry(
        delivery_id=delivery.delivery_id,
        reason="made up for the test",
        key="held",
        generation=execution.generation,
        fields=(("k", b"held"),),
    )

    def bury(worker: str, seq: int) -> BuryMalformed:
        request = Request(origin=f"{worker}#1", worker=worker, seq=seq, floor=0, remember=60)
        return BuryMalformed(worker=worker, entry=entry, now=time.time(), ttl=60, request=request)

    assert await adapter.execute([bury("w2", 1)]) == [
        Buried(delivery_id=delivery.delivery_id, moved=False)
    ]
    first = await adapter.execute([bury("w1", 1)])
    assert first == [Buried(delivery_id=delivery.delivery_id, moved=True, failed_key=True)]
    assert await adapter.execute([bury("w1", 1)]) == first  # a resend
    assert await adapter.execute([bury("w1", 2)]) == [
        Buried(delivery_id=delivery.delivery_id, moved=False)
    ]
    record = await adapter.get_record("held")
    assert record is not None and record.state is ExecutionState.FAILED
    assert record.error == "made up for the test"
    total, (letter,) = await docket.dead_letters()
    assert total == 1 and letter.key == "held" and letter.original_id == delivery.delivery_id
    assert await docket.drop_dead_letters([letter.entry_id]) == 1
    assert await docket.dead_letters() == (0, [])


def _in(seconds: float) -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC) + timedelta(seconds=seconds)


@SERVERS
async def test_a_worker_entry_that_is_not_ours_reads_as_a_worker_without_tasks(
    docket: Docket, server_for: Callable[[], Server | None]
) -> None:
    client = _client(server_for)
    prefix = "{" + docket.name + "}"
    try:
        client.zadd(f"{prefix}:workers", {"odd": time.time(), "older": time.time() - 1})
        client.set(f"{prefix}:worker-tasks:odd", b"not json at all")
        client.set(f"{prefix}:worker-tasks:older", b'{"a": "mapping"}')
    finally:
        client.close()
    workers = {w.name: w.tasks for w in await docket.workers()}
    assert workers == {"odd": set(), "older": set()}
    snapshot = await docket.snapshot()
    assert {w.name for w in snapshot.workers} == {"odd", "older"}


@SERVERS
async def test_garbage_on_the_channels_stops_neither_a_worker_nor_a_waiter(
    docket: Docket, server_for: Callable[[], Server | None]
) -> None:
    release = anyio.Event()

    async def slow() -> str:
        await release.wait()
        return "done"

    docket.register(slow)
    execution = await docket.add(slow, key="slow")()
    worker = _worker(docket)
    client = _client(server_for)
    prefix = "{" + docket.name + "}"
    try:
        with anyio.fail_after(20):
            async with anyio.create_task_group() as group:
                group.start_soon(worker.run_forever)
                results: list[str] = []

                async def wait() -> None:
                    results.append(await execution.get_result())

                group.start_soon(wait)
                while worker.running_tasks == 0:
                    await anyio.sleep(0.01)
                for garbage in (b"not json", b"[1, 2]", b'{"key": 5}', b'{"generation": "x"}'):
                    client.publish(f"{prefix}:cancel", garbage)
                    client.publish(f"{prefix}:events:slow", garbage)
                client.publish(f"{prefix}:events:slow", b'{"no": "type"}')
                await anyio.sleep(0.2)
                release.set()
                while not results:
                    await anyio.sleep(0.01)
                assert results == ["done"]
                group.cancel_scope.cancel()
    finally:
        client.close()


@SERVERS
async def test_a_waiter_that_missed_the_final_event_still_returns(
    docket: Docket, server_for: Callable[[], Server | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An event published while the subscriber reconnected is lost: the
    waiter looks at the record now and then."""
    from docket_core import execution as execution_module

    monkeypatch.setattr(execution_module, "RECHECK_SECONDS", 0.05)

    async def job() -> None: ...

    docket.register(job)
    execution = await docket.add(job, key="quiet", when=_in(3600))()
    client = _client(server_for)
    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                outcome: list[object] = []

                async def wait() -> None:
                    outcome.append(await execution.get_result())

                group.start_soon(wait)
                await anyio.sleep(0.1)
                # the record ends with no event published
                client.hset("{" + docket.name + "}:run:quiet", "state", "completed")
                while not outcome:
                    await anyio.sleep(0.01)
                assert outcome == [None]
    finally:
        client.close()


@SERVERS
async def test_bytes_that_are_not_text_and_deep_json_stop_no_worker(
    docket: Docket, server_for: Callable[[], Server | None]
) -> None:
    """Entries a blocked read brings go through the same parse: a field name
    that is not UTF-8, or JSON nested past the recursion limit, is malformed."""
    ran: list[int] = []

    async def job(n: int) -> None:
        ran.append(n)

    docket.register(job)
    worker = _worker(docket)
    client = _client(server_for)
    prefix = "{" + docket.name + "}"
    try:
        with anyio.fail_after(20):
            async with anyio.create_task_group() as group:
                group.start_soon(worker.run_forever)
                await docket.add(job, key="first")(1)
                while ran != [1]:
                    await anyio.sleep(0.01)
                await anyio.sleep(0.05)  # the worker waits in a blocked read now
                client.xadd(f"{prefix}:q", {b"\xff\xfe": b"x"})
                client.publish(f"{prefix}:cancel", b"[" * 100_000)
                client.publish(f"{prefix}:events:second", b"{" * 100_000)
                while worker.counters["dead_lettered"] < 1:
                    await anyio.sleep(0.01)
                await docket.add(job, key="second")(2)
                while ran != [1, 2]:
                    await anyio.sleep(0.01)
                group.cancel_scope.cancel()
    finally:
        client.close()
    total, (letter,) = await docket.dead_letters()
    assert total == 1 and "unreadable" in letter.reason


async def test_a_replayed_dead_letter_that_reads_runs_its_key_again(docket: Docket) -> None:
    """A message set aside that a later docket can read (say, after an
    upgrade) runs when replayed: its key, failed by the bury, is queued again."""
    ran: list[int] = []

    async def job(n: int) -> None:
        ran.append(n)

    docket.register(job)
    execution = await docket.add(job, key="revive")(7)
    adapter = docket.adapter
    result = await adapter.read(
        worker="w1", count=10, now=time.time(), redelivery_timeout=60, block=0
    )
    (delivery,) = result.deliveries
    m = delivery.message
    fields = (
        ("k", m.key.encode()),
        ("f", m.function.encode()),
        ("p", m.payload),
        ("w", repr(m.when).encode()),
        ("a", b"%d" % m.attempt),
        ("g", b"%d" % m.generation),
    )
    entry = MalformedEntry(
        delivery_id=delivery.delivery_id,
        reason="an older docket could not read it",
        key=m.key,
        generation=m.generation,
        fields=fields,
    )
    request = Request(origin="w1#1", worker="w1", seq=1, floor=0, remember=60)
    bury = BuryMalformed(worker="w1", entry=entry, now=time.time(), ttl=60, request=request)
    assert await adapter.execute([bury]) == [
        Buried(delivery_id=delivery.delivery_id, moved=True, failed_key=True)
    ]
    await execution.sync()
    assert execution.state is ExecutionState.FAILED

    assert await docket.replay_dead_letters() == 1
    assert await docket.dead_letters() == (0, [])
    with anyio.fail_after(20):
        await _worker(docket).run_until_finished()
    assert ran == [7]
    await execution.sync()
    assert execution.state is ExecutionState.COMPLETED
