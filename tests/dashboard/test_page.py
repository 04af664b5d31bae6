"""The dashboard page in a real headless Chromium (Debian's ``chromium``,
driven by playwright; no browser is downloaded), on a docket on the
session's private redis-server: the page follows a task from scheduled to
running (with its progress) to completed, shows the rest of the docket
(schedule, workers, failures, dead letters, strikes) with every text escaped,
cannot change the docket, and is saved as ``docs/dashboard.png`` (README's
screenshot).  Outside CI a missing chromium or playwright skips this test;
under ``CI=true`` it fails it.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import pytest
import redis
from helpers import make_worker
from servers import Server

from docket_core import Docket, Progress

if TYPE_CHECKING:
    from playwright.async_api import Page

pytestmark = [pytest.mark.anyio, pytest.mark.backends("redis-asyncio")]

#: the ``open_dashboard`` fixture (tests/dashboard/conftest.py)
OpenDashboard = Callable[..., AbstractAsyncContextManager[str]]

SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "dashboard.png"
#: how long the page may take to show a change (it polls every 0.25 s here)
SHOWN = 10_000
INJECTED_KEY = 'charge-<img src=x onerror="window.__pwned = 1">'
INJECTED_ERROR = "card declined <script>window.__pwned = 2</script>"


def chromium_path() -> str:
    """Debian's chromium; skips (fails under CI) without it or playwright."""
    missing = None
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        missing = "playwright is not installed (the tests extra)"
    path = "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None
    path = path or shutil.which("chromium")
    if path is None:
        missing = missing or "chromium is not installed (Debian package chromium)"
    if missing is not None or path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{missing}, and CI must run the dashboard test")
        pytest.skip(str(missing))
    return path


@pytest.fixture
async def page() -> AsyncIterator[Page]:
    executable = chromium_path()
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=executable, headless=True)
        try:
            context = await browser.new_context(viewport={"width": 1280, "height": 900})
            yield await context.new_page()
        finally:
            await browser.close()


async def test_the_page_follows_a_task_from_scheduled_to_running_to_completed(
    make_docket: Callable[..., Awaitable[Docket]],
    server_for: Callable[[], Server | None],
    open_dashboard: OpenDashboard,
    page: Page,
) -> None:
    from playwright.async_api import expect

    docket = await make_docket(f"orders-{uuid.uuid4().hex[:6]}")
    release_report, release_import = anyio.Event(), anyio.Event()

    async def render_report(quarter: str, progress: Progress = Progress()) -> None:
        await progress.set_total(10)
        await progress.increment(3)
        await progress.set_message(f"rendering {quarter}: waiting for the test")
        await release_report.wait()
        await progress.increment(7)

    async def import_catalog(progress: Progress = Progress()) -> None:
        await progress.set_total(20)
        await progress.increment(7)
        await progress.set_message("importing page 7 of 20")
        await release_import.wait()

    async def charge_card(order: int) -> None:
        raise ValueError(INJECTED_ERROR)

    async def send_newsletter(edition: str) -> None: ...

    async def rebuild_search_index() -> None: ...

    async def legacy_export(customer: int) -> None: ...

    for task in (render_report, import_catalog, charge_card, send_newsletter):
        docket.register(task)
    for task in (rebuild_search_index, legacy_export):
        docket.register(task)
    now = datetime.now(UTC)
    await docket.add(send_newsletter, now + timedelta(minutes=12), "newsletter-weekly")("42")
    await docket.add(rebuild_search_index, now + timedelta(minutes=41), "reindex-nightly")()
    await docket.add(send_newsletter, now + timedelta(hours=3), "newsletter-monthly")("7")
    await docket.strike(legacy_export)
    await docket.strike(send_newsletter, "edition", "==", "13")
    write_malformed_entry(server_for, docket.name)

    worker = make_worker(docket, name="worker-1", concurrency=4)
    async with open_dashboard(docket, interval=0.25) as url, anyio.create_task_group() as group:
        group.start_soon(worker.run_forever)
        await page.goto(url)
        await expect(page.locator("#docket-name")).to_have_text(docket.name, timeout=SHOWN)

        now = datetime.now(UTC)
        # due in a few seconds, not at once: the page must see them scheduled first
        await docket.add(render_report, now + timedelta(seconds=5), "report-2024-q3")("Q3")
        await docket.add(charge_card, now + timedelta(seconds=2), INJECTED_KEY)(1001)
        await docket.add(import_catalog, key="catalog-import")()

        # scheduled...
        scheduled = row(page, "schedule", "report-2024-q3")
        await expect(scheduled.locator(".state")).to_have_text("scheduled", timeout=4_500)
        # ...running, with its progress...
        running = row(page, "running", "report-2024-q3")
        await expect(running).to_contain_text("3 / 10", timeout=SHOWN)
        await expect(running).to_contain_text("rendering Q3: waiting for the test")
        await expect(running).to_contain_text("worker-1")
        assert await running.locator("progress").get_attribute("max") == "10"
        await expect(scheduled).to_have_count(0)
        # ...completed, once the test lets it
        release_report.set()
        finished = row(page, "finished", "report-2024-q3")
        await expect(finished.locator(".state")).to_have_text("completed", timeout=SHOWN)
        await expect(running).to_have_count(0)

        await expect_the_rest_of_the_docket(page)
        SCREENSHOT.parent.mkdir(exist_ok=True)
        await page.screenshot(path=str(SCREENSHOT), full_page=True)

        # nothing on the page can change the docket, not even a script on it
        status = await page.evaluate(
            "fetch('api/state', {method: 'POST', body: 'clear'}).then(r => r.status)"
        )
        assert status == 405
        release_import.set()
        group.cancel_scope.cancel()
    assert SCREENSHOT.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


async def expect_the_rest_of_the_docket(page: Page) -> None:
    from playwright.async_api import expect

    # the escaped failure: its key and error shown as text, nothing run
    failure = row(page, "failures", "charge-<img")
    await expect(failure).to_contain_text(INJECTED_KEY, timeout=SHOWN)
    await expect(failure.locator("td.error")).to_have_text(f"ValueError: {INJECTED_ERROR}")
    assert await page.evaluate("window.__pwned") is None
    assert await page.locator("main img, main script, main b").count() == 0

    await expect(row(page, "running", "catalog-import")).to_contain_text("7 / 20")
    await expect(row(page, "schedule", "newsletter-weekly")).to_contain_text("in 12 min")
    await expect(row(page, "schedule", "reindex-nightly")).to_contain_text("in 41 min")
    await expect(row(page, "schedule", "newsletter-monthly")).to_have_count(0)  # not this hour
    await expect(row(page, "workers", "worker-1")).to_have_count(1)
    await expect(page.locator("#chart polyline")).to_have_count(5)
    await expect(page.locator("#dead-letters tbody tr")).to_have_count(1, timeout=SHOWN)
    await expect(row(page, "dead-letters", "ghost-order")).to_contain_text("lacks the field")
    strikes = page.locator("#strikes tbody tr")
    await expect(strikes).to_have_text(
        ["legacy_exportevery call", "send_newsletteredition == '13'"]
    )
    await expect(page.locator("#total-running")).to_have_text("1")
    await expect(page.locator("#status")).to_contain_text("updated")


def row(page: Page, table: str, text: str) -> Any:
    """The rows of table ``table`` that show ``text``."""
    return page.locator(f"#{table} tbody tr").filter(has_text=text)


def write_malformed_entry(server_for: Callable[[], Server | None], docket_name: str) -> None:
    """A queue entry that lacks fields: the worker sets it aside as a dead letter."""
    server = server_for()
    assert server is not None
    client = redis.Redis(host="127.0.0.1", port=server.port)
    try:
        fields = {"k": "ghost-order", "f": "send_newsletter", "p": b"x", "w": "0", "a": "1"}
        client.xadd("{" + docket_name + "}:q", fields)  # type: ignore[arg-type]
    finally:
        client.close()
