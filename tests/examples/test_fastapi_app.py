"""``examples/fastapi_app.py``, driven through its ASGI interface with httpx
(its lifespan run as a server would): tasks added through the API run on the
worker the app starts, and ``GET /tasks/{key}`` follows them to their end."""

from __future__ import annotations

import importlib.util
import sys
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import httpx
import pytest

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.backends("memory-asyncio", "memory-trio", "redis-asyncio"),
]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fastapi_app.py"


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch, docket_url: str) -> ModuleType:
    """The example module, fresh, on the current backend's store."""
    monkeypatch.setenv("DOCKET_URL", docket_url)
    monkeypatch.setenv("DOCKET_NAME", f"example-{uuid.uuid4().hex}")
    spec = importlib.util.spec_from_file_location("fastapi_app_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # (pydantic looks up annotations there)
    spec.loader.exec_module(module)
    return module


async def wait_for(
    client: httpx.AsyncClient, key: str, state: str, seen: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The task's answer once it reaches ``state``; the answers before go to ``seen``."""
    with anyio.fail_after(10):
        while True:
            response = await client.get(f"/tasks/{key}")
            assert response.status_code == 200
            body: dict[str, Any] = response.json()
            if body["state"] == state:
                return body
            assert body["state"] in {"scheduled", "queued", "running"}, body
            if seen is not None:
                seen.append(body)
            await anyio.sleep(0.02)


async def test_tasks_added_through_the_api_complete_on_the_apps_worker(
    example: ModuleType,
) -> None:
    app = example.app
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as client,
    ):
        response = await client.post("/emails", json={"to": "ada@example.com", "subject": "Hi"})
        assert response.status_code == 202
        email = response.json()
        assert email["function"] == "send_email" and email["disposition"] == "scheduled"

        done = await wait_for(client, email["key"], "completed")
        assert done["result"] == "sent 'Hi' to ada@example.com"
        assert done["error"] is None and done["attempt"] == 1
        assert done["worker"] and done["started_at"] and done["completed_at"]

        report = (await client.post("/reports", json={"customer_id": 7, "pages": 10})).json()
        assert report["key"] == "report-7"
        again = (await client.post("/reports", json={"customer_id": 7, "pages": 10})).json()
        assert again["disposition"] == "already_scheduled"
        seen: list[dict[str, Any]] = []
        done = await wait_for(client, "report-7", "completed", seen)
        assert done["result"] == {"customer_id": 7, "pages": 10}
        # while it ran (a page a tenth of a second), the API showed its progress
        progress = [answer["progress"] for answer in seen if answer["state"] == "running"]
        assert progress, "the report was never seen running"
        assert all(p["total"] == 10 for p in progress if p["message"]), progress
        assert any(p["message"] and p["current"] >= 1 for p in progress), progress

        later = await client.post("/emails", json={"to": "b@x", "subject": "s", "delay": 600})
        assert (await client.get(f"/tasks/{later.json()['key']}")).json()["state"] == "scheduled"

        assert (await client.get("/tasks/no-such-key")).status_code == 404
        invalid = await client.post("/reports", json={"customer_id": "seven"})
        assert invalid.status_code == 422
