"""``docket_core.lua.entries`` on its own: what a server holds, read back.

No server: the entries and replies are hand-made in the shapes both clients
return.  A queue entry that is not a message parses to a ``MalformedEntry``
with the reason (never raises into a worker); a worker entry that is not ours
reads as a worker without tasks; a record, progress or reply that is not ours
is a ``StoreError``.  (Events and cancellations on the channels: also
``test_store_events.py``.)"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from docket_core.lua.entries import (
    fields_of,
    is_wake,
    pack,
    parse_cancellation,
    parse_dead_letters,
    parse_entry,
    parse_progress,
    parse_progress_reply,
    parse_read,
    parse_record,
    parse_snapshot,
    parse_stream_entries,
    parse_worker,
    raw,
    stream_entries,
    stream_reply,
    text,
    wake_ids,
)
from docket_core.sansio.errors import StoreError
from docket_core.sansio.values import (
    DEFAULT_PROGRESS_TOTAL,
    Delivery,
    ExecutionState,
    MalformedEntry,
    ProgressRecord,
    TaskMessage,
    WorkerRecord,
)


def entry(**fields: Any) -> list[Any]:
    """A message entry's flat fields, ``k f p w a g``, overridden by ``fields``
    (``None`` leaves a field out)."""
    values: dict[str, Any] = {"k": b"k1", "f": b"job", "p": b"\x80pickled", "w": b"12.5"}
    values |= {"a": b"2", "g": b"3"}
    values |= fields
    return [part for name, value in values.items() if value is not None for part in (name, value)]


MESSAGE = TaskMessage(
    key="k1", function="job", payload=b"\x80pickled", when=12.5, attempt=2, generation=3
)


# -- field values -------------------------------------------------------------------------------


def test_field_values_read_whatever_the_client_returned() -> None:
    assert text(b"a") == text("a") == "a"
    assert text(7) == "7"
    assert raw(b"a") == raw(bytearray(b"a")) == raw(memoryview(b"a")) == raw("a") == b"a"
    assert raw(7) == b"7"
    assert fields_of([b"x", b"1", "y", 2]) == {"x": b"1", "y": 2}


# -- queue entries ------------------------------------------------------------------------------


def test_a_message_entry_is_a_delivery() -> None:
    parsed = parse_entry(b"1-0", entry(), redelivered=True)
    assert parsed == Delivery(delivery_id="1-0", message=MESSAGE, redelivered=True)
    assert parse_entry("1-0", [text(v) if i % 2 == 0 else v for i, v in enumerate(entry())]) == (
        Delivery(delivery_id="1-0", message=MESSAGE)
    )


@pytest.mark.parametrize(
    ("flat", "reason", "key", "generation"),
    [
        (entry(g=None, a=None), "lacks the field(s) a, g", "k1", None),
        (entry(k=None), "lacks the field(s) k", None, 3),
        (entry(w=b"soon"), "does not parse", "k1", 3),
        (entry(w=b"nan"), "not a finite number", "k1", 3),
        (entry(a=b"inf"), "does not parse", "k1", 3),
        (entry(a=b"0"), "out of range", "k1", 3),
        (entry(g=b"-1"), "out of range", "k1", -1),
        (entry(g=b"x"), "does not parse", "k1", None),
        (entry(k=b"\xff"), "does not parse", None, 3),
        ([*entry(), b"extra"], "do not pair", None, None),
    ],
    ids=[
        "missing",
        "no-key",
        "bad-when",
        "nan-when",
        "infinite-attempt",
        "attempt-0",
        "negative-generation",
        "bad-generation",
        "key-not-utf8",
        "odd-fields",
    ],
)
def test_an_entry_that_is_not_a_message_says_why(
    flat: list[Any], reason: str, key: str | None, generation: int | None
) -> None:
    parsed = parse_entry(b"1-0", flat)
    assert isinstance(parsed, MalformedEntry)
    assert parsed.delivery_id == "1-0"
    assert reason in parsed.reason
    assert (parsed.key, parsed.generation) == (key, generation)
    if "pair" not in reason:
        # everything that was there is kept for the dead letters, as bytes
        assert parsed.fields == tuple(
            (text(flat[i]), raw(flat[i + 1])) for i in range(0, len(flat), 2)
        )


def test_fields_that_cannot_be_read_are_malformed_too() -> None:
    parsed = parse_entry(b"1-0", None)
    assert isinstance(parsed, MalformedEntry) and "unreadable" in parsed.reason


def test_a_read_reply_splits_deliveries_from_malformed_entries() -> None:
    reply = [
        [[b"1-0", entry(), 0], [b"2-0", entry(f=None), 1], [b"3-0", entry(k=b"k2"), b"1"]],
        b"99.5",
    ]
    result = parse_read(reply)
    assert [(d.delivery_id, d.message.key, d.redelivered) for d in result.deliveries] == [
        ("1-0", "k1", False),
        ("3-0", "k2", True),
    ]
    assert [m.delivery_id for m in result.malformed] == ["2-0"]
    assert result.next_due == 99.5
    assert parse_read([[], None]).next_due is None
    assert parse_read([[], b""]).next_due is None


@pytest.mark.parametrize("reply", [None, [], [[[b"1-0"]], None], [[], b"later"], 5])
def test_a_read_reply_of_another_shape_is_a_store_error(reply: Any) -> None:
    with pytest.raises(StoreError, match="unexpected reply to a read"):
        parse_read(reply)


def test_wake_entries_are_not_messages() -> None:
    entries = [(b"1-0", [b"wake", b"1"]), (b"2-0", entry()), ("3-0", []), (b"4-0", ["wake", "1"])]
    assert [is_wake(flat) for _, flat in entries] == [True, False, True, True]
    assert wake_ids(entries) == ["1-0", "3-0", "4-0"]
    result = parse_stream_entries(entries)
    assert [d.delivery_id for d in result.deliveries] == ["2-0"]
    assert (result.malformed, result.next_due) == ((), None)


# -- records ------------------------------------------------------------------------------------


def test_a_record_hash_reads_as_a_record() -> None:
    flat = [b"f", b"job", b"p", b"\x80", b"w", b"1.5", b"a", b"2", b"g", b"4"]
    flat += [b"state", b"failed", b"worker", b"w1", b"started", b"2.0", b"completed", b"3.0"]
    flat += [b"error", b"Boom: x", b"result", b"\x80r"]
    record = parse_record("k", flat)
    assert record is not None
    assert (record.key, record.function, record.payload, record.when) == ("k", "job", b"\x80", 1.5)
    assert (record.attempt, record.generation, record.state) == (2, 4, ExecutionState.FAILED)
    assert (record.worker, record.started_at, record.completed_at) == ("w1", 2.0, 3.0)
    assert (record.error, record.result) == ("Boom: x", b"\x80r")


def test_a_record_hash_keeps_its_defaults() -> None:
    record = parse_record("k", [b"f", b"job", b"state", b"queued"])
    assert record is not None
    assert (record.payload, record.when, record.attempt, record.generation) == (b"", 0.0, 1, 0)
    assert (record.worker, record.started_at, record.error, record.result) == (None,) * 4


def test_no_record_or_one_without_state_and_function_is_none() -> None:
    assert parse_record("k", []) is None
    assert parse_record("k", [b"f", b"job"]) is None
    assert parse_record("k", [b"state", b"queued"]) is None


@pytest.mark.parametrize(
    "flat",
    [
        [b"f", b"job", b"state", b"lost"],
        [b"f", b"job", b"state", b"queued", b"a", b"two"],
        [b"f", b"job", b"state", b"queued", b"started", b"x"],
    ],
)
def test_a_record_that_is_not_ours_is_a_store_error_naming_its_key(flat: list[bytes]) -> None:
    with pytest.raises(StoreError, match="'k'"):
        parse_record("k", flat)


def test_a_progress_hash_reads_with_its_defaults() -> None:
    assert parse_progress([]) is None
    assert parse_progress([b"message", b"hi"]) == ProgressRecord(
        current=0, total=DEFAULT_PROGRESS_TOTAL, message="hi"
    )
    flat = [b"current", b"3", b"total", b"9", b"updated", b"4.5"]
    assert parse_progress(flat) == ProgressRecord(current=3, total=9, updated_at=4.5)
    with pytest.raises(StoreError, match="progress"):
        parse_progress([b"current", b"three"])


def test_a_progress_reply_reads_or_is_a_store_error() -> None:
    assert parse_progress_reply([b"1", 10, None, None]) == ProgressRecord(current=1, total=10)
    assert parse_progress_reply([2, 10, b"half", b"7.5"]) == ProgressRecord(
        current=2, total=10, message="half", updated_at=7.5
    )
    for reply in (None, [1, 2, 3], [b"x", 10, None, None]):
        with pytest.raises(StoreError, match="progress report"):
            parse_progress_reply(reply)


# -- workers ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tasks", "names"),
    [
        (b'["a", "b"]', {"a", "b"}),
        (b'["a", 1, null]', {"a"}),
        (b'{"a": 1}', set()),
        (b"not json", set()),
        (b"\xff", set()),
        (b"[" * 100_000, set()),
    ],
    ids=["names", "some-names", "not-a-list", "not-json", "not-text", "too-deep"],
)
def test_a_worker_entry_reads_its_task_names_or_none(tasks: bytes, names: set[str]) -> None:
    assert parse_worker(b"w1", b"12.5", tasks) == WorkerRecord(
        name="w1", last_seen=12.5, tasks=frozenset(names)
    )


def test_a_worker_entry_without_a_time_is_none() -> None:
    assert parse_worker(b"w1", b"soon", b"[]") is None


# -- snapshots ----------------------------------------------------------------------------------


def test_a_snapshot_reply_reads_as_a_snapshot() -> None:
    queued = [(b"1-0", entry(k=b"q", w=b"5")), (b"2-0", [b"wake", b"1"]), (b"3-0", entry(f=None))]
    held = [(b"4-0", entry(k=b"r"), b"w1", 2000), (b"5-0", [b"wake", b"1"], b"w1", 0)]
    scheduled = [entry(k=b"s", w=b"50"), []]
    parked = [entry(k=b"p", w=b"1")]
    infos = [(b"w1", b"99.0", b'["job"]'), (b"bad", b"never", b"[]")]
    counts = [3, 1, 1, 1, 4]
    snapshot = parse_snapshot([queued, held, scheduled, parked, infos, counts], now=100.0)
    assert snapshot.taken == 100.0
    assert [m.key for m in snapshot.future] == ["p", "q", "s"]  # soonest first
    assert [(r.message.key, r.worker, r.started) for r in snapshot.running] == [("r", "w1", 98.0)]
    assert snapshot.workers == (WorkerRecord(name="w1", last_seen=99.0, tasks=frozenset({"job"})),)
    assert (snapshot.future_total, snapshot.running_total, snapshot.dead_letters) == (5, 1, 4)
    assert [m.delivery_id for m in snapshot.malformed] == ["3-0"]


@pytest.mark.parametrize("reply", [None, [[], [], [], [], []], [[], [], [], [], [], [1, "x"]]])
def test_a_snapshot_reply_of_another_shape_is_a_store_error(reply: Any) -> None:
    with pytest.raises(StoreError, match="snapshot"):
        parse_snapshot(reply, now=0.0)


# -- the cancellation channel and the dead letters -----------------------------------------------


@pytest.mark.parametrize(
    ("data", "parsed"),
    [
        (b'{"key": "k", "generation": 3}', ("k", 3)),
        (b'{"key": "k", "generation": true}', None),
        (b'{"key": "k", "generation": "3"}', None),
        (b'{"key": 1, "generation": 3}', None),
        (b'["k", 3]', None),
        (b"not json", None),
        (b"[" * 100_000, None),
    ],
)
def test_a_cancellation_signal_reads_or_is_dropped(
    data: bytes, parsed: tuple[str, int] | None
) -> None:
    assert parse_cancellation(data) == parsed


def test_dead_letters_read_with_their_original_fields() -> None:
    original = pack([b"k", b"k1", b"p", b"\xff\x00"])
    reply = [
        2,
        [
            (
                b"7-0",
                [b"id", b"1-0", b"reason", b"no f", b"at", b"5.5", b"key", b"k1", b"raw", original],
            ),
            (b"8-0", [b"id", b"\xff", b"at", b"never"]),
        ],
    ]
    total, letters = parse_dead_letters(reply)
    assert total == 2
    first, second = letters
    assert (first.entry_id, first.original_id, first.reason, first.dead_at) == (
        "7-0",
        "1-0",
        "no f",
        5.5,
    )
    assert first.key == "k1"
    assert first.fields == (("k", b"k1"), ("p", b"\xff\x00"))
    # what cannot be read is left empty, never raised
    assert (second.original_id, second.reason, second.dead_at, second.key) == ("", "", 0.0, None)
    assert second.fields == ()


# -- the scripts' own entries, read the short way ------------------------------------------

_NUMBERISH = st.sampled_from(
    [b"1", b"0", b"-1", b"2", b" 3 ", b"1.5", b"1e3", b"nan", b"inf", b"-inf", b"", b"x",
     b"1_000", b"\xd9\xa1", b"\xff", b"12345678901234567890", b"1700000000.25"]
)  # fmt: skip
_JUNK = st.one_of(
    _NUMBERISH,
    st.binary(max_size=6),
    st.sampled_from([b"t\xc3\xa9", b"\xff\xfe", "text", None, 7, 1.5]),
)
#: a message entry as the scripts write it, one field value a line
_WRITTEN_ENTRY = st.fixed_dictionaries(
    {
        "k": st.sampled_from([b"key", b"t\xc3\xa9", b""]),
        "f": st.sampled_from([b"fn", b"task.name"]),
        "p": st.binary(max_size=8),
        "w": st.sampled_from([b"1700000000.25", b"0", b"1.5", b"-3"]),
        "a": st.sampled_from([b"1", b"2", b"100"]),
        "g": st.sampled_from([b"0", b"1", b"99"]),
    }
)

_PLAIN = {"k": b"k", "f": b"f", "p": b"", "w": b"1", "a": b"1", "g": b"0"}


@settings(max_examples=1500)
@given(
    entry_id=st.sampled_from([b"1-0", "1-0", b"1700000000000-17"]),  # (the server's ids)
    written=_WRITTEN_ENTRY,
    spoiled=st.sampled_from([None, "k", "f", "p", "w", "a", "g"]),
    junk=_JUNK,
    redelivered=st.booleans(),
)
@example(b"1-0", _PLAIN, "w", b"nan", False)
@example(b"1-0", _PLAIN, "a", b"0", False)
@example(b"1-0", _PLAIN, "g", b"-1", False)
@example(b"1-0", _PLAIN, "k", b"\xff", False)
def test_an_entry_as_the_scripts_write_it_parses_as_field_by_field(
    entry_id: Any, written: dict[str, Any], spoiled: str | None, junk: Any, redelivered: bool
) -> None:
    """``parse_entry`` reads a list of the scripts' fields in their order the
    short way (``_as_written``); whatever it makes of one, as written or with
    one field spoiled, delivery or malformed entry, is what the
    field-by-field reading (the same fields in a tuple, which never takes the
    short way) makes of it."""
    values = dict(written)
    if spoiled is not None:
        values[spoiled] = junk
    flat = [field for name in "kfpwag" for field in (name.encode(), values[name])]
    short = parse_entry(entry_id, flat, redelivered=redelivered)
    long = parse_entry(entry_id, tuple(flat), redelivered=redelivered)
    assert short == long


def test_an_entry_as_the_scripts_write_it_takes_the_short_way() -> None:
    from docket_core.lua import entries

    flat = [b"k", b"key", b"f", b"fn", b"p", b"\x80", b"w", b"1.5", b"a", b"2", b"g", b"7"]
    parsed = entries._as_written(b"5-1", flat, True)
    assert isinstance(parsed, Delivery)
    assert parsed.delivery_id == "5-1" and parsed.redelivered
    assert (parsed.message.key, parsed.message.function, parsed.message.payload) == (
        "key",
        "fn",
        b"\x80",
    )
    assert (parsed.message.when, parsed.message.attempt, parsed.message.generation) == (1.5, 2, 7)
    assert parse_entry(b"5-1", flat, redelivered=True) == parsed


# -- the shapes of a stream read's reply --------------------------------------------

FIELDS = [b"k", b"key-1", b"f", b"noop"]


@pytest.mark.parametrize(
    "reply",
    [
        # RESP2 (redis-py's raw reply, its cluster client's too)
        [[b"q", [[b"1-0", FIELDS]]], [b"w", []]],
        # RESP3 as redis-py gives it: a map of streams
        {b"q": [[b"1-0", FIELDS]], b"w": []},
        # redis-py's parsed form: the fields as a map
        [[b"q", [(b"1-0", {b"k": b"key-1", b"f": b"noop"})]]],
        # GLIDE: maps of streams and of ids, the fields as [f, v] pairs
        {b"q": {b"1-0": [[b"k", b"key-1"], [b"f", b"noop"]]}, "w": {}},
    ],
)
def test_every_shape_of_a_stream_read_reads_alike(reply: Any) -> None:
    assert stream_reply(reply)["q"] == [(b"1-0", FIELDS)]


@pytest.mark.parametrize("count", [1, 2, 3])
def test_redis_py_s_parsed_resp3_read_reads_as_the_raw_one(count: int) -> None:
    """redis-py's own RESP3 parse of an ``XREADGROUP`` reply (its cluster
    client parses replies; ``protocol=3`` in a URL picks RESP3) wraps a
    stream's entries in a list of one, and turns fields into a map."""
    from redis._parsers.helpers import parse_xread_resp3

    raw = {b"q": [[f"{i}-0".encode(), FIELDS] for i in range(count)]}
    expected = [(f"{i}-0".encode(), FIELDS) for i in range(count)]
    assert stream_reply(parse_xread_resp3(raw))["q"] == expected
    assert stream_reply(raw)["q"] == expected
    assert stream_reply(parse_xread_resp3({b"q": []})) == {"q": []}


def test_a_read_that_brought_nothing_is_empty() -> None:
    assert stream_reply(None) == {}
    assert stream_reply([]) == {}
    assert stream_entries(None) == []


def test_fields_of_no_known_shape_are_left_for_parse_entry_to_call_malformed() -> None:
    # (an entry deleted while it was pending reads back with no fields)
    ((entry_id, fields),) = stream_reply([[b"q", [[b"1-0", None]]]])["q"]
    assert fields is None
    assert isinstance(parse_entry(entry_id, fields), MalformedEntry)
    # pairs mixed with bare values are not flattened (a bytes value is no pair)
    mixed = [[b"k", b"key-1"], b"f"]
    assert stream_entries([[b"1-0", mixed]]) == [(b"1-0", mixed)]


@pytest.mark.parametrize(
    "reply",
    [
        b"OK",  # a status where a read was expected
        7,
        [b"q"],  # a stream without its entries
        [[b"q", [b"1-0"]]],  # an entry without its fields
        [[b"q", 5]],
        {b"q": 5},
    ],
)
def test_a_read_reply_of_no_known_shape_is_a_store_error(reply: Any) -> None:
    # (the worker counts a failed read and reads again: a TypeError would
    # have ended its reader)
    with pytest.raises(StoreError, match="unexpected reply to a stream read"):
        stream_reply(reply)


def test_an_xrange_reply_of_no_known_shape_is_a_store_error() -> None:
    with pytest.raises(StoreError, match="unexpected reply to a stream read"):
        stream_entries([b"1-0"])
