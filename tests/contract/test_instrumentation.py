"""Metrics and traces through OpenTelemetry: an SDK with in-memory readers is
installed once for this process, and each test looks at what docket reported.
The worker command serving metrics to Prometheus is in
``tests/cli/test_cli_worker.py``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import anyio
import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import SpanKind, StatusCode

from docket_core import Docket, Retry, Worker

pytestmark = pytest.mark.anyio

EXPORTER = InMemorySpanExporter()
READER = InMemoryMetricReader()


class Recording(Sampler):
    """Samples every span while on; off, the later test modules (which share
    this process's one provider) record none and keep none in memory."""

    on = True

    def should_sample(
        self,
        parent_context: Any,
        trace_id: int,
        name: str,
        kind: Any = None,
        attributes: Any = None,
        links: Any = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        if not self.on:
            return SamplingResult(Decision.DROP)
        return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)

    def get_description(self) -> str:
        return "Recording"


@pytest.fixture(scope="module", autouse=True)
def sdk() -> Iterator[None]:
    """Install the SDK once: OpenTelemetry allows one provider per process."""
    sampler = Recording()
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[READER]))
    yield
    sampler.on = False
    EXPORTER.clear()


@pytest.fixture(autouse=True)
def fresh_spans() -> Iterator[None]:
    EXPORTER.clear()
    yield
    EXPORTER.clear()


def make_worker(docket: Docket) -> Worker:
    from datetime import timedelta

    return Worker(
        docket,
        name=f"traced-{os.urandom(3).hex()}",
        minimum_check_interval=timedelta(milliseconds=5),
        schedule_automatic_tasks=False,
    )


def spans_named(name: str) -> list[ReadableSpan]:
    return [s for s in EXPORTER.get_finished_spans() if s.name == name]


def attributes_of(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


async def greet(name: str) -> str:
    return f"hello {name}"


async def explode(retry: Retry = Retry(attempts=1)) -> None:
    raise ValueError("kaboom")


# -- traces ---------------------------------------------------------------------------------


async def test_a_run_is_traced_and_linked_to_the_span_that_added_it(docket: Docket) -> None:
    docket.register(greet)
    tracer = trace.get_tracer("the-application")
    with tracer.start_as_current_span("request") as request:
        execution = await docket.add(greet, key="traced")("world")
    with anyio.fail_after(10):
        await make_worker(docket).run_until_finished()
    assert await execution.get_result() == "hello world"

    (add,) = spans_named("docket.add")
    assert add.kind is SpanKind.PRODUCER
    assert add.parent is not None and add.parent.span_id == request.get_span_context().span_id
    assert attributes_of(add) == {
        "docket.name": docket.name,
        "docket.task": "greet",
        "docket.key": "traced",
    }
    (run,) = spans_named("greet")
    assert run.kind is SpanKind.CONSUMER
    assert [link.context.span_id for link in run.links] == [add.context.span_id]
    assert run.context.trace_id != add.context.trace_id  # a run starts a trace of its own
    attributes = attributes_of(run)
    assert attributes["docket.key"] == "traced"
    assert attributes["docket.name"] == docket.name
    assert attributes["docket.attempt"] == 1
    assert run.status.status_code is not StatusCode.ERROR


async def test_a_failed_run_marks_its_span(docket: Docket) -> None:
    docket.register(explode)
    await docket.add(explode, key="boom")()
    with anyio.fail_after(10):
        await make_worker(docket).run_until_finished()
    (run,) = spans_named("explode")
    assert run.status.status_code is StatusCode.ERROR
    assert "ValueError: kaboom" in (run.status.description or "")
    assert [e.name for e in run.events] == ["exception"]


async def test_cancel_strike_restore_and_clear_are_traced(docket: Docket) -> None:
    docket.register(greet)
    await docket.add(greet, key="later")("x")
    await docket.cancel("later")
    await docket.strike(greet)
    await docket.restore(greet)
    await docket.clear()
    names = [s.name for s in EXPORTER.get_finished_spans()]
    assert names == [
        "docket.add",
        "docket.cancel",
        "docket.strike",
        "docket.restore",
        "docket.clear",
    ]


# -- metrics ------------------------------------------------------------------------------


def metric_points(docket: Docket) -> dict[str, Any]:
    """Metric name -> the value (sums) or count (histograms) of this docket's points."""
    values: dict[str, Any] = {}
    data = READER.get_metrics_data()
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    if dict(point.attributes or {}).get("docket.name") != docket.name:
                        continue
                    value = getattr(point, "value", None)
                    if value is None:
                        value = point.count  # type: ignore[union-attr]
                    values[metric.name] = values.get(metric.name, 0) + value
    return values


@pytest.mark.backends("memory-asyncio", "redis-asyncio")
async def test_metrics_count_what_the_admission_controls_did(docket: Docket) -> None:
    from docket_core import Cooldown

    async def alert(n: int, cooldown: Cooldown = Cooldown(timedelta(minutes=1))) -> None:
        pass

    for n in range(3):
        await docket.add(alert)(n)
    worker = make_worker(docket)
    with anyio.fail_after(10):
        await worker.run_until_finished()
    points = metric_points(docket)
    assert points["docket_tasks_started"] == 1
    assert points["docket_tasks_cooled_down"] == 2
    assert points["docket_tasks_debounced"] == points["docket_tasks_rate_limited"] == 0


@pytest.mark.backends("memory-asyncio", "redis-asyncio")
async def test_metrics_count_what_the_docket_and_its_workers_did(docket: Docket) -> None:
    docket.register(greet)
    docket.register(explode)
    await docket.add(greet, key="one")("a")
    await docket.add(greet, key="one")("a")  # the same key: added, not scheduled
    await docket.add(greet)("b")
    await docket.add(explode)()
    worker = make_worker(docket)
    with anyio.fail_after(10):
        await worker.run_until_finished()
    points = metric_points(docket)
    assert points["docket_tasks_added"] == 4
    assert points["docket_tasks_scheduled"] == 3
    assert points["docket_tasks_started"] == 3
    assert points["docket_tasks_succeeded"] == 2
    assert points["docket_tasks_failed"] == 1
    assert points["docket_tasks_completed"] == 3
    assert points["docket_tasks_running"] == 0
    assert points["docket_task_duration"] == 3
    assert points["docket_task_punctuality"] == 3
