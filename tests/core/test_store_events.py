"""Typed store events: the JSON the scripts publish parses, in one place
(``lua.entries.parse_event``), to ``StateEvent``/``ProgressEvent``; anything
else on a key's channel is dropped; ``as_dict`` gives back the JSON's shape
(what ``Execution.subscribe`` yields, as pydocket does)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from docket_core.adapter import ProgressEvent, StateEvent
from docket_core.lua.entries import parse_event
from docket_core.sansio.values import ExecutionState
from docket_memory.shelf import state_event

#: events as the scripts publish them (prelude ``publish`` adds the key)
PUBLISHED: list[dict[str, Any]] = [
    {"type": "state", "state": "scheduled", "when": 1700000000.5, "key": "k"},
    {"type": "state", "state": "scheduled", "key": "k"},
    {"type": "state", "state": "queued", "when": 1700000000, "key": "k"},
    {"type": "state", "state": "running", "worker": "w1", "started_at": 1.25, "key": "k"},
    {"type": "state", "state": "completed", "completed_at": 2.5, "key": "k"},
    {"type": "state", "state": "failed", "completed_at": 2.5, "error": "E: no", "key": "k"},
    {"type": "state", "state": "cancelled", "completed_at": 3.0, "key": "k"},
    {
        "type": "progress",
        "current": 3,
        "total": 10,
        "updated_at": 4.5,
        "message": None,
        "key": "k",
    },
    {"type": "progress", "current": 4, "total": 10, "updated_at": 5, "message": "hi", "key": "k"},
]


@pytest.mark.parametrize("published", PUBLISHED)
def test_published_events_parse_and_keep_their_json(published: dict[str, Any]) -> None:
    event = parse_event(json.dumps(published).encode())
    assert isinstance(event, StateEvent | ProgressEvent)
    assert event.key == "k"
    assert event.as_dict() == published


def test_state_events_are_typed() -> None:
    event = parse_event(
        b'{"type": "state", "state": "failed", "completed_at": 2, "error": "E: x", "key": "k"}'
    )
    assert event == StateEvent(key="k", state=ExecutionState.FAILED, completed_at=2, error="E: x")
    progress = parse_event(b'{"type": "progress", "current": 1, "total": 4, "key": "k"}')
    assert progress == ProgressEvent(key="k", current=1, total=4)
    assert isinstance(progress, ProgressEvent)
    assert progress.progress.current == 1 and progress.progress.total == 4


@pytest.mark.parametrize(
    "data",
    [
        b"not json",
        b"[1, 2]",
        b'"state"',
        b'{"type": "state", "state": "queued"}',  # no key
        b'{"type": "state", "state": "bogus", "key": "k"}',
        b'{"type": "state", "key": "k"}',
        b'{"type": "state", "state": "queued", "when": "soon", "key": "k"}',
        b'{"type": "state", "state": "queued", "when": true, "key": "k"}',
        b'{"type": "state", "state": "running", "worker": 7, "key": "k"}',
        b'{"type": "progress", "current": "1", "total": 4, "key": "k"}',
        b'{"type": "progress", "current": 1.5, "total": 4, "key": "k"}',
        b'{"type": "progress", "total": 4, "key": "k"}',
        b'{"type": "other", "key": "k"}',
        b'{"key": "k"}',
        b"[" * 100_000,
    ],
)
def test_anything_else_on_the_channel_is_dropped(data: bytes) -> None:
    assert parse_event(data) is None


def test_the_memory_store_publishes_the_same_values() -> None:
    event = state_event("k", ExecutionState.RUNNING, worker="w1", started_at=1.25)
    assert event == parse_event(
        b'{"type": "state", "state": "running", "worker": "w1", "started_at": 1.25, "key": "k"}'
    )
