"""A worker's settings (``WorkerConfig``), what it knows of one delivery it
holds (``InFlight``) and what it counts (``Count``): the nouns the worker
machine works with."""

from __future__ import annotations

import enum

import attrs

from .errors import UsageError
from .inputs import TaskEnded
from .lifecycle import Phase
from .outbox import BACKOFF_CAP
from .values import TaskMessage, TaskPolicy

#: the weight of the newest figure in the worker's moving averages (the mean
#: time of a run and of a slot step's round trip: ``read_steps._room``)
MEAN_WEIGHT = 0.125


def moving_mean(mean: float | None, figure: float) -> float:
    """``mean`` (``None``: no figure yet) moved towards ``figure`` by ``MEAN_WEIGHT``."""
    return figure if mean is None else mean + (figure - mean) * MEAN_WEIGHT


@attrs.frozen(slots=True, kw_only=True)
class WorkerConfig:
    """A worker's settings, in seconds."""

    name: str
    #: the docket's name: slot holders of dockets sharing a scope stay distinct
    docket: str = ""
    concurrency: int = 10
    redelivery_timeout: float = 300.0
    heartbeat_interval: float = 2.0
    execution_ttl: float = 900.0
    tasks: tuple[str, ...] = ()
    #: how often automatic perpetual tasks are added again (None: never)
    reseed_interval: float | None = None
    #: this machine's life, unique and never reused (the origin of its
    #: requests, so a restarted worker of the same name is never answered
    #: with its predecessor's outcomes); the name when empty
    origin: str = ""
    #: the first wait before a failed batch is sent again (the outbox backs off)
    retry_delay: float = 5.0
    #: how many refusals in a row of one batch end the worker
    refusals_allowed: int = 3
    #: the longest a read waits for work (``minimum_check_interval``)
    read_block: float = 0.25
    #: stop once nothing is scheduled, queued, parked or running
    until_finished: bool = False
    #: the machine asks for deliveries itself (``Read``); off, they are
    #: handed in with ``Delivered`` (tests of single steps)
    reads: bool = False
    #: fresh deliveries may start with their claim (``lifecycle``:
    #: ``START_EARLY``): only where the store puts a call on the wire before
    #: the call first yields (``StorageAdapter.sends_at_once``), so a run
    #: started beside its claim cannot reach the store ahead of it (a
    #: pickup's run begins just before its claim is written, every call on
    #: the store held back until it is: ``held_calls``)
    start_early: bool = True
    #: how many batches of store effects may be out at once: 2 only where the
    #: store runs and answers one sender's batches in the order they were
    #: sent (``StorageAdapter.keeps_order``; ``outbox``)
    batches_in_flight: int = 1

    def __attrs_post_init__(self) -> None:
        if self.concurrency < 1:
            raise UsageError("a worker's concurrency must be at least 1")
        if self.redelivery_timeout <= 0:
            raise UsageError("redelivery_timeout must be positive")
        if self.heartbeat_interval <= 0:
            raise UsageError("heartbeat_interval must be positive")
        if self.batches_in_flight < 1:
            raise UsageError("batches_in_flight must be at least 1")

    @property
    def renew_interval(self) -> float:
        return self.redelivery_timeout / 4

    @property
    def fence_after(self) -> float:
        """How old this worker's last confirmed lease renewal may get before it
        stops its runs itself: another worker may take a delivery or a slot
        over one redelivery timeout after its renewal (by its own clock), so
        stop a renewal interval before that."""
        return self.redelivery_timeout - self.renew_interval

    @property
    def stale_scan_every(self) -> float:
        """How often a docket's reads look for deliveries whose worker died
        (``Read.stale_scan_every``): a tenth of the redelivery timeout, at
        most a second, so a busy docket's reads mostly skip the look and a
        takeover comes at most that much later."""
        return min(self.redelivery_timeout / 10, 1.0)

    @property
    def resend_window(self) -> float:
        """How long a failed batch is sent again before it is given up: past
        one redelivery timeout its leases have lapsed anyway."""
        return self.redelivery_timeout

    @property
    def remember(self) -> float:
        """How long the store keeps outcomes for resends: longer than any
        resend may come (the last one at most a backoff after the window)."""
        return 2 * self.resend_window + BACKOFF_CAP * self.retry_delay


@attrs.define(slots=True, kw_only=True)
class InFlight:
    """One delivery held by this worker."""

    delivery_id: str
    message: TaskMessage
    policy: TaskPolicy
    phase: Phase = Phase.ARRIVED
    problem: str | None = None
    started_at: float = 0.0
    #: when its lease (and slot) were last known renewed, by this worker's clock
    renewed_at: float = 0.0
    deadline: float | None = None
    #: the concurrency slot this delivery holds (limit key), once acquired
    slot: str | None = None
    #: the request number of its ``Claim``: only that claim's verdict is its own
    claim_seq: int = 0
    #: how an early start's function ended, kept until its claim's verdict
    #: (``EARLY_ENDED``, ``EARLY_CANCELLED``)
    ended: TaskEnded | None = None


class Count(enum.StrEnum):
    """What a worker machine counts (``WorkerMachine.counters``).  A ``str``
    enum: the counters read as well with plain names (``counters["started"]``)."""

    #: deliveries handed to this worker, first time / taken over from another
    DELIVERED = "delivered"
    REDELIVERED = "redelivered"
    #: task functions started
    STARTED = "started"
    #: runs (or deliveries that could not run) recorded so
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    #: failed runs scheduled again, perpetual runs scheduled again
    RETRIED = "retried"
    PERPETUATED = "perpetuated"
    #: deliveries not run: a strike matched, a newer generation exists, the
    #: delivery was no longer this worker's, or it waits behind a limit
    STRUCK = "struck"
    SUPERSEDED = "superseded"
    LOST = "lost"
    PARKED = "parked"
    #: deliveries an admission control did not admit (``admission.BLOCKED_COUNTS``),
    #: and those of them (or blocked by an ``AdmissionBlocked``) that run later
    DEBOUNCED = "debounced"
    COOLED_DOWN = "cooled_down"
    RATE_LIMITED = "rate_limited"
    RESCHEDULED = "rescheduled"
    #: runs stopped for their timeout
    TIMED_OUT = "timed_out"
    #: leases lost (reported by the store, or fenced), runs ended unrecorded
    LEASE_LOST = "lease_lost"
    ABANDONED = "abandoned"
    #: deliveries stopped because this worker could not renew their leases
    FENCED = "fenced"
    #: store effects given up after the resend window
    GIVEN_UP = "given_up"
    #: store calls that failed (reads, batches, the cancellation listener)
    STORE_ERRORS = "store_errors"
    #: malformed entries read, moved to the dead letters, or already gone
    MALFORMED = "malformed"
    DEAD_LETTERED = "dead_lettered"
    BURY_LOST = "bury_lost"
