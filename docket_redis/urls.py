"""The URLs ``docket_redis`` takes, and the redis-py client each one builds.

- ``redis://``, ``rediss://``, ``unix://``: one server, through a bounded
  ``BlockingConnectionPool`` (redis-py parses these itself).
- ``redis+cluster://[user:pass@]h1:p1,h2:p2[/0][?options]`` and
  ``rediss+cluster://``: a ``RedisCluster`` seeded with every listed node.
  A cluster has only database 0.
- ``redis+sentinel://[user:pass@]h1:p1,h2:p2/service[/db][?options]``: the
  primary the sentinels name for ``service`` (``Sentinel.master_for``). The
  user and password are the data nodes'; ``sentinel_username`` and
  ``sentinel_password`` are the sentinels'. ``wait_replicas`` (default 1) and
  ``wait_timeout_ms`` (default 1000) make every write wait for that many
  replicas (``WAIT``); ``wait_replicas=0`` turns it off.

``urlsplit`` cannot read a comma-separated host list (its ``port`` fails), so
the cluster and sentinel forms are split here by hand; their options are cast
by redis-py's own URL parser, and an option no client takes is a ``UsageError``.
"""

from __future__ import annotations

import inspect
import os
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import attrs
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import Connection, SSLConnection, parse_url
from redis.asyncio.sentinel import Sentinel

from docket_core.sansio.errors import UsageError

CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
SENTINEL_SCHEMES = ("redis+sentinel",)

#: connections of a one-server pool (a worker takes two or three: its blocking
#: read, its effects, the shared pub/sub connection); commands past it wait up
#: to ``POOL_TIMEOUT`` seconds for one.  A cluster node's or a sentinel
#: primary's pool (which fails instead of waiting) holds twice as many, and
#: the store runs at most half of them as commands at once (the other half
#: is for blocking reads and pub/sub); ``?max_connections=`` sets the pool size
MAX_CONNECTIONS = 50
POOL_TIMEOUT = 30.0
#: how long a new data connection may take to connect (redis-py's default is
#: 5 s): as long as a command waits for a pooled one.  An event loop busy with
#: thousands of adds may not see a connect that succeeded for seconds, and a
#: refused one fails at once whatever this is; ``?socket_connect_timeout=``
#: sets it
CONNECT_TIMEOUT = POOL_TIMEOUT
#: socket timeouts for the sentinels (a dead one must not stall discovery)
SENTINEL_TIMEOUT = 5.0
#: the sentinel defaults: replicas each write must reach, and how long to wait
WAIT_REPLICAS = 1
WAIT_TIMEOUT_MS = 1000

_DEFAULT_PORT = 6379
_SENTINEL_PORT = 26379

#: GLIDE's spellings of redis-py's TLS options (``docket_glide.store.TLS_OPTIONS``)
_TLS_SPELLINGS = {
    "tls_ca_certs": "ssl_ca_certs",
    "tls_certfile": "ssl_certfile",
    "tls_keyfile": "ssl_keyfile",
}
_TLS_FILES = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


@attrs.frozen(kw_only=True)
class Client:
    """A client built from a URL: the client, the largest number of commands
    the store runs on it at once (``None``: its pool waits by itself), and the
    replicas each write must reach (``0``: no ``WAIT``)."""

    client: aioredis.Redis | RedisCluster
    max_commands: int | None = None
    wait_replicas: int = 0
    wait_timeout_ms: int = WAIT_TIMEOUT_MS


def client_for_url(url: str) -> Client:
    """The client the URL's form names (see the module docstring)."""
    scheme = url.partition("://")[0].lower()
    if scheme in CLUSTER_SCHEMES:
        return _cluster(url)
    if scheme in SENTINEL_SCHEMES:
        return _sentinel(url)
    return _standalone(url)


# -- one server -------------------------------------------------------------------


def redis_py_url(url: str) -> str:
    """``url`` with GLIDE's TLS spellings (``tls_ca_certs``, ``tls_insecure=true``
    ...) turned into redis-py's, and its TLS files checked for readability."""
    parsed = urlsplit(url)
    options = parse_qsl(parsed.query, keep_blank_values=True)
    for option, value in options:
        if option in _TLS_FILES + tuple(_TLS_SPELLINGS) and not os.access(value, os.R_OK):
            raise UsageError(f"cannot read {option}={value}")
    if not any(option in _TLS_SPELLINGS or option == "tls_insecure" for option, _ in options):
        return url
    translated: list[tuple[str, str]] = []
    for option, value in options:
        if option == "tls_insecure":
            if value.lower() not in _TRUE + _FALSE:
                raise UsageError(f"tls_insecure takes true or false, not {value!r}")
            if value.lower() in _TRUE:
                translated += [("ssl_cert_reqs", "none"), ("ssl_check_hostname", "false")]
        else:
            translated.append((_TLS_SPELLINGS.get(option, option), value))
    return urlunsplit(parsed._replace(query=urlencode(translated)))


def _standalone(url: str) -> Client:
    try:
        # no socket timeout: redis-py 8's 5 s default breaks blocking reads
        pool = aioredis.BlockingConnectionPool.from_url(
            redis_py_url(url),
            max_connections=MAX_CONNECTIONS,
            timeout=POOL_TIMEOUT,
            socket_timeout=None,
            socket_connect_timeout=CONNECT_TIMEOUT,
            decode_responses=False,
        )
    except ValueError as error:
        raise UsageError(f"not a usable Redis URL: {url!r} ({error})") from error
    unknown = _unknown(
        set(pool.connection_kwargs),
        _parameters(pool.connection_class),
        "TLS options need rediss://",
    )
    if unknown:
        raise UsageError(unknown)
    return Client(client=aioredis.Redis.from_pool(pool))


# -- several nodes ----------------------------------------------------------------


@attrs.frozen(kw_only=True)
class NodeList:
    """A URL naming several nodes, split: its parts percent-decoded, its
    options cast as redis-py casts them (``ssl=True`` for a ``rediss`` form)."""

    scheme: str
    hosts: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None
    #: the path's segments, without the empty ones
    path: tuple[str, ...]
    options: dict[str, Any]


def split_node_list(url: str, default_port: int = _DEFAULT_PORT) -> NodeList:
    """Split ``scheme://[user:pass@]h1:p1,h2:p2[/path][?query]`` (an IPv6
    host goes in brackets; a missing port is ``default_port``)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise UsageError(f"not a URL: {url!r}")
    end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    netloc, rest = rest[:end], rest[end:]
    path, _, query = rest.partition("?")
    userinfo, at, host_list = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    return NodeList(
        scheme=scheme.lower(),
        hosts=tuple(_host(part.strip(), default_port, url) for part in host_list.split(",")),
        username=username,
        password=password,
        path=tuple(unquote(segment) for segment in path.split("/") if segment),
        options=_options(query, tls=scheme.lower().startswith("rediss"), url=url),
    )


def _host(part: str, default_port: int, url: str) -> tuple[str, int]:
    if part.startswith("["):
        host, _, after = part[1:].partition("]")
        port = after[1:] if after.startswith(":") else after
    else:
        host, _, port = part.partition(":")
    if not host:
        raise UsageError(f"a host is missing in {url!r}")
    if not port:
        return unquote(host), default_port
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"not a port: {port!r} in {url!r}")
    return unquote(host), int(port)


def _options(query: str, *, tls: bool, url: str) -> dict[str, Any]:
    """The query's options, GLIDE's TLS spellings translated, cast by redis-py
    (through an equivalent one-host URL)."""
    one_host = redis_py_url(f"{'rediss' if tls else 'redis'}://-/?{query}")
    try:
        parsed: dict[str, Any] = dict(parse_url(one_host))
    except ValueError as error:
        raise UsageError(f"not a usable Redis URL: {url!r} ({error})") from error
    parsed.pop("host", None)
    if parsed.pop("connection_class", None) is SSLConnection:
        parsed["ssl"] = True
    return parsed


def _parameters(klass: type) -> set[str]:
    """The keyword parameters ``klass`` takes (its ``__init__`` up the MRO)."""
    accepted: set[str] = set()
    for base in klass.__mro__[:-1]:
        init = vars(base).get("__init__")
        if init is not None:
            accepted |= set(inspect.signature(init).parameters)
    return accepted


def _unknown(given: set[str], accepted: set[str], tls_hint: str) -> str:
    """What is wrong with the options of ``given`` no client takes ("" if none);
    ``tls_hint`` follows when one is a TLS option."""
    unknown = sorted(given - accepted)
    if not unknown:
        return ""
    tls = any(option.startswith("ssl") for option in unknown)
    return f"unknown option(s) in the Redis URL: {', '.join(map(repr, unknown))}" + (
        f" ({tls_hint})" if tls else ""
    )


#: connection options a URL of several nodes may not set: they are the URL's
#: own parts, or the store relies on them
_FIXED = {"self", "kwargs", "host", "port", "db", "username", "password", "decode_responses"}
_FIXED |= {"retry", "retry_on_error", "connection_pool", "max_connections"}


def _pool_size(options: dict[str, Any]) -> tuple[int, int]:
    """A node's pool size (``max_connections``, default twice
    ``MAX_CONNECTIONS``) and how many commands the store runs at once: half of
    it, the other half kept for blocking reads and pub/sub."""
    size = options.pop("max_connections", 2 * MAX_CONNECTIONS)
    return size, max(1, size // 2)


def _cluster(url: str) -> Client:
    nodes = split_node_list(url)
    options = nodes.options
    db = options.pop("db", None)
    if db is None and nodes.path:
        if len(nodes.path) > 1 or not nodes.path[0].isdigit():
            raise UsageError(f"a cluster URL's path is at most a database number: {url!r}")
        db = int(nodes.path[0])
    if db:
        raise UsageError(
            f"a Redis Cluster has only database 0, and {url!r} names database {db}: "
            "drop the /db (dockets of different names never share a key)"
        )
    tls = nodes.scheme == "rediss+cluster"  # (``ssl=True`` in its options)
    accepted = _parameters(SSLConnection if tls else Connection)
    accepted &= set(inspect.signature(RedisCluster.__init__).parameters)
    unknown = _unknown(
        set(options) - {"max_connections", *(["ssl"] if tls else [])},
        accepted - _FIXED,
        "TLS options need rediss+cluster://",
    )
    if unknown:
        raise UsageError(unknown)
    size, commands = _pool_size(options)
    client = RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in nodes.hosts],
        username=nodes.username,
        password=nodes.password,
        max_connections=size,
        **{
            "socket_timeout": None,
            "socket_connect_timeout": CONNECT_TIMEOUT,
            **options,
            "decode_responses": False,
        },
    )
    return Client(client=client, max_commands=commands)


def _sentinel(url: str) -> Client:
    nodes = split_node_list(url, default_port=_SENTINEL_PORT)
    options = nodes.options
    if not nodes.path or len(nodes.path) > 2:
        raise UsageError(
            "a sentinel URL names the service and, optionally, the database: "
            f"redis+sentinel://host:port,.../<service>/<db>, not {url!r}"
        )
    service = nodes.path[0]
    db = options.pop("db", None)
    if db is None and len(nodes.path) == 2:
        if not nodes.path[1].isdigit():
            raise UsageError(f"not a database number: {nodes.path[1]!r} in {url!r}")
        db = int(nodes.path[1])
    wait_replicas = _count(options.pop("wait_replicas", WAIT_REPLICAS), "wait_replicas")
    wait_timeout_ms = _count(options.pop("wait_timeout_ms", WAIT_TIMEOUT_MS), "wait_timeout_ms")
    sentinel_options: dict[str, Any] = {
        "socket_timeout": SENTINEL_TIMEOUT,
        "socket_connect_timeout": SENTINEL_TIMEOUT,
    }
    for part in ("username", "password"):
        value = options.pop(f"sentinel_{part}", None)
        if value is not None:
            sentinel_options[part] = value
    accepted = _parameters(Connection) - _FIXED
    unknown = _unknown(
        set(options) - {"max_connections"}, accepted, "redis+sentinel:// has no TLS form yet"
    )
    if unknown:
        raise UsageError(unknown)
    size, commands = _pool_size(options)
    sentinel = Sentinel(list(nodes.hosts), sentinel_kwargs=sentinel_options)  # type: ignore[no-untyped-call, unused-ignore]
    client: aioredis.Redis = sentinel.master_for(
        service,
        db=db or 0,
        username=nodes.username,
        password=nodes.password,
        max_connections=size,
        **{
            "socket_timeout": None,
            "socket_connect_timeout": CONNECT_TIMEOUT,
            **options,
            "decode_responses": False,
        },
    )
    return Client(
        client=client,
        max_commands=commands,
        wait_replicas=wait_replicas,
        wait_timeout_ms=wait_timeout_ms,
    )


def _count(value: Any, option: str) -> int:
    try:
        count = int(value)
    except ValueError:
        count = -1
    if count < 0:
        raise UsageError(f"{option} takes a whole number >= 0, not {value!r}")
    return count
