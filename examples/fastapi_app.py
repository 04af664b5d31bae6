"""A web service with docket: FastAPI opens one Docket in its lifespan, runs a
worker beside the app, and its endpoints add tasks and report their state.

Run it with ``uvicorn examples.fastapi_app:app`` (``pip install uvicorn``).
``DOCKET_URL`` names the store (``memory://`` by default: this process only;
``redis://localhost:6379/0`` shares the docket with other workers and
services) and ``DOCKET_NAME`` the docket.  Then::

    curl -X POST localhost:8000/emails -H 'content-type: application/json' \\
         -d '{"to": "ada@example.com", "subject": "Welcome"}'
    curl -X POST localhost:8000/reports -H 'content-type: application/json' \\
         -d '{"customer_id": 7, "pages": 5}'
    curl localhost:8000/tasks/<key from the answer>
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import anyio
from fastapi import Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel, Field

from docket_core import Docket, Execution, ExecutionState, Progress, Worker

# -- tasks ---------------------------------------------------------------------------------------


async def send_email(to: str, subject: str) -> str:
    await anyio.sleep(0.05)  # a mail server would answer here
    return f"sent {subject!r} to {to}"


async def build_report(
    customer_id: int, pages: int, progress: Progress = Progress()
) -> dict[str, int]:
    """A longer task that reports its progress, page by page (``GET /tasks/{key}``
    shows it while the task runs)."""
    await progress.set_total(pages)
    for page in range(1, pages + 1):
        await progress.set_message(f"page {page} of {pages}")
        await anyio.sleep(0.1)  # rendering the page
        await progress.increment()
    return {"customer_id": customer_id, "pages": pages}


TASKS = (send_email, build_report)


# -- the docket and its worker, for the app's lifetime ---------------------------------------------


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    url = os.environ.get("DOCKET_URL", "memory://")
    name = os.environ.get("DOCKET_NAME", "fastapi-example")
    async with Docket(name=name, url=url) as docket:
        for task in TASKS:
            docket.register(task)
        app.state.docket = docket
        async with anyio.create_task_group() as group:
            group.start_soon(run_worker, docket)
            try:
                yield
            finally:
                group.cancel_scope.cancel()  # the worker drains its running tasks


async def run_worker(docket: Docket) -> None:
    # the web server owns SIGINT and SIGTERM: its lifespan's end stops the worker
    worker = Worker(
        docket, concurrency=4, drain_timeout=timedelta(seconds=10), handle_signals=False
    )
    await worker.run_forever()


app = FastAPI(title="docket example", lifespan=lifespan)


def get_docket(request: Request) -> Docket:
    docket: Docket = request.app.state.docket
    return docket


CurrentDocket = Annotated[Docket, Depends(get_docket)]


# -- endpoints -----------------------------------------------------------------------------------


class Email(BaseModel):
    to: str
    subject: str
    #: send it this many seconds from now
    delay: float = Field(default=0.0, ge=0, le=86_400)


class Report(BaseModel):
    customer_id: int
    pages: int = Field(default=5, ge=1, le=1000)


def added(execution: Execution) -> dict[str, Any]:
    return {
        "key": execution.key,
        "function": execution.function_name,
        "disposition": execution.disposition.name.lower(),
        "when": execution.when.isoformat(),
    }


@app.post("/emails", status_code=202)
async def add_email(email: Email, docket: CurrentDocket) -> dict[str, Any]:
    when = datetime.now(UTC) + timedelta(seconds=email.delay)
    execution = await docket.add(send_email, when=when)(email.to, email.subject)
    return added(execution)


@app.post("/reports", status_code=202)
async def add_report(report: Report, docket: CurrentDocket) -> dict[str, Any]:
    # one report per customer at a time: the key makes a second request a no-op
    key = f"report-{report.customer_id}"
    execution = await docket.add(build_report, key=key)(report.customer_id, report.pages)
    return added(execution)


@app.get("/tasks/{key}")
async def task_state(key: str, docket: CurrentDocket) -> dict[str, Any]:
    execution = await docket.get_execution(key)
    if execution is None:
        raise HTTPException(status_code=404, detail=f"no task {key!r}")
    progress = execution.progress
    state: dict[str, Any] = {
        "key": execution.key,
        "function": execution.function_name,
        "state": execution.state.value,
        "when": execution.when.isoformat(),
        "attempt": execution.attempt,
        "worker": execution.worker,
        "started_at": execution.started_at and execution.started_at.isoformat(),
        "completed_at": execution.completed_at and execution.completed_at.isoformat(),
        "progress": {
            "current": progress.current,
            "total": progress.total,
            "message": progress.message,
        },
        "error": execution.error,
        "result": None,
    }
    if execution.state is ExecutionState.COMPLETED:
        state["result"] = await execution.get_result()  # (at once: it has ended)
    return state
