"""The dashboard over plain HTTP: what it serves, what it refuses, what the
JSON view says about a docket, and that no request changes the docket."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any

import anyio
import httpx
import pytest
from helpers import make_worker, running
from servers import free_port

from docket_core import Docket, Progress
from docket_core.dashboard.observer import Observer, redact
from docket_core.sansio.errors import StoreUnavailable

pytestmark = [pytest.mark.anyio, pytest.mark.backends("memory-asyncio", "memory-trio")]

#: the ``open_dashboard`` fixture (tests/dashboard/conftest.py)
OpenDashboard = Callable[..., AbstractAsyncContextManager[str]]


async def state_of(client: httpx.AsyncClient) -> dict[str, Any]:
    response = await client.get("api/state")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    state: dict[str, Any] = response.json()
    return state


async def test_the_page_its_script_and_style_are_served_with_a_strict_policy(
    docket: Docket, open_dashboard: OpenDashboard
) -> None:
    async with open_dashboard(docket) as url, httpx.AsyncClient(base_url=url) as client:
        page = await client.get("/")
        assert page.status_code == 200
        assert page.headers["content-type"] == "text/html; charset=utf-8"
        assert '<script src="dashboard.js" defer></script>' in page.text
        policy = page.headers["content-security-policy"]
        assert "default-src 'none'" in policy and "script-src 'self'" in policy
        assert "connect-src 'self'" in policy and "frame-ancestors 'none'" in policy
        assert page.headers["x-content-type-options"] == "nosniff"
        assert page.headers["cache-control"] == "no-store"

        script = await client.get("dashboard.js")
        assert script.headers["content-type"].startswith("text/javascript")
        assert "api/state" in script.text
        style = await client.get("dashboard.css")
        assert style.headers["content-type"].startswith("text/css")
        assert (await client.get("favicon.ico")).status_code == 404
        assert (await client.get("observer.py")).status_code == 404
        assert (await client.get("static/index.html")).status_code == 404


async def test_every_method_but_get_is_refused_and_changes_nothing(
    docket: Docket, open_dashboard: OpenDashboard
) -> None:
    async def job() -> None: ...

    docket.register(job)
    await docket.add(job, when=datetime.now(UTC) + timedelta(minutes=5), key="stays")()
    before = await docket.snapshot()
    async with open_dashboard(docket) as url, httpx.AsyncClient(base_url=url) as client:
        for method in ("POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "TRACE"):
            for path in ("/", "api/state", "anything"):
                response = await client.request(method, path, content=b"key=stays" * 10_000)
                assert response.status_code == 405, (method, path)
                assert response.headers["allow"] == "GET"
    after = await docket.snapshot()
    assert [e.key for e in after.future] == [e.key for e in before.future] == ["stays"]
    assert (await docket.adapter.strikes()).empty


async def test_malformed_requests_and_foreign_hosts_get_errors(
    docket: Docket, open_dashboard: OpenDashboard
) -> None:
    async def raw(port: int, head: bytes) -> bytes:
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            await stream.send(head)
            reply = b""
            with anyio.fail_after(5):
                while True:
                    try:
                        reply += await stream.receive()
                    except anyio.EndOfStream:
                        return reply

    async with open_dashboard(docket) as url:
        port = int(url.rsplit(":", 1)[1].strip("/"))
        assert (await raw(port, b"nonsense\r\n\r\n")).startswith(b"HTTP/1.1 400 ")
        assert (await raw(port, b"GET / HTTP/2\r\n\r\n")).startswith(b"HTTP/1.1 505 ")
        assert (await raw(port, b"GET / HTTP/1.1\r\nX: " + b"a" * 20_000)).startswith(
            b"HTTP/1.1 431 "
        )
        # a page that rebinds its own name to 127.0.0.1 must not read the docket
        rebound = b"GET /api/state HTTP/1.1\r\nHost: attacker.example:%d\r\n\r\n" % port
        assert (await raw(port, rebound)).startswith(b"HTTP/1.1 403 ")
        assert (await raw(port, b"GET /api/state HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 403 ")
        for host in (b"localhost", b"127.0.0.1", b"[::1]"):
            ok = b"GET /api/state HTTP/1.1\r\nHost: %s:%d\r\n\r\n" % (host, port)
            reply = await raw(port, ok)
            assert reply.startswith(b"HTTP/1.1 200 ")
            assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["docket"] == docket.name


async def test_the_view_shows_the_schedule_of_the_hour_running_tasks_endings_and_strikes(
    docket: Docket, open_dashboard: OpenDashboard
) -> None:
    release = anyio.Event()

    async def slow(progress: Progress = Progress()) -> None:
        await progress.set_total(8)
        await progress.increment(5)
        await progress.set_message("halfway <there>")
        await release.wait()

    async def broken() -> None:
        raise RuntimeError("no <b>luck</b>")

    async def later() -> None: ...

    for task in (slow, broken, later):
        docket.register(task)
    now = datetime.now(UTC)
    await docket.add(later, when=now + timedelta(minutes=30), key="in-half-an-hour")()
    await docket.add(later, when=now + timedelta(hours=3), key="in-three-hours")()
    # (due soon, not at once: the dashboard sees them scheduled, then how they end)
    await docket.add(broken, when=now + timedelta(seconds=2), key="breaks")()
    await docket.add(slow, when=now + timedelta(seconds=2), key="slow")()
    await docket.strike("later")
    await docket.strike(parameter="customer", operator=">=", value=13)

    async with open_dashboard(docket) as url, httpx.AsyncClient(base_url=url) as client:
        state = await state_of(client)
        assert state["ok"] and state["docket"] == docket.name
        assert state["totals"]["scheduled"] == 4 and state["totals"]["running"] == 0
        assert [s["key"] for s in state["schedule"]] == ["breaks", "slow", "in-half-an-hour"]
        assert {s["state"] for s in state["schedule"]} == {"scheduled"}
        assert state["strikes"] == [
            {"function": "later", "parameter": None, "operator": None, "value": None},
            {"function": None, "parameter": "customer", "operator": ">=", "value": "13"},
        ]

        worker = make_worker(docket, name="viewed-worker")
        async with running(worker, limit=20):
            with anyio.fail_after(10):
                while not (state := await state_of(client))["failures"] or not state["running"]:
                    await anyio.sleep(0.1)
            (failure,) = state["failures"]
            assert failure["key"] == "breaks" and failure["function"] == "broken"
            assert failure["error"] == "RuntimeError: no <b>luck</b>"
            assert failure["state"] == "failed" and failure["worker"] == "viewed-worker"
            (run,) = state["running"]
            assert run["key"] == "slow" and run["worker"] == "viewed-worker"
            assert run["progress"] == {"current": 5, "total": 8, "message": "halfway <there>"}
            assert [w["name"] for w in state["workers"]] == ["viewed-worker"]

            release.set()
            with anyio.fail_after(10):
                while not any(f["key"] == "slow" for f in (await state_of(client))["finished"]):
                    await anyio.sleep(0.1)
            state = await state_of(client)
            assert [(f["key"], f["state"]) for f in state["finished"]] == [
                ("slow", "completed"),
                ("breaks", "failed"),
            ]
            assert state["running"] == [] and state["totals"]["running"] == 0
            assert sum(s["completed"] for s in state["history"]) == 1
            assert sum(s["failed"] for s in state["history"]) == 1


async def test_a_sample_that_fails_keeps_the_last_view_marked_stale(docket: Docket) -> None:
    observer = Observer(docket, interval=0.5)
    await observer.sample()
    assert json.loads(observer.body)["ok"] is True
    observer.failed(StoreUnavailable("the server went away"))
    stale = json.loads(observer.body)
    assert stale["ok"] is False
    assert stale["error"] == "StoreUnavailable: the server went away"
    assert stale["docket"] == docket.name and stale["interval"] == 0.5


def test_the_url_shown_hides_passwords_and_queries() -> None:
    assert redact("redis://user:s3cret@db:6379/0") == "redis://user:***@db:6379/0"
    assert redact("redis://:s3cret@db:6379/0") == "redis://***@db:6379/0"
    assert redact("rediss://db:6380/1?password=s3cret") == "rediss://db:6380/1"
    assert redact("memory://here") == "memory://here"


def test_the_script_never_parses_text_as_html() -> None:
    """Everything from the docket goes in as text: the script has no way to
    parse HTML (the browser test checks the page itself)."""
    script = (resources.files("docket_core.dashboard") / "static" / "dashboard.js").read_text()
    forbidden = r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function"
    assert re.findall(forbidden, script) == []
    page = (resources.files("docket_core.dashboard") / "static" / "index.html").read_text()
    assert re.findall(r"<script>|\son[a-z]+=|https?://", page) == []


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_serve_dashboard_serves_until_a_signal_stops_it(stop: signal.Signals) -> None:
    """``serve_dashboard`` (what ``docket dashboard`` calls) blocks serving,
    and SIGINT or SIGTERM ends it cleanly."""
    port = free_port()
    code = (
        "from docket_core.dashboard import serve_dashboard\n"
        f"serve_dashboard(url='memory://served', name='served', host='127.0.0.1', port={port})"
    )
    process = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                state = httpx.get(f"http://127.0.0.1:{port}/api/state", timeout=1).json()
                break
            except httpx.TransportError:
                assert process.poll() is None, process.communicate()[1].decode()
                assert time.monotonic() < deadline, "the dashboard never answered"
                time.sleep(0.1)
        assert state["docket"] == "served" and state["url"] == "memory://served"
        assert state["ok"] is True
        process.send_signal(stop)
        _, errors = process.communicate(timeout=15)
        assert process.returncode == 0, errors.decode()
        assert b"Traceback" not in errors, errors.decode()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
