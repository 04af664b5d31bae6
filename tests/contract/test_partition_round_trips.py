"""How many round trips a partitioned docket's batch costs on a server: the
groups of a round, bound for different partitions and with no order between
them, go to the server in one request (``ScriptedStore.execute_apart``: one
pipeline, on a cluster one pipeline to every node at once), not a request per
partition; a group whose calls need an order across slots goes on its own;
a NOSCRIPT or an error reply in one partition is handled as in any batch."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from helpers import keys_in_each_partition
from servers import Servers, command

from docket_core import Docket
from docket_core.lua.base import ScriptedStore
from docket_core.lua.protocol import ScriptCall
from docket_core.partitioned import PartitionedStore
from docket_core.sansio.effects import Cancel, RenewLeases
from docket_core.sansio.errors import StoreError
from docket_core.sansio.inputs import Cancelled, LeasesRenewed
from docket_core.sansio.values import ExecutionState, HeldSlot

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.backends(
        "redis-asyncio",
        "glide_valkey-asyncio",
        "glide_valkey-trio",
        "redis_cluster-asyncio",
        "glide_cluster-asyncio",
        "redis_sentinel-asyncio",
    ),
]


class RoundTrips:
    """The script round trips the stores of a partitioned docket ask their
    client for: ``(store name, method, call count)`` (each store's own
    ``run_calls`` and ``run_calls_apart``, counted and passed on)."""

    def __init__(self, store: PartitionedStore) -> None:
        self.sent: list[tuple[str, str, int]] = []
        for each in (store.home, *store.parts):
            assert isinstance(each, ScriptedStore)
            for method in ("run_calls", "run_calls_apart"):
                self._count(each, method)

    def _count(self, store: ScriptedStore, method: str) -> None:
        original = getattr(store, method)

        async def counted(calls: Sequence[ScriptCall]) -> list[Any]:
            self.sent.append((store.name, method, len(calls)))
            replies: list[Any] = await original(calls)
            return replies

        setattr(store, method, counted)


async def partitioned(make_docket: Any) -> tuple[Docket, PartitionedStore]:
    docket: Docket = await make_docket(partitions=3)
    store = docket.adapter
    assert isinstance(store, PartitionedStore)
    return docket, store


async def later_tasks(docket: Docket, keys: Sequence[str]) -> None:
    async def task() -> None: ...

    docket.register(task)
    for key in keys:
        await docket.add(task, when=datetime.now(UTC) + timedelta(seconds=600), key=key)()


async def test_a_round_over_three_partitions_is_one_round_trip(
    make_docket: Any, server_for: Any
) -> None:
    docket, store = await partitioned(make_docket)
    keys = keys_in_each_partition(3)
    await later_tasks(docket, keys)
    servers: Servers | None = server_for()
    assert servers is not None
    if len(servers.data_ports()) > 1:  # a cluster: the partitions on 3 nodes
        holding = [command(port, "KEYS", f"{{{docket.name}|*") for port in servers.data_ports()]
        assert sum(1 for keys_there in holding if keys_there) == 3, holding
    trips = RoundTrips(store)
    now = time.time()
    outcomes = await store.execute([Cancel(key=key, now=now, ttl=60.0) for key in keys])
    assert outcomes == [Cancelled(key=key, previous=ExecutionState.SCHEDULED) for key in keys]
    # one request from the home store's client, carrying each partition's call
    assert trips.sent == [(store.home.name, "run_calls_apart", 3)]
    for key in keys:  # each partition carried its cancel out
        record = await docket.adapter.get_record(key)
        assert record is not None and record.state == ExecutionState.CANCELLED
    assert (await store.depths(time.time())).scheduled == 0


async def test_a_group_that_spans_slots_goes_on_its_own(make_docket: Any) -> None:
    """A renewal whose first part also renews scoped slots: that part's calls
    need their order across slots (its partition's, then the scope's), so it
    goes alone, beside one request for the other partitions' parts."""
    _, store = await partitioned(make_docket)
    trips = RoundTrips(store)
    scope = f"scope-{uuid.uuid4().hex}"
    renewal = RenewLeases(
        worker="w",
        delivery_ids=("0/1-0", "1/1-0", "2/1-0"),
        slots=(HeldSlot(limit_key="limit", holder="h", scope=scope),),
        now=time.time(),
    )
    (outcome,) = await store.execute([renewal])
    assert isinstance(outcome, LeasesRenewed)
    assert sorted(outcome.lost) == ["0/1-0", "1/1-0", "2/1-0"]  # nobody holds them
    assert sorted(trips.sent) == sorted(
        [
            (store.home.name, "run_calls_apart", 2),  # partitions 1 and 2
            (store.parts[0].name, "run_calls", 2),  # renew, then renew_slots
        ]
    )


async def test_a_script_flush_is_waited_out(make_docket: Any, server_for: Any) -> None:
    docket, store = await partitioned(make_docket)
    keys = keys_in_each_partition(3)
    await later_tasks(docket, keys)
    servers: Servers | None = server_for()
    assert servers is not None
    for port in servers.data_ports():  # as after a restart: no scripts
        assert command(port, "SCRIPT", "FLUSH") == b"OK"
    trips = RoundTrips(store)
    now = time.time()
    outcomes = await store.execute([Cancel(key=key, now=now, ttl=60.0) for key in keys])
    assert outcomes == [Cancelled(key=key, previous=ExecutionState.SCHEDULED) for key in keys]
    assert trips.sent == [(store.home.name, "run_calls_apart", 3)]


async def test_an_error_in_one_partition_fails_the_batch(make_docket: Any) -> None:
    """A partition's call refused by the server (its record is not a hash):
    the batch raises, the other partitions' calls ran all the same (a
    resend answers them with their outcome)."""
    docket, store = await partitioned(make_docket)
    keys = keys_in_each_partition(3)
    await later_tasks(docket, [keys[0], keys[2]])
    broken = store.parts[1]
    assert isinstance(broken, ScriptedStore)
    client: Any = broken.client  # type: ignore[attr-defined]
    await client.set(broken.layout.run_key(keys[1]), "not a hash")
    trips = RoundTrips(store)
    now = time.time()
    with pytest.raises(StoreError):
        await store.execute([Cancel(key=key, now=now, ttl=60.0) for key in keys])
    assert trips.sent == [(store.home.name, "run_calls_apart", 3)]
    for key in (keys[0], keys[2]):
        record = await docket.adapter.get_record(key)
        assert record is not None and record.state == ExecutionState.CANCELLED
