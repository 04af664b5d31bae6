"""A short chaos run per client (redis-py and GLIDE, on asyncio) for CI.

Each run starts its own redis-server (AOF, ``--appendfsync always``) on a free
loopback port, four worker processes and a producer (with a few tasks that
raise ``CancelledError`` or ``SystemExit`` themselves), injects seeded faults
for 20 s (worker SIGKILL and SIGTERM, server SIGKILL and restart, ``CLIENT
KILL``, plain or timed to land on commands that ran but were not answered yet,
malformed entries written straight into the queue's stream), drains, and checks
the invariants listed in ``chaos.py``: nothing lost, nothing left over, every
malformed entry set aside in the dead letters exactly once, no key running twice
at once, no concurrency limit exceeded, no worker dying unasked.  About 25-35 s
per client.  ``python tests/chaos/chaos.py`` runs the same for longer.
"""

from __future__ import annotations

import os

import pytest
from chaos import run_chaos
from servers import redis_server_binary

SECONDS = 20.0
DRAIN_SECONDS = 15.0
SEED = 20240601


@pytest.mark.timeout(90)
@pytest.mark.parametrize("client", ["redis", "glide"])
def test_chaos_keeps_the_invariants(client: str) -> None:
    if redis_server_binary() is None:
        message = "redis-server (Debian package redis-server) is not installed"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}, and CI must run the chaos test")
        pytest.skip(message)
    report = run_chaos(
        client=client, seconds=SECONDS, workers=4, seed=SEED, drain_seconds=DRAIN_SECONDS
    )
    print(f"\n{report.table()}")
    assert report.runs > 0 and report.added > 0
    assert sum(report.faults.values()) > 0
    details = "\n".join(f"- {failure}" for failure in report.failures)
    assert report.ok, (
        f"chaos run on {client} broke invariants (run directory {report.directory}):\n"
        f"{report.table()}\n{details}"
    )
