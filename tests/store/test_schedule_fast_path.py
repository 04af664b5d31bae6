"""The ``schedule`` script's fast path (a Docket's add of a new key, due now)
does exactly what its body does: each call here runs once through the whole
script and once through its body alone (the text after the fast path), on
two dockets of one server that start alike, and both leave the same keys,
answer the same, publish the same events, or fail alike.  A check of the
server's command counts proves which path a call took."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from servers import Server

from docket_core.lua import PRELUDE_GOES_HERE, SCRIPTS
from docket_core.lua.batch_fields import pack_batch

pytestmark = pytest.mark.backends("memory-asyncio")

GROUP = "docket-workers"
WHOLE = SCRIPTS["schedule"]
HEAD, MARKER, BODY = WHOLE.partition(PRELUDE_GOES_HERE)


@pytest.fixture(params=["redis", "valkey"])
def client(request: pytest.FixtureRequest) -> Iterator[redis.Redis]:
    server: Server = request.getfixturevalue(f"{request.param}_server")
    connection = redis.Redis(host="127.0.0.1", port=server.port)
    try:
        yield connection
    finally:
        connection.close()


def message(
    key: str,
    *,
    due_in: float = 0.0,
    mode: str = "add",
    acknowledge: str = "",
    expect: str = "",
    ended: str = "",
) -> tuple[bytes, ...]:
    now = time.time()
    return (
        key.encode(),
        b"job",
        b"\x80\x05payload",
        repr(now + due_in).encode(),
        b"1",
        mode.encode(),
        repr(now).encode(),
        acknowledge.encode(),
        expect.encode(),
        ended.encode(),
        b"",
        b"",
    )


class Twins:
    """Two dockets on one server: ``fast`` runs the whole script, ``body``
    only the text after its fast path."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        tag = uuid.uuid4().hex[:8]
        self.prefixes = {"fast": f"{{fast-{tag}}}", "body": f"{{body-{tag}}}"}
        self.scripts = {"fast": WHOLE, "body": BODY}
        self.pubsub = client.pubsub()
        self.pubsub.psubscribe(*(f"{prefix}:events:*" for prefix in self.prefixes.values()))
        self.pubsub.get_message(timeout=1)
        self.pubsub.get_message(timeout=1)

    def call(self, which: str, blob: bytes, count: str = "1", memo: str = "") -> Any:
        prefix = self.prefixes[which]
        try:
            return self.client.eval(
                self.scripts[which], 2, f"{prefix}:q", f"{prefix}:fence",
                prefix, GROUP, memo, blob, count,
            )  # fmt: skip
        except redis.ResponseError as error:
            # (the script's name in the message differs, f_<sha>, and the prefix)
            reason = str(error).split(" script: ")[0].split(": ")[-1]
            return ("error", reason.replace(prefix, "P"))

    def both(self, blob: bytes, count: str = "1", memo: str = "") -> tuple[Any, Any]:
        return self.call("fast", blob, count, memo), self.call("body", blob, count, memo)

    def state(self, which: str) -> dict[str, Any]:
        """Every key of the docket, its prefix and entry ids taken out."""
        prefix = self.prefixes[which]
        found: dict[str, Any] = {}
        for raw in self.client.scan_iter(match=f"{prefix}*"):
            name = raw.decode()
            kind = self.client.type(name).decode()
            if kind == "hash":
                value: Any = self.client.hgetall(name)
                value.pop(b"sid", None)
            elif kind == "stream":
                value = [fields for _, fields in self.client.xrange(name)]
            elif kind == "zset":
                value = self.client.zrange(name, 0, -1)
            else:
                value = self.client.dump(name) if kind != "string" else self.client.get(name)
            ttl = self.client.pttl(name)
            found[name.removeprefix(prefix)] = (kind, value, ttl > 0)
        return found

    def events(self) -> dict[str, list[dict[str, Any]]]:
        seen: dict[str, list[dict[str, Any]]] = {"fast": [], "body": []}
        while (got := self.pubsub.get_message(timeout=0.2)) is not None:
            if got["type"] != "pmessage":
                continue
            channel = got["channel"].decode()
            which = next(w for w, p in self.prefixes.items() if channel.startswith(p))
            seen[which].append(json.loads(got["data"]))
        return seen

    def same(self) -> None:
        assert self.state("fast") == self.state("body")
        events = self.events()
        assert events["fast"] == events["body"]


def commands(client: redis.Redis) -> dict[str, int]:
    return {name: stats["calls"] for name, stats in client.info("commandstats").items()}


def took_fast_path(client: redis.Redis, run: Any) -> bool:
    """Whether ``run()`` (one whole-script call) took the fast path: only it
    reads a record's state alone (HGET); the body reads it with HMGET."""
    before = commands(client)
    run()
    after = commands(client)
    hget = after.get("cmdstat_hget", 0) - before.get("cmdstat_hget", 0)
    hmget = after.get("cmdstat_hmget", 0) - before.get("cmdstat_hmget", 0)
    return hget >= 1 and hmget == 0


def test_a_new_key_due_now_takes_the_fast_path_to_the_same_end(client: redis.Redis) -> None:
    twins = Twins(client)
    blob = pack_batch(message("new"))
    replies: list[Any] = []
    assert took_fast_path(client, lambda: replies.append(twins.call("fast", blob)))
    replies.append(twins.call("body", blob))
    assert replies[0] == replies[1] == [[1, b"1", b"queued"]]
    twins.same()


@pytest.mark.parametrize(
    "case",
    ["live", "ended", "future", "closing", "sealed", "two", "memo", "acknowledge", "follow-up"],
)
def test_every_other_call_leaves_the_fast_path_and_ends_the_same(
    client: redis.Redis, case: str
) -> None:
    twins = Twins(client)
    memo = ""
    if case in ("live", "ended"):
        twins.both(pack_batch(message("key")))
        if case == "ended":
            for prefix in twins.prefixes.values():
                client.hset(f"{prefix}:run:key", "state", "completed")
                client.pexpire(f"{prefix}:run:key", 60_000)
        blob = pack_batch(message("key"))
    elif case == "future":
        blob = pack_batch(message("key", due_in=60))
    elif case in ("closing", "sealed"):
        for prefix in twins.prefixes.values():
            if case == "closing":
                client.sadd(f"{prefix}:closing", "2:owner")
            else:
                client.set(f"{prefix}:closed", "sealed:2:1")
        blob = pack_batch(message("key"))
    elif case == "two":
        blob = pack_batch(message("a")) + pack_batch(message("b"))
    elif case == "memo":
        memo = "".join(f"{len(part)}:{part}" for part in ("0", "60000", "worker", "origin"))
        blob = pack_batch(message("key"))
    elif case == "acknowledge":
        blob = pack_batch(message("key", acknowledge="1-0"))
    else:
        blob = pack_batch(message("key", expect="3", ended="completed"))
    replies: list[Any] = []
    assert not took_fast_path(client, lambda: replies.append(twins.call("fast", blob, memo=memo)))
    replies.append(twins.call("body", blob, memo=memo))
    assert replies[0] == replies[1]
    twins.same()


@pytest.mark.parametrize(
    ("blob", "count"),
    [
        (pack_batch(message("key"))[:-3], "1"),  # a field cut short
        (b"\xff" * 60, "1"),  # a length past the end
        (pack_batch(message("key")), "one"),  # no partition count
    ],
)
def test_a_malformed_call_fails_alike_and_writes_nothing(
    client: redis.Redis, blob: bytes, count: str
) -> None:
    twins = Twins(client)
    fast, body = twins.both(blob, count)
    assert fast[0] == "error" and fast == body
    assert twins.state("fast") == twins.state("body") == {}


@pytest.mark.parametrize("due_in", [0.0, 60.0])
def test_the_state_event_carries_the_key_and_the_time_as_json(
    client: redis.Redis, due_in: float
) -> None:
    """The events the scripts write by hand (the fast path's queued one, the
    body's queued and scheduled ones) are the JSON cjson would write: a key
    that needs escaping arrives as it was, and the due time to 14 digits."""
    twins = Twins(client)
    key = 'a "quoted" \\ key, é ✓\t'
    fields = message(key, due_in=due_in)
    when = float(fields[3])
    twins.both(pack_batch(fields))
    events = twins.events()
    state = "queued" if due_in == 0 else "scheduled"
    for which in ("fast", "body"):
        (event,) = events[which]
        assert event.pop("when") == pytest.approx(when, abs=1e-3)
        assert event == {"type": "state", "state": state, "key": key}
