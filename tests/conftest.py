"""Shared fixtures: both anyio backends, a fresh memory docket, a fast worker."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta

import pytest

from docket_core import Docket, Worker


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    backend: str = request.param
    return backend


@pytest.fixture
def now() -> Callable[[], datetime]:
    def _now() -> datetime:
        return datetime.now(UTC)

    return _now


@pytest.fixture
async def docket() -> AsyncIterator[Docket]:
    name = f"test-{uuid.uuid4().hex}"
    async with Docket(name=name, url=f"memory://{name}") as entered:
        yield entered


@pytest.fixture
async def worker(docket: Docket) -> AsyncIterator[Worker]:
    async with Worker(
        docket,
        name=f"worker-{uuid.uuid4().hex[:8]}",
        minimum_check_interval=timedelta(milliseconds=5),
        scheduling_resolution=timedelta(milliseconds=5),
    ) as entered:
        yield entered
