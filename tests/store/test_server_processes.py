"""Two worker processes share one docket on a real server.

Each worker is a separate Python process (a small script written to a
temporary directory, run on the backend's event loop, so GLIDE runs under
trio too); the test process only produces and checks.  Every task must run
exactly once, in one of the two processes, and both must take part.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
from backends import SERVER_BACKENDS

from docket_core import ExecutionState, TaskKey

pytestmark = pytest.mark.anyio


WORKER_SCRIPT = textwrap.dedent(
    """
    import os
    import sys
    from datetime import timedelta

    import anyio

    from docket_core import Docket, TaskKey, Worker

    url, docket_name, worker_name, backend, log = sys.argv[1:]


    async def whoami(key: str = TaskKey()) -> int:
        with open(log, "a") as out:
            out.write(key + "\\n")
        await anyio.sleep(0.02)
        return os.getpid()


    async def main() -> None:
        async with Docket(name=docket_name, url=url) as docket:
            docket.register(whoami)
            worker = Worker(
                docket,
                name=worker_name,
                concurrency=4,
                minimum_check_interval=timedelta(milliseconds=10),
                scheduling_resolution=timedelta(milliseconds=10),
                schedule_automatic_tasks=False,
            )
            async with worker:
                await worker.run_until_finished()
            print(dict(worker.counters), flush=True)


    anyio.run(main, backend=backend)
    """
)


async def whoami(key: str = TaskKey()) -> int:
    """The producer's twin of the workers' task (same name and signature)."""
    raise AssertionError("runs only in the worker processes")


@pytest.mark.backends(*SERVER_BACKENDS)
async def test_two_worker_processes_share_the_work(
    backend: str, make_docket: Callable[..., Any], docket_url: str, tmp_path: Path
) -> None:
    name = f"procs-{uuid.uuid4().hex}"
    docket = await make_docket(name)
    docket.register(whoami)
    keys = [f"task-{n}" for n in range(200)]
    for key in keys:
        await docket.add(whoami, key=key)()

    script = tmp_path / "worker.py"
    script.write_text(WORKER_SCRIPT)
    event_loop = backend.rsplit("-", 1)[1]
    names = ["worker-a", "worker-b"]
    processes = []
    for worker_name in names:
        out = (tmp_path / f"{worker_name}.out").open("wb")
        processes.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(script),
                    docket_url,
                    name,
                    worker_name,
                    event_loop,
                    str(tmp_path / f"{worker_name}.log"),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        )
        out.close()
    try:
        for process in processes:
            code = await anyio.to_thread.run_sync(partial(process.wait, 60))
            output = (tmp_path / f"{names[processes.index(process)]}.out").read_text()
            assert code == 0, f"worker exited with {code}:\n{output[-3000:]}"
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()

    runs: Counter[str] = Counter()
    ran_in: dict[str, set[str]] = {}
    for worker_name in names:
        log = tmp_path / f"{worker_name}.log"
        ran = log.read_text().split() if log.exists() else []
        runs.update(ran)
        ran_in[worker_name] = set(ran)
    assert set(runs) == set(keys)
    assert [k for k, n in runs.items() if n > 1] == [], "keys that ran more than once"

    pids = {p.pid for p in processes}
    seen_pids: Counter[int] = Counter()
    seen_workers: Counter[str] = Counter()
    for key in keys:
        execution = await docket.get_execution(key)
        assert execution is not None and execution.state is ExecutionState.COMPLETED, key
        assert execution.worker in names, execution.worker
        assert key in ran_in[execution.worker]  # the record names the process that ran it
        seen_workers[execution.worker] += 1
        seen_pids[await execution.get_result()] += 1
    print(f"\n{backend}: tasks per worker {dict(seen_workers)}")
    assert set(seen_pids) == pids, f"results came from {seen_pids}, workers were {pids}"
    assert set(seen_workers) == set(names)
    assert await docket.adapter.pending() == 0
