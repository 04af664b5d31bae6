"""The storage algebra: what every adapter (memory, Redis, GLIDE) implements.

An adapter carries out the core's store effects (``execute``) and serves the
reads the runtime and the client API need.  It holds no decision logic: every
condition it checks is spelled out in the contract of an effect or a method
here, and the memory adapter is the reference implementation of each.

The docket URL picks the adapter: ``memory://name`` needs no server;
``redis://``/``rediss://``/``unix://``, ``redis+cluster://``/``rediss+cluster://``
and ``redis+sentinel://`` pick ``docket_redis``; ``glide://``,
``glides://``, ``glide+cluster://`` and ``glides+cluster://`` pick ``docket_glide``.
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, runtime_checkable

import attrs

from .sansio.effects import StoreEffect
from .sansio.errors import UsageError
from .sansio.inputs import Outcome
from .sansio.layout_change import ClosingStep as _ClosingStep
from .sansio.layout_change import CountRecorded
from .sansio.strikes import StrikeInstruction, StrikeList
from .sansio.values import (
    DeadLetter,
    Delivery,
    ExecutionRecord,
    ExecutionState,
    MalformedEntry,
    ProgressRecord,
    StoreSnapshot,
    WorkerRecord,
)


@attrs.frozen(slots=True, kw_only=True)
class StateEvent:
    """``key`` entered ``state`` (published on the key's channel).  Times are
    seconds since the epoch; a field the store did not send is ``None``."""

    key: str
    state: ExecutionState
    when: float | None = None
    worker: str | None = None
    started_at: float | None = None
    completed_at: float | None = None
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The event as it travels (JSON): ``{"type": "state", ...}``, without
        the fields that are ``None``."""
        event: dict[str, Any] = {"type": "state", "key": self.key, "state": self.state.value}
        for name in ("when", "worker", "started_at", "completed_at", "error"):
            value = getattr(self, name)
            if value is not None:
                event[name] = value
        return event


@attrs.frozen(slots=True, kw_only=True)
class ProgressEvent:
    """``key``'s progress changed (published on the key's channel)."""

    key: str
    current: int
    total: int
    message: str | None = None
    updated_at: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """The event as it travels (JSON): ``{"type": "progress", ...}``."""
        return {
            "type": "progress",
            "key": self.key,
            "current": self.current,
            "total": self.total,
            "message": self.message,
            "updated_at": self.updated_at,
        }

    @property
    def progress(self) -> ProgressRecord:
        return ProgressRecord(
            current=self.current,
            total=self.total,
            message=self.message,
            updated_at=self.updated_at,
        )


#: An event published on a key's channel (``subscribe``); adapters whose
#: events travel as JSON read them with ``lua.entries.parse_event``.
StoreEvent = StateEvent | ProgressEvent

#: the steps that close one partition of a layout while the docket's
#: partition count changes (``StorageAdapter.close_partition``)
ClosingStep = _ClosingStep


@attrs.frozen(slots=True, kw_only=True)
class ReadResult:
    """What one ``read`` brought: deliveries, the ``when`` of the soonest
    future message still waiting (``None`` if there is none), and the entries
    handed to the worker that are not messages (``MalformedEntry``)."""

    deliveries: tuple[Delivery, ...]
    next_due: float | None
    malformed: tuple[MalformedEntry, ...] = ()
    #: the store handed every delivery out during this call (none recovered,
    #: none kept from an earlier call's reads): their leases are no older
    fresh: bool = True


@attrs.frozen(slots=True, kw_only=True)
class Depths:
    """How many messages of a docket wait, and for what, at one ``now``.

    ``queued``: due and not yet handed to a worker (queued, or scheduled with
    ``when <= now`` and not yet moved to the queue by a read); ``scheduled``:
    due later, or parked behind a full concurrency limit (their records say
    ``scheduled``); ``held``: handed to a worker and not yet acknowledged.
    Their sum is ``pending()``."""

    queued: int
    scheduled: int
    held: int


@runtime_checkable
class StorageAdapter(Protocol):
    """One docket's view of a store.  Every method may raise ``StoreError``
    (the store failed: connection lost, nonsense reply)."""

    #: the docket's name; every key of the docket lives under it
    name: str
    #: whether ``execute`` puts its calls on the wire before it first yields
    #: (memory: carried out at once).  A worker starts a fresh delivery's run
    #: beside its claim only then: a run handed over at the same time cannot
    #: make a change (a cancel of its own key) that reaches the store first
    #: (the worker holds every call back until the claim is written:
    #: ``hold_calls``)
    sends_at_once: bool
    #: whether ``execute_in_order`` keeps order: calls made while others are
    #: out go out behind them, and the store runs and answers them in the
    #: order they were made.  A worker then keeps two batches out at once
    keeps_order: bool

    async def open(self) -> None:
        """Connect; called once by ``Docket.__aenter__``."""

    def hold_calls(self) -> None:
        """Hold every call on this store back until ``release_calls``
        (``held_calls.HeldCalls``, which every store mixes in)."""

    def pass_next_call(self) -> None:
        """Let the caller's next call (made before it yields) go, and the
        held calls behind it once it is written (``HeldCalls``)."""

    def release_calls(self) -> None:
        """Let the held calls go now."""

    async def close(self) -> None:
        """Disconnect; called once by ``Docket.__aexit__``."""

    def sibling(self, name: str, partitions: int = 1) -> StorageAdapter:
        """An ordinary store of the docket ``name`` beside this one: on the
        same client (Redis, GLIDE) or memory location, sharing this store's
        budget of commands in flight; a partition of a ``partitions``-count
        layout (its adds name that count, and a partition a change of the
        count closed refuses those of another).  Called on an open store; the sibling
        is opened and closed like any store, and closing it leaves the shared
        client open (the store it came from owns it)."""

    async def record_partitions(
        self, expected: int, new: int, epoch: int | None = None
    ) -> CountRecorded:
        """Atomically: if the docket's recorded partition count
        (``{name}:partitions`` on the servers; absent means 1) is
        ``expected``, no count that left awaits its seal
        (``{name}:leaving``) and, when given, the count changed ``epoch``
        times (``{name}:epoch``: a count that went away and came back is
        not the one read), record ``new`` (recording 1 removes the
        record) and, when ``new`` differs, record ``expected`` as leaving.
        Returns the count and the leaving count recorded before, so a count
        equal to ``expected`` with no leaving count means ``new`` is
        recorded.  Both counts are at least 1
        (``sansio.layout_change``)."""

    async def forget_leaving(self, old: int, epoch: int | None = None) -> None:
        """Forget the leaving count if it is ``old`` (its partitions are
        sealed) and, when given, the count changed ``epoch`` times (a late
        forget leaves a later change's leaving count alone)."""

    async def close_partition(
        self, op: ClosingStep, count: int, epoch: int, lease: float, now: float, owner: str = ""
    ) -> bool:
        """One step on this store's docket as one partition of a layout that
        a change of the partition count to ``count`` leaves, or keeps
        (atomically; a partition closed under a lease refuses every new task
        and dead-letter replay, a sealed one those of the stores of any other
        count, with an error naming ``count``; ``sansio.layout_change``):

        - ``"close"``: close it to every add for ``lease`` seconds, under a
          lease of ``owner`` (the change's id; other changes' leases stay),
          unless it holds a task (scheduled, queued, handed out or parked):
          False then, nothing done; a seal stays under the lease (an undo
          must not open it);
        - ``"undo"``: remove ``owner``'s lease (False: there was none); the
          partition opens when no lease is left;
        - ``"seal"``: close it for good as of the change ``epoch`` to every
          count but ``count`` (every lease gone: a change still under way
          loses its compare-and-set), unless it holds a seal of ``epoch`` or
          a later one; False when it holds a task
          and not ``owner``'s lease (a task came in after the lease ran out);
        - ``"unseal"``: give a seal of another count, of ``epoch`` or an
          earlier one (a change away undone since), to ``count`` (False:
          there was none).
        ``now`` is the caller's clock (the memory store's leases run on it)."""

    async def execute(self, effects: Sequence[StoreEffect]) -> list[Outcome]:
        """Carry out ``effects`` in order, as few round trips as possible,
        returning one outcome per effect.  Each effect is atomic on its own.

        Resends: an effect carrying a ``Request`` is remembered under its
        origin and number; the same request sent again gets the first outcome
        back and changes nothing, with two checks against what time changed
        (``docket_core.sansio.effects``): a replayed acquisition that acquired
        renews the slot to the resend's ``now``, or answers ``lost`` when the
        slot was taken over; a replayed claim answers ``lost`` for a delivery
        another worker holds by now.  The outcomes of an origin below its
        ``floor`` may be forgotten, and all of them ``remember`` seconds after
        its last remembered effect.  ``RenewLeases`` and ``Heartbeat`` need no
        memory: running them again renews to the later ``now``.  A store that
        fails raises ``StoreUnavailable`` (no reply: any effect may have run)
        or ``StoreError`` (refused); the worker machine decides what follows."""

    async def execute_in_order(self, effects: Sequence[StoreEffect]) -> list[Outcome]:
        """``execute``, behind every ``execute_in_order`` call made before it
        (``keeps_order``): a worker's batches, two of them out at once.  A
        store that does not keep order carries it out as ``execute``."""

    async def read(
        self,
        *,
        worker: str,
        count: int,
        now: float,
        redelivery_timeout: float,
        block: float,
        recover: bool = False,
        stale_scan_every: float = 0.0,
    ) -> ReadResult:
        """Hand ``worker`` up to ``count`` deliveries.

        In one step: queue every scheduled message with ``when <= now``; with
        ``recover``, hand back the deliveries ``worker`` already holds (a read
        whose reply was lost leaves them there; the caller skips the ones it
        knows); take over deliveries whose holder has not renewed them for
        ``redelivery_timeout`` seconds (``redelivered=True``), looking for
        them only where no read of the docket's went through them within
        ``stale_scan_every`` seconds (0: every read looks); then hand out
        queued messages.  When there is nothing, wait up to ``block`` seconds,
        and never past the soonest due time, for something to be queued or
        scheduled, then return what there is (possibly nothing: the caller loops).
        A message scheduled sooner than every other one ends such a wait
        at once (on the servers through a wake-up entry kept apart from the
        queue, so it neither counts as a message nor against ``count``).

        Stale slots: a read also frees the slots of the limits with waiters
        whose holders have not renewed them for ``redelivery_timeout``
        seconds (their worker died), and queues a waiter for each; a limit
        nobody holds whose last woken waiter never took its slot within that
        time wakes the next one.
        """

    async def pending(self) -> int:
        """How many messages are scheduled, queued, parked or held by a worker."""

    async def depths(self, now: float) -> Depths:
        """The docket's depths at ``now`` (``Depths``), exact, in one cheap
        step that changes nothing (the servers count, never list): a
        scheduled message due by ``now`` counts as queued before a read
        moves it."""

    async def get_record(self, key: str) -> ExecutionRecord | None:
        """The key's record, or ``None`` when unknown or expired."""

    async def get_progress(self, key: str) -> ProgressRecord | None:
        """The key's progress while it runs."""

    async def report_progress(
        self,
        key: str,
        *,
        now: float,
        generation: int | None = None,
        current: int | None = None,
        increment: int | None = None,
        total: int | None = None,
        message: str | None = None,
        clear_message: bool = False,
    ) -> ProgressRecord:
        """Update the key's progress and publish a progress event; with a
        ``generation`` that is no longer the key's (a superseded run still
        reporting), change nothing and return the progress as it is.
        ``increment`` adds to ``current`` when both are given; an empty
        ``message``, like ``clear_message``, clears it.  Progress reported for
        a key without a record is dropped when the key is scheduled."""

    def subscribe(self, key: str) -> AbstractAsyncContextManager[AsyncIterator[StoreEvent]]:
        """Listen to the key's state and progress events (live ones only)."""

    def cancellations(self) -> AbstractAsyncContextManager[AsyncIterator[tuple[str, int]]]:
        """Listen to cancellations (for workers): ``(key, generation)`` pairs;
        runs of the key with a generation below it stop."""

    async def add_strike(self, instruction: StrikeInstruction) -> None:
        """Append a strike or restore for every process of the docket."""

    async def strikes(self) -> StrikeList:
        """The docket's strikes, as current as this process has seen them."""

    async def snapshot(self, now: float, limit: int = 1000) -> StoreSnapshot:
        """Scheduled, queued and running messages (at most ``limit`` of each
        kind, with the true totals), malformed entries in the queue, the
        number of dead letters, and live workers."""

    async def workers(self, now: float, horizon: float) -> list[WorkerRecord]:
        """Workers whose last heartbeat is newer than ``now - horizon``."""

    async def clear(self, now: float, ttl: float) -> int:
        """Remove every scheduled and queued message (marking them cancelled);
        return how many were removed.  Running tasks are left alone.  The
        servers work in chunks of about a thousand, so the server is never
        blocked for long: a message added meanwhile may stay or go."""

    async def dead_letters(self, limit: int = 1000) -> tuple[int, list[DeadLetter]]:
        """How many dead letters there are, and the newest ``limit`` of them."""

    async def replay_dead_letters(self, entry_ids: Sequence[str] | None) -> int:
        """Put these dead letters (``None``: all, a chunk at a time) back in
        the queue as they were (after an upgrade that can read them, say);
        returns how many were found.  A key the bury failed, still at the
        letter's generation, or without a record, is queued again with it."""

    async def drop_dead_letters(self, entry_ids: Sequence[str] | None) -> int:
        """Remove these dead letters (``None``: all); returns how many."""


_SCHEMES: dict[str, tuple[str, str, str]] = {
    "memory": ("docket_memory", "MemoryStore", "docket"),
    "redis": ("docket_redis", "RedisStore", "redis"),
    "rediss": ("docket_redis", "RedisStore", "redis"),
    "unix": ("docket_redis", "RedisStore", "redis"),
    "redis+cluster": ("docket_redis", "RedisStore", "redis"),
    "rediss+cluster": ("docket_redis", "RedisStore", "redis"),
    "redis+sentinel": ("docket_redis", "RedisStore", "redis"),
    "glide": ("docket_glide", "GlideStore", "glide"),
    "glides": ("docket_glide", "GlideStore", "glide"),
    "glide+cluster": ("docket_glide", "GlideStore", "glide"),
    "glides+cluster": ("docket_glide", "GlideStore", "glide"),
}


def adapter_for_url(url: str, name: str) -> StorageAdapter:
    """Build the adapter the URL's scheme names (``memory://`` by default);
    ``Docket`` puts a ``PartitionedStore`` over it for ``partitions > 1``."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    try:
        module_name, class_name, extra = _SCHEMES[scheme]
    except KeyError:
        known = ", ".join(f"{s}://" for s in _SCHEMES)
        raise UsageError(f"unknown docket URL scheme in {url!r}; expected one of {known}") from None
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise UsageError(
            f"the {scheme}:// backend needs the {module_name} adapter and its "
            f"client library: pip install 'docket[{extra}]' ({error})"
        ) from error
    factory: Any = getattr(module, class_name)
    adapter: StorageAdapter = factory.from_url(url, name=name)
    return adapter
