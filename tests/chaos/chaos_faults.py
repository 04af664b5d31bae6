"""The faults a chaos run injects on side connections of its own to the server
(``CLIENT KILL``, timed or not, and poison entries): ``SideFaults``, which the
driver ``chaos.Chaos`` inherits.  See ``chaos.py`` for the overview.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from chaos_report import Report
from chaos_tasks import STALL_MS, STALL_SCRIPT, append, now_text
from servers import Server

from docket_core.lua import SCRIPTS

#: the malformed entries ``poison`` rotates through (each with a unique key
#: ``poison-<n>`` when it has one: the producer never adds such a key)
POISONS: tuple[tuple[str, Callable[[str], dict[str, str]]], ...] = (
    ("lacks-g", lambda key: {"k": key, "f": "chaos_plain", "p": "x", "w": "0", "a": "1"}),
    (
        "w-soon",
        lambda key: {"k": key, "f": "chaos_plain", "p": "x", "w": "soon", "a": "1", "g": "1"},
    ),
    ("junk", lambda key: {"junk": "1"}),
)


class SideFaults:
    """Faults sent on side connections (they run in a thread: redis-py, sync)."""

    server: Server
    name: str
    report: Report
    #: the driver's ledger descriptor
    fd: int
    #: the poison entries injected: their entry id, what they are and their key
    poison_ids: dict[str, tuple[str, str | None]]
    poison_tries: int

    def client_kill(self) -> int:
        side: Any = redis.Redis(host="127.0.0.1", port=self.server.port, socket_timeout=5)
        try:
            killed: int = side.execute_command("CLIENT", "KILL", "TYPE", "normal")
            return killed
        finally:
            side.close()

    def stall_kill(self, after_claim: bool = False) -> int:
        """Hold the server with a busy script on one side connection and send
        CLIENT KILL TYPE normal on another meanwhile; with ``after_claim``, start
        the stall as soon as a worker claims a limited task (-1: none did)."""
        stall: Any = redis.Redis(host="127.0.0.1", port=self.server.port, socket_timeout=5)
        side: Any = redis.Redis(host="127.0.0.1", port=self.server.port, socket_timeout=5)
        try:
            side.ping()
            stall.ping()
            if after_claim and not self.await_limited_claim():
                return -1
            done: list[int] = []

            def hold() -> None:
                try:
                    stall.eval(STALL_SCRIPT, 0, STALL_MS * 1000)
                except redis.RedisError:
                    pass  # the kill closes this connection too

            holder = threading.Thread(target=hold)
            holder.start()
            time.sleep(STALL_MS * 0.8 / 1000)
            done.append(side.execute_command("CLIENT", "KILL", "TYPE", "normal"))
            holder.join(5)
            return done[0]
        finally:
            side.close()
            stall.close()

    def poison(self) -> str | None:
        """XADD the next malformed entry into the docket's stream on a side
        connection; its id and what it is (None: not injected, the server did
        not answer a PING; "?": the XADD was sent and failed, it may be there)."""
        number = self.poison_tries
        self.poison_tries += 1
        what, fields = POISONS[number % len(POISONS)]
        entry = fields(f"poison-{number}")
        key = entry.get("k")
        side: Any = redis.Redis(host="127.0.0.1", port=self.server.port, socket_timeout=5)
        try:
            try:
                side.ping()
            except redis.RedisError:
                return None
            try:
                entry_id = side.xadd("{" + self.name + "}:q", entry).decode()
            except redis.RedisError as error:
                self.report.poison_uncertain += 1
                failed = type(error).__name__
                append(self.fd, "poison", "-", "-", now_text(), "?", what, key or "-", failed)
                return "?"
            self.poison_ids[entry_id] = (what, key)
            self.report.poisoned += 1
            append(self.fd, "poison", "-", "-", now_text(), entry_id, what, key or "-")
            return f"{entry_id} ({what}, key {key})"
        finally:
            side.close()

    def claim_kill(self) -> int:
        return self.stall_kill(after_claim=True)

    def await_limited_claim(self, within: float = 2.0) -> bool:
        """Watch the server (MONITOR) until a worker claims a limited task."""
        claim = hashlib.sha1(SCRIPTS["claim"].encode()).hexdigest()
        watcher: Any = redis.Redis(host="127.0.0.1", port=self.server.port, socket_timeout=within)
        deadline = time.time() + within
        try:
            with watcher.monitor() as monitor:
                while time.time() < deadline:
                    command = str(monitor.next_command().get("command", ""))
                    if claim in command.lower() and "limited-" in command:
                        return True
        except redis.RedisError:
            pass
        finally:
            watcher.close()
        return False
