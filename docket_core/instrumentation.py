"""Metrics and traces through the OpenTelemetry API, with pydocket's names.

The API is a no-op until the application installs an SDK (a ``MeterProvider``
or ``TracerProvider``); ``docket worker --metrics-port`` installs one that
serves Prometheus.  Until then docket skips the calls altogether (``metering``
and ``tracing`` tell), since even the API's no-op path costs tens of
microseconds a task.  Labels are bounded: the docket, the worker and the task
name, never a task key.

Metrics:

- counters ``docket_tasks_added``, ``docket_tasks_replaced`` and
  ``docket_tasks_scheduled`` (accepted adds and replaces) and
  ``docket_tasks_cancelled`` (cancel calls), counted where they are called;
- counters ``docket_tasks_{started, redelivered, stricken, superseded,
  succeeded, failed, retried, perpetuated, completed}`` of every worker, read
  from the counts its core keeps (no cost on the hot path);
- histograms ``docket_task_duration`` and ``docket_task_punctuality`` (start
  minus the scheduled time), in seconds;
- ``docket_tasks_running``, the task functions each worker is running;
- gauges ``docket_queue_depth`` (messages due and not yet handed to a worker)
  and ``docket_schedule_depth`` (messages due later, or parked behind a full
  concurrency limit) per docket, labelled ``docket.name``: a gauge's callback
  cannot wait for the store, so each worker refreshes them on its heartbeat
  (``measure_depths``, one cheap store call) and the callbacks report the
  last values.

Traces: spans ``docket.add``, ``docket.replace``, ``docket.batch``,
``docket.cancel``, ``docket.strike``, ``docket.restore`` and ``docket.clear``
where the calls are made; one CONSUMER span per run, named after the task function and linked to
the span that scheduled it (its context travels with the task's arguments).
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, Protocol

import anyio
from opentelemetry import metrics, propagate, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.metrics import _internal as _metrics_internal
from opentelemetry.metrics._internal import _ProxyMeterProvider
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode

from .adapter import Depths, StorageAdapter
from .sansio.errors import UsageError
from .sansio.flight import Count

if TYPE_CHECKING:
    from .execution import Execution

meter = metrics.get_meter("docket")
tracer = trace.get_tracer("docket")
_log = logging.getLogger("docket.instrumentation")

# Whether an SDK is installed, checked for cheaply: the API's own getters cost
# microseconds (an environment lookup each), too much to ask twice a task.  A
# provider named by the environment is installed by the first getter call.
_PROVIDER_FROM_ENVIRONMENT = {
    "metrics": "OTEL_PYTHON_METER_PROVIDER" in os.environ,
    "traces": "OTEL_PYTHON_TRACER_PROVIDER" in os.environ,
}
_live = {"metrics": False, "traces": False}


def _installed(kind: str, provider: object, get: Callable[[], object], proxy: type) -> bool:
    if provider is None and not _PROVIDER_FROM_ENVIRONMENT[kind]:
        return False
    _live[kind] = not isinstance(get(), proxy)
    return _live[kind]


def metering() -> bool:
    """Whether an SDK collects metrics (once one does, it always will)."""
    return _live["metrics"] or _installed(
        "metrics",
        _metrics_internal._METER_PROVIDER,
        metrics.get_meter_provider,
        _ProxyMeterProvider,
    )


def tracing() -> bool:
    """Whether an SDK records spans (once one does, it always will)."""
    return _live["traces"] or _installed(
        "traces", trace._TRACER_PROVIDER, trace.get_tracer_provider, trace.ProxyTracerProvider
    )


#: what the span helpers give while nothing records spans
_NO_SPAN: AbstractContextManager[Span] = nullcontext(trace.INVALID_SPAN)

TASKS_ADDED, TASKS_REPLACED, TASKS_SCHEDULED, TASKS_CANCELLED = (
    meter.create_counter(name, unit="1", description=description)
    for name, description in (
        ("docket_tasks_added", "Tasks added to a docket"),
        ("docket_tasks_replaced", "Tasks replaced in a docket"),
        ("docket_tasks_scheduled", "Adds and replaces the docket accepted"),
        ("docket_tasks_cancelled", "Cancellations requested"),
    )
)
TASK_DURATION, TASK_PUNCTUALITY = (
    meter.create_histogram(name, unit="s", description=description)
    for name, description in (
        ("docket_task_duration", "How long task functions ran"),
        ("docket_task_punctuality", "How late tasks started after their time"),
    )
)


class Named(Protocol):
    """Anything with a name (the docket a worker serves)."""

    @property
    def name(self) -> str: ...


class Watched(Protocol):
    """What the metrics read of a worker (``Worker`` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def docket(self) -> Named: ...

    @property
    def counters(self) -> Mapping[str, int]: ...

    @property
    def running_tasks(self) -> int: ...


#: the live workers whose counts the observable instruments report
_workers: weakref.WeakSet[Watched] = weakref.WeakSet()

#: metric -> (description, the core counters it sums)
WORKER_COUNTERS: dict[str, tuple[str, tuple[Count, ...]]] = {
    "docket_tasks_started": ("Task runs started", (Count.STARTED,)),
    "docket_tasks_redelivered": (
        "Deliveries taken over from a silent worker",
        (Count.REDELIVERED,),
    ),
    "docket_tasks_stricken": ("Deliveries not run because of a strike", (Count.STRUCK,)),
    "docket_tasks_superseded": ("Deliveries of superseded generations", (Count.SUPERSEDED,)),
    "docket_tasks_succeeded": ("Runs that returned", (Count.SUCCEEDED,)),
    "docket_tasks_failed": ("Runs (or deliveries) that failed for good", (Count.FAILED,)),
    "docket_tasks_retried": ("Failed runs scheduled again", (Count.RETRIED,)),
    "docket_tasks_perpetuated": ("Perpetual runs scheduled again", (Count.PERPETUATED,)),
    "docket_tasks_completed": (
        "Runs that ended (succeeded, failed, retried or perpetuated)",
        (Count.SUCCEEDED, Count.FAILED, Count.RETRIED, Count.PERPETUATED),
    ),
    # ours (pydocket has no such metrics): what the admission controls did
    "docket_tasks_debounced": ("Deliveries a Debounce dropped", (Count.DEBOUNCED,)),
    "docket_tasks_cooled_down": ("Deliveries a Cooldown dropped", (Count.COOLED_DOWN,)),
    "docket_tasks_rate_limited": (
        "Deliveries a RateLimit did not admit",
        (Count.RATE_LIMITED,),
    ),
    "docket_tasks_rescheduled": (
        "Deliveries not admitted and scheduled to run later",
        (Count.RESCHEDULED,),
    ),
}


def _observe(
    names: tuple[str, ...],
) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def callback(options: CallbackOptions) -> Iterable[Observation]:
        for worker in list(_workers):
            counters = worker.counters
            yield Observation(sum(counters[n] for n in names), worker_attributes(worker))

    return callback


def _running(options: CallbackOptions) -> Iterable[Observation]:
    for worker in list(_workers):
        yield Observation(worker.running_tasks, worker_attributes(worker))


for _name, (_description, _names) in WORKER_COUNTERS.items():
    meter.create_observable_counter(
        _name, callbacks=[_observe(_names)], unit="1", description=_description
    )
meter.create_observable_up_down_counter(
    "docket_tasks_running",
    callbacks=[_running],
    unit="1",
    description="Task functions running now",
)


class Measured(Protocol):
    """What the depth gauges read of a docket (``Docket`` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def adapter(self) -> StorageAdapter: ...


#: docket name -> its last measured depths (what the gauges report)
_depths: dict[str, Depths] = {}
#: docket name -> how many ``measure_depths`` loops keep it fresh
_measuring: dict[str, int] = {}


def _depth_gauge(field: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def callback(options: CallbackOptions) -> Iterable[Observation]:
        for name, depths in list(_depths.items()):
            yield Observation(getattr(depths, field), {"docket.name": name})

    return callback


meter.create_observable_gauge(
    "docket_queue_depth",
    callbacks=[_depth_gauge("queued")],
    unit="1",
    description="Tasks due now and not yet handed to a worker",
)
meter.create_observable_gauge(
    "docket_schedule_depth",
    callbacks=[_depth_gauge("scheduled")],
    unit="1",
    description="Tasks due later, or waiting for a concurrency slot",
)


async def refresh_depths(docket: Measured) -> Depths:
    """Measure the docket's depths now (one store call) and keep them for
    the gauges; the store's errors reach the caller."""
    depths = await docket.adapter.depths(time.time())
    _depths[docket.name] = depths
    return depths


async def measure_depths(docket: Measured, interval: float) -> None:
    """Refresh the docket's depth gauges every ``interval`` seconds while an
    SDK collects metrics (without one, nothing is asked of the store), until
    cancelled.  A failed measure withdraws the values until the next one
    succeeds (a gauge shows nothing rather than a stale depth); the gauges
    forget the docket when its last loop ends."""
    name = docket.name
    _measuring[name] = _measuring.get(name, 0) + 1
    try:
        while True:
            if metering():
                try:
                    await refresh_depths(docket)
                except Exception as error:  # a metric never stops a worker
                    _depths.pop(name, None)
                    _log.debug("docket %s: measuring its depths failed: %s", name, error)
            await anyio.sleep(interval)
    finally:
        _measuring[name] -= 1
        if not _measuring[name]:
            del _measuring[name]
            _depths.pop(name, None)


def worker_attributes(worker: Watched) -> dict[str, str]:
    return {"docket.name": worker.docket.name, "docket.worker": worker.name}


def watch(worker: Watched) -> None:
    """Report ``worker``'s counts while it lives."""
    _workers.add(worker)


# -- traces ------------------------------------------------------------------------------


def producer_span(
    operation: str, docket: str, attributes: Mapping[str, Any] | None = None
) -> AbstractContextManager[Span]:
    """A span around one of the docket's calls (``docket.add``...)."""
    return _producer_span(operation, docket, attributes) if tracing() else _NO_SPAN


@contextmanager
def _producer_span(
    operation: str, docket: str, attributes: Mapping[str, Any] | None
) -> Iterator[Span]:
    with tracer.start_as_current_span(
        f"docket.{operation}",
        kind=SpanKind.PRODUCER if operation in ("add", "replace") else SpanKind.CLIENT,
        attributes={"docket.name": docket, **(attributes or {})},
    ) as span:
        yield span


def trace_headers(span: Span) -> dict[str, str] | None:
    """The trace context to send along with a task, if there is one."""
    if not tracing() or not span.get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier or None


def task_span(
    execution: Execution, headers: Mapping[str, str], labels: Mapping[str, str]
) -> AbstractContextManager[Span]:
    """The CONSUMER span of one run, linked to the span that scheduled it."""
    return _task_span(execution, headers, labels) if tracing() else _NO_SPAN


@contextmanager
def _task_span(
    execution: Execution, headers: Mapping[str, str], labels: Mapping[str, str]
) -> Iterator[Span]:
    links: list[Link] = []
    if headers:
        producer = trace.get_current_span(propagate.extract(headers)).get_span_context()
        if producer.is_valid:
            links.append(Link(producer))
    with tracer.start_as_current_span(
        execution.function_name,
        kind=SpanKind.CONSUMER,
        links=links,
        attributes=labels,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        if span.is_recording():
            span.set_attributes(
                {
                    "docket.key": execution.key,
                    "docket.attempt": execution.attempt,
                    "docket.when": execution.when.isoformat(),
                }
            )
        yield span


def failed(span: Span, error: BaseException) -> None:
    """Mark a run's span as failed with ``error``."""
    if span.is_recording():
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))


def interrupted(span: Span, reason: str | None) -> None:
    """Mark a run's span as cancelled (by a cancel, a timeout, a lost lease)."""
    if span.is_recording():
        span.set_attribute("docket.cancelled", reason or "cancelled")
        span.set_status(Status(StatusCode.ERROR, reason or "cancelled"))


def serve_metrics(port: int, host: str = "0.0.0.0") -> None:
    """Install an OpenTelemetry SDK whose metrics Prometheus scrapes from
    ``http://host:port/metrics`` (a thread serves them)."""
    try:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from opentelemetry.sdk.metrics import MeterProvider
        from prometheus_client import start_http_server
    except ImportError as error:
        raise UsageError(
            f"serving metrics needs the metrics extra: pip install 'docket[metrics]' ({error})"
        ) from error
    start_http_server(port, addr=host)
    metrics.set_meter_provider(MeterProvider(metric_readers=[PrometheusMetricReader()]))
