"""Every field the server stores reads through here, and nothing here raises
into a worker.

Keys of a docket can be written by anything with access to the server: an
older or newer docket, an operator's ``XADD``, a bug.  A stream entry parses
to a ``Delivery`` or to a ``MalformedEntry`` that says why it is not a
message (the core sets it aside); a worker entry whose task list is not JSON
reads as a worker with no tasks.  A record or progress hash that is not ours
raises ``StoreError`` naming the key: those are read by the client API, where
the caller sees the error, never by a worker's loops.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from ..adapter import Depths, ProgressEvent, ReadResult, StateEvent, StoreEvent
from ..sansio.errors import StoreError
from ..sansio.layout_change import CountRecorded
from ..sansio.values import (
    DEFAULT_PROGRESS_TOTAL,
    DeadLetter,
    Delivery,
    ExecutionRecord,
    ExecutionState,
    MalformedEntry,
    ProgressRecord,
    RunningRecord,
    StoreSnapshot,
    TaskMessage,
    WorkerRecord,
)

#: the fields of a message entry: key, function, payload, when, attempt, generation
MESSAGE_FIELDS = ("k", "f", "p", "w", "a", "g")


def text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode()
    return str(value)


def raw(value: Any) -> bytes:
    """A field value as bytes, whatever the client returned."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    return str(value).encode()


def fields_of(flat: Sequence[Any]) -> dict[str, Any]:
    """``[f1, v1, f2, v2, ...]`` as a dict with text field names."""
    return {text(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}


def _number(fields: dict[str, Any], name: str, kind: type[int] | type[float]) -> int | float:
    value = kind(text(fields[name]))
    if not math.isfinite(value):
        raise ValueError(f"{name}={value!r} is not a finite number")
    return value


#: the field names of a message entry as the scripts write them, in order
_WRITTEN = [name.encode() for name in MESSAGE_FIELDS]


def parse_entry(
    entry_id: Any, flat: Any, *, redelivered: bool = False
) -> Delivery | MalformedEntry:
    """A queue stream entry as a delivery, or as a malformed entry with the reason."""
    if type(flat) is list and len(flat) == 12 and flat[0::2] == _WRITTEN:
        delivery = _as_written(entry_id, flat, redelivered)
        if delivery is not None:
            return delivery
    delivery_id = text(entry_id)
    try:
        pairs = [(text(flat[i]), raw(flat[i + 1])) for i in range(0, len(flat) - 1, 2)]
        if len(flat) % 2:
            return MalformedEntry(
                delivery_id=delivery_id,
                reason="the entry's fields do not pair",
                fields=tuple(pairs),
            )
    except (TypeError, ValueError) as error:
        return MalformedEntry(delivery_id=delivery_id, reason=f"unreadable fields ({error})")
    fields = dict(pairs)
    key = _text_or_none(fields.get("k"))
    generation: int | None = None
    try:
        generation = int(text(fields["g"])) if "g" in fields else None
    except ValueError:
        pass

    def malformed(reason: str) -> MalformedEntry:
        return MalformedEntry(
            delivery_id=delivery_id,
            reason=reason,
            key=key,
            generation=generation,
            fields=tuple(pairs),
        )

    missing = [name for name in MESSAGE_FIELDS if name not in fields]
    if missing:
        return malformed(f"the message lacks the field(s) {', '.join(missing)}")
    try:
        message = TaskMessage(
            key=text(fields["k"]),
            function=text(fields["f"]),
            payload=fields["p"],
            when=float(_number(fields, "w", float)),
            attempt=int(_number(fields, "a", int)),
            generation=int(_number(fields, "g", int)),
        )
    except ValueError as error:
        return malformed(f"the message has a field that does not parse ({error})")
    if message.attempt < 1 or message.generation < 0:
        return malformed(
            f"attempt {message.attempt} or generation {message.generation} is out of range"
        )
    return Delivery(delivery_id=delivery_id, message=message, redelivered=redelivered)


def _as_written(entry_id: Any, flat: list[Any], redelivered: bool) -> Delivery | None:
    """``parse_entry``'s result for an entry of the scripts' own making (its
    fields bytes, in their order), in a few steps instead of a dict and a
    call a field; ``None`` for anything else, which ``parse_entry`` then
    reads field by field (with the reason, if it is malformed)."""
    entry, (key, function, payload, when, attempt, generation) = entry_id, flat[1::2]
    if not (
        type(entry) is type(key) is type(function) is type(payload) is bytes
        and type(when) is type(attempt) is type(generation) is bytes
    ):
        return None
    try:
        # (ASCII numbers parse alike from bytes and from text; any other
        # spelling goes the long way)
        due, attempt, generation = float(when), int(attempt), int(generation)
        if not (math.isfinite(due) and attempt >= 1 and generation >= 0):
            return None
        message = TaskMessage(
            key=key.decode(),
            function=function.decode(),
            payload=payload,
            when=due,
            attempt=attempt,
            generation=generation,
        )
        return Delivery(delivery_id=entry.decode(), message=message, redelivered=redelivered)
    except (TypeError, ValueError):  # (UnicodeDecodeError is a ValueError)
        return None


def _text_or_none(value: bytes | None) -> str | None:
    if value is None:
        return None
    try:
        return value.decode()
    except UnicodeDecodeError:
        return None


def split_entries(
    entries: Sequence[tuple[Any, Any, bool]],
) -> tuple[tuple[Delivery, ...], tuple[MalformedEntry, ...]]:
    """Parse ``(id, fields, redelivered)`` entries into deliveries and malformed ones."""
    deliveries: list[Delivery] = []
    malformed: list[MalformedEntry] = []
    for entry_id, flat, redelivered in entries:
        parsed = parse_entry(entry_id, flat, redelivered=redelivered)
        if isinstance(parsed, Delivery):
            deliveries.append(parsed)
        else:
            malformed.append(parsed)
    return tuple(deliveries), tuple(malformed)


#: what reading a reply of an unknown shape raises
_SHAPE_ERRORS = (TypeError, ValueError, IndexError, KeyError, AttributeError)


def stream_reply(reply: Any) -> dict[str, list[tuple[Any, Any]]]:
    """An ``XREADGROUP`` reply by stream, in any shape a client gives it:
    RESP2 ``[[stream, entries], ...]``, a RESP3 map (redis-py's parsed one
    holds a stream's entries in a list of one), ``None`` when nothing
    came (entries as ``stream_entries`` gives them).  A reply of another
    shape is the store's fault: ``StoreError`` (a worker counts a failed
    read and reads again), never a crash."""
    if not reply:
        return {}
    try:
        streams = reply.items() if isinstance(reply, dict) else [_pair(s) for s in reply]
        found: dict[str, list[tuple[Any, Any]]] = {}
        for stream, entries in streams:
            if (
                type(entries) is list
                and len(entries) == 1
                and type(entries[0]) is list
                and (not entries[0] or type(entries[0][0]) in _PAIRS)
            ):
                # (redis-py's RESP3 form: a stream's entries in a list of one)
                entries = entries[0]
            found.setdefault(text(stream), []).extend(_entries(entries))
    except _SHAPE_ERRORS as error:
        raise StoreError(f"unexpected reply to a stream read: {reply!r:.200}") from error
    return found


def stream_entries(entries: Any) -> list[tuple[Any, Any]]:
    """A stream's entries (an ``XRANGE`` reply, one stream of an
    ``XREADGROUP`` one) as ``(id, [field, value, ...])``; ``StoreError``
    for a reply of no known shape (see ``_entries``)."""
    try:
        return _entries(entries)
    except _SHAPE_ERRORS as error:
        raise StoreError(f"unexpected reply to a stream read: {entries!r:.200}") from error


def _pair(item: Any) -> tuple[Any, Any]:
    """``[name, value]`` (a stream and its entries, an id and its fields)."""
    if (type(item) is not list and type(item) is not tuple) or len(item) != 2:
        raise TypeError(f"not a pair: {item!r:.80}")
    return item[0], item[1]


def _entries(entries: Any) -> list[tuple[Any, Any]]:
    """RESP2 ``[[id, [f, v, ...]], ...]`` or a map of ids; fields as a map
    or as ``[f, v]`` pairs (GLIDE's RESP3) are flattened.  Fields of any
    other kind (``None`` for an entry deleted while pending) are left as
    they came, for ``parse_entry`` to call malformed."""
    if isinstance(entries, dict):
        entries = entries.items()
    out: list[tuple[Any, Any]] = []
    append = out.append
    for entry in entries or ():
        kind = type(entry)
        if (kind is not list and kind is not tuple) or len(entry) != 2:
            raise TypeError(f"not an entry: {entry!r:.80}")
        entry_id, fields = entry
        kind = type(fields)
        if kind is list:
            if fields and type(fields[0]) in _PAIRS and all(type(f) in _PAIRS for f in fields):
                fields = [part for pair in fields for part in pair]
        elif kind is dict:
            fields = [part for pair in fields.items() for part in pair]
        append((entry_id, fields))
    return out


#: the types of a ``[field, value]`` pair in GLIDE's replies
_PAIRS = (list, tuple)


def is_wake(flat: Any) -> bool:
    """Whether a stream entry is a wake-up entry (no message: blocked readers re-arm)."""
    return not flat or flat[0] in (b"wake", "wake")


def parse_read(reply: Any) -> ReadResult:
    """The reply of the ``read`` script: ``{entries, next_due, cursor}``."""
    try:
        entries, next_due = reply[0], reply[1]
        due = text(next_due) if next_due is not None else ""
        soonest = float(due) if due else None
        triples = [(entry[0], entry[1], int(entry[2]) == 1) for entry in entries]
    except (TypeError, ValueError, IndexError) as error:
        raise StoreError(f"unexpected reply to a read: {reply!r:.200}") from error
    deliveries, malformed = split_entries(triples)
    return ReadResult(deliveries=deliveries, next_due=soonest, malformed=malformed)


def parse_stream_entries(entries: Sequence[tuple[Any, Any]]) -> ReadResult:
    """Entries of a plain XREADGROUP reply, wake entries left out."""
    deliveries, malformed = split_entries(
        [(entry_id, flat, False) for entry_id, flat in entries if not is_wake(flat)]
    )
    return ReadResult(deliveries=deliveries, next_due=None, malformed=malformed)


def wake_ids(entries: Sequence[tuple[Any, Any]]) -> list[str]:
    return [text(entry_id) for entry_id, flat in entries if is_wake(flat)]


def parse_record(key: str, flat: Sequence[Any]) -> ExecutionRecord | None:
    """A key's record hash, ``None`` when it has none."""
    if not flat:
        return None
    f = fields_of(flat)
    if "state" not in f or "f" not in f:
        return None

    def optional_float(name: str) -> float | None:
        return float(text(f[name])) if name in f else None

    result = f.get("result")
    try:
        return ExecutionRecord(
            key=key,
            function=text(f["f"]),
            payload=raw(f.get("p", b"")),
            when=float(text(f.get("w", "0"))),
            attempt=int(text(f.get("a", "1"))),
            generation=int(text(f.get("g", "0"))),
            state=ExecutionState(text(f["state"])),
            worker=text(f["worker"]) if "worker" in f else None,
            started_at=optional_float("started"),
            completed_at=optional_float("completed"),
            error=text(f["error"]) if "error" in f else None,
            result=raw(result) if result is not None else None,
            cancel_ttl=optional_float("cancel"),
        )
    except ValueError as error:
        raise StoreError(f"the record of {key!r} is not docket's ({error})") from error


def parse_progress(flat: Sequence[Any]) -> ProgressRecord | None:
    if not flat:
        return None
    f = fields_of(flat)
    try:
        return ProgressRecord(
            current=int(text(f.get("current", "0"))),
            total=int(text(f["total"])) if "total" in f else DEFAULT_PROGRESS_TOTAL,
            message=text(f["message"]) if "message" in f else None,
            updated_at=float(text(f["updated"])) if "updated" in f else None,
        )
    except ValueError as error:
        raise StoreError(f"a progress record is not docket's ({error})") from error


def parse_progress_reply(reply: Any) -> ProgressRecord:
    try:
        current, total, message, updated = reply
        return ProgressRecord(
            current=int(text(current)),
            total=int(text(total)),
            message=text(message) if message is not None else None,
            updated_at=float(text(updated)) if updated is not None else None,
        )
    except (TypeError, ValueError) as error:
        raise StoreError(f"unexpected reply to a progress report: {reply!r:.200}") from error


def parse_worker(name: Any, score: Any, tasks: Any) -> WorkerRecord | None:
    """A worker's heartbeat entry; ``None`` when its name or time does not
    parse.  A task list that is not a JSON list of names reads as empty."""
    try:
        worker, last_seen = text(name), float(text(score))
    except ValueError:
        return None
    try:
        names = json.loads(raw(tasks))
        task_names = (
            frozenset(n for n in names if isinstance(n, str))
            if isinstance(names, list)
            else frozenset()
        )
    except (ValueError, RecursionError):
        task_names = frozenset()
    return WorkerRecord(name=worker, last_seen=last_seen, tasks=task_names)


def parse_snapshot(reply: Any, now: float) -> StoreSnapshot:
    """The reply of ``inspect snapshot``: ``{queued, running, scheduled,
    parked, workers, counts}`` (see ``inspect.lua``)."""
    try:
        queued, held, scheduled, parked, infos, counts = reply
        totals = [int(n) for n in counts]
    except (TypeError, ValueError) as error:
        raise StoreError(f"unexpected reply to a snapshot: {reply!r:.200}") from error
    future: list[TaskMessage] = []
    running: list[RunningRecord] = []
    malformed: list[MalformedEntry] = []

    def add(parsed: Delivery | MalformedEntry, into: list[TaskMessage]) -> None:
        if isinstance(parsed, Delivery):
            into.append(parsed.message)
        else:
            malformed.append(parsed)

    for entry_id, flat in queued:
        if not is_wake(flat):
            add(parse_entry(entry_id, flat), future)
    for entry_id, flat, consumer, idle_ms in held:
        if is_wake(flat):
            continue
        parsed = parse_entry(entry_id, flat)
        if isinstance(parsed, MalformedEntry):
            malformed.append(parsed)
        else:
            started = now - int(idle_ms) / 1000
            record = RunningRecord(message=parsed.message, worker=text(consumer), started=started)
            running.append(record)
    for kind, flats in (("scheduled", scheduled), ("parked", parked)):
        for flat in flats:
            if flat:
                add(parse_entry(kind, flat), future)
    future.sort(key=lambda m: m.when)
    workers = [parse_worker(*info) for info in infos]
    queued_total, running_total, scheduled_total, parked_total, dead_total = totals
    return StoreSnapshot(
        taken=now,
        future=tuple(future),
        running=tuple(running),
        workers=tuple(w for w in workers if w is not None),
        future_total=queued_total + scheduled_total + parked_total,
        running_total=running_total,
        malformed=tuple(malformed),
        dead_letters=dead_total,
    )


def parse_depths(reply: Any) -> Depths:
    """The reply of ``inspect depths``: ``{queued, scheduled, held}``."""
    try:
        queued, scheduled, held = (int(n) for n in reply)
    except (TypeError, ValueError) as error:
        raise StoreError(f"unexpected reply to a depth count: {reply!r:.200}") from error
    return Depths(queued=queued, scheduled=scheduled, held=held)


def parse_count(reply: Any, what: str) -> int:
    """A script's whole-number reply (a count, or a 0/1 flag)."""
    try:
        return int(reply)
    except (TypeError, ValueError) as error:
        raise StoreError(f"unexpected reply to {what}: {reply!r:.200}") from error


def parse_layout(reply: Any) -> CountRecorded:
    """The reply of ``layout``: ``{count, leaving or '', epoch}``."""
    try:
        count, leaving, epoch = (text(part) for part in reply)
        recorded = CountRecorded(
            count=int(count), leaving=int(leaving) if leaving else None, epoch=int(epoch)
        )
    except (TypeError, ValueError) as error:
        raise StoreError(f"unexpected reply to a partition count: {reply!r:.200}") from error
    if (
        recorded.count < 1
        or (recorded.leaving is not None and recorded.leaving < 1)
        or recorded.epoch < 0
    ):
        raise StoreError(f"unexpected reply to a partition count: {reply!r:.200}")
    return recorded


def parse_event(data: bytes) -> StoreEvent | None:
    """A state or progress event from a key's channel (the JSON the scripts
    publish); ``None`` for anything else published there (anyone may)."""
    try:
        event = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not isinstance(event, dict) or not isinstance(event.get("key"), str):
        return None
    get = event.get
    try:
        if get("type") == "state":
            return StateEvent(
                key=event["key"],
                state=ExecutionState(get("state")),
                when=_event_number(get("when")),
                worker=_event_string(get("worker")),
                started_at=_event_number(get("started_at")),
                completed_at=_event_number(get("completed_at")),
                error=_event_string(get("error")),
            )
        if get("type") == "progress":
            return ProgressEvent(
                key=event["key"],
                current=_event_integer(get("current")),
                total=_event_integer(get("total")),
                message=_event_string(get("message")),
                updated_at=_event_number(get("updated_at")),
            )
    except (TypeError, ValueError):
        return None
    return None


def _event_number(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"not a number: {value!r}")
    return value


def _event_integer(value: Any) -> int:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"not an integer: {value!r}")
    return value


def _event_string(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"not a string: {value!r}")
    return value


def parse_cancellation(data: bytes) -> tuple[str, int] | None:
    """A ``(key, generation)`` from the cancellation channel, or ``None``."""
    try:
        signal = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not isinstance(signal, dict):
        return None
    key, generation = signal.get("key"), signal.get("generation")
    if not isinstance(key, str) or not isinstance(generation, int) or isinstance(generation, bool):
        return None
    return key, generation


def parse_dead_letters(reply: Any) -> tuple[int, list[DeadLetter]]:
    """The reply of ``dead list``: ``{total, entries}``; each entry's fields
    are ``id``, ``reason``, ``at``, ``key`` (optional) and ``raw`` (the
    original fields packed)."""
    total, entries = int(reply[0]), reply[1]
    letters: list[DeadLetter] = []
    for entry_id, flat in entries:
        f = {text(flat[i]): raw(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}
        try:
            dead_at = float(f.get("at", b"0"))
        except ValueError:
            dead_at = 0.0
        packed = unpack_fields(f.get("raw", b""))
        letters.append(
            DeadLetter(
                entry_id=text(entry_id),
                original_id=_text_or_none(f.get("id")) or "",
                reason=_text_or_none(f.get("reason")) or "",
                dead_at=dead_at,
                key=_text_or_none(f.get("key")),
                fields=tuple(
                    (packed[i].decode(errors="replace"), packed[i + 1])
                    for i in range(0, len(packed) - 1, 2)
                ),
            )
        )
    return total, letters


def pack(values: Sequence[bytes]) -> bytes:
    """Values as ``<length>:<bytes>`` each (``unpack_fields`` in the prelude)."""
    return b"".join(b"%d:%b" % (len(value), value) for value in values)


def unpack_fields(blob: bytes) -> list[bytes]:
    """The inverse of ``pack``; stops at the first field that does not parse."""
    out: list[bytes] = []
    position = 0
    while position < len(blob):
        colon = blob.find(b":", position)
        if colon < 0:
            break
        try:
            length = int(blob[position:colon])
        except ValueError:
            break
        out.append(blob[colon + 1 : colon + 1 + length])
        position = colon + 1 + length
    return out
