"""GLIDE client configurations from docket URLs.

``glide://`` and ``glides://`` name one server (``GlideClientConfiguration``);
``glide+cluster://`` and ``glides+cluster://`` name seed nodes of a cluster
(``GlideClusterClientConfiguration``).  The TLS options of the query are the
same for both, and so are credentials and the request timeout.
"""

from __future__ import annotations

import inspect
from importlib.metadata import version
from pathlib import Path
from typing import Any, TypeAlias
from urllib.parse import parse_qsl, unquote, urlparse

from glide import (
    AdvancedGlideClientConfiguration,
    AdvancedGlideClusterClientConfiguration,
    GlideClientConfiguration,
    GlideClusterClientConfiguration,
    NodeAddress,
    ServerCredentials,
    TlsAdvancedConfiguration,
)

from docket_core.sansio.errors import UsageError

#: either kind of client configuration
Configuration: TypeAlias = GlideClientConfiguration | GlideClusterClientConfiguration

#: above the slowest script or batch we run; blocking reads get their own
#: timeout.  On a cluster GLIDE retries a TRYAGAIN (a slot being moved) until
#: then, so a move shorter than this only delays a call.
REQUEST_TIMEOUT_MS = 10_000

DEFAULT_PORT = 6379

#: URL query option -> TLS setting; redis-py's spellings work too, so one
#: ``?ssl_ca_certs=...`` URL serves ``rediss://`` and ``glides://``
TLS_OPTIONS = {
    "tls_ca_certs": "ca",
    "ssl_ca_certs": "ca",
    "tls_certfile": "cert",
    "ssl_certfile": "cert",
    "tls_keyfile": "key",
    "ssl_keyfile": "key",
    "tls_insecure": "insecure",
    "ssl_cert_reqs": "cert_reqs",
}
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")

STANDALONE_SCHEMES = ("glide", "glides")
CLUSTER_SCHEMES = ("glide+cluster", "glides+cluster")
_TLS_SCHEMES = ("glides", "glides+cluster")


def configuration_from_url(url: str, **extra: Any) -> Configuration:
    """``glide://[user:password@]host:port[/db]``; ``glides://`` for TLS, with
    ``?tls_ca_certs=ca.pem&tls_certfile=cert.pem&tls_keyfile=key.pem`` and
    ``tls_insecure=true`` (or redis-py's ``ssl_ca_certs``, ``ssl_certfile``,
    ``ssl_keyfile``, ``ssl_cert_reqs=none``).  A cluster:
    ``glide+cluster://[user:password@]host:port,host:port[?...]`` (every
    host a seed), ``glides+cluster://`` for TLS with the same options.
    ``extra`` goes to the configuration (``inflight_requests_limit=``...)."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in CLUSTER_SCHEMES:
        return _cluster_configuration(url, scheme, extra)
    parsed = urlparse(url)
    if parsed.scheme not in STANDALONE_SCHEMES:
        raise UsageError(
            f"not a glide://, glides://, glide+cluster:// or glides+cluster:// URL: {url!r}"
        )
    tls = _tls_configuration(parsed.query, parsed.scheme == "glides")
    if tls is not None:
        if "advanced_config" in extra:
            raise UsageError("give TLS options in the URL or in advanced_config, not both")
        extra["advanced_config"] = AdvancedGlideClientConfiguration(tls_config=tls)
    database = parsed.path.strip("/")
    try:
        database_id = int(database) if database else None
        port = parsed.port or DEFAULT_PORT
    except ValueError as error:
        raise UsageError(f"not a usable GLIDE URL: {url!r} ({error})") from error
    return GlideClientConfiguration(
        [NodeAddress(parsed.hostname or "localhost", port)],
        use_tls=parsed.scheme == "glides",
        credentials=_credentials(parsed.username, parsed.password),
        database_id=database_id,
        request_timeout=REQUEST_TIMEOUT_MS,
        **extra,
    )


def _cluster_configuration(
    url: str, scheme: str, extra: dict[str, Any]
) -> GlideClusterClientConfiguration:
    """The configuration of a ``glide+cluster://`` URL: its netloc lists the
    seeds, comma-separated (``urlsplit`` cannot read that, so it is cut here)."""
    rest = url.split("://", 1)[1]
    rest, _, query = rest.partition("?")
    rest = rest.partition("#")[0]
    netloc, _, path = rest.partition("/")
    userinfo, _, hosts = netloc.rpartition("@")
    addresses = [_address(seed, url) for seed in hosts.split(",") if seed.strip()]
    if not addresses:
        raise UsageError(f"a {scheme}:// URL names at least one node (host:port): {url!r}")
    database = path.strip("/")
    if database not in ("", "0"):
        raise UsageError(
            f"a cluster has only database 0, not {database!r}: {url!r} "
            f"(leave the path out, or end the URL with /0)"
        )
    use_tls = scheme in _TLS_SCHEMES
    tls = _tls_configuration(query, use_tls, "glides+cluster")
    if tls is not None:
        if "advanced_config" in extra:
            raise UsageError("give TLS options in the URL or in advanced_config, not both")
        extra["advanced_config"] = AdvancedGlideClusterClientConfiguration(tls_config=tls)
    username, colon, password = userinfo.partition(":")
    return GlideClusterClientConfiguration(
        addresses,
        use_tls=use_tls,
        credentials=_credentials(username or None, password if colon else None),
        request_timeout=REQUEST_TIMEOUT_MS,
        **extra,
    )


def _address(seed: str, url: str) -> NodeAddress:
    """``host:port``, ``host`` (port 6379) or ``[v6 address]:port``."""
    seed = seed.strip()
    if seed.startswith("["):
        host, bracket, port = seed[1:].partition("]")
        if not bracket or (port and not port.startswith(":")):
            raise UsageError(f"not a usable node {seed!r} in {url!r}")
        port = port[1:]
    else:
        host, _, port = seed.rpartition(":") if ":" in seed else (seed, "", "")
    try:
        number = int(port) if port else DEFAULT_PORT
    except ValueError:
        raise UsageError(f"not a usable port in node {seed!r} of {url!r}") from None
    if not host or not 0 < number < 65536:
        raise UsageError(f"not a usable node {seed!r} in {url!r}")
    return NodeAddress(unquote(host), number)


def _credentials(username: str | None, password: str | None) -> ServerCredentials | None:
    """A password (and its user) from a URL, percent-decoded; none without one."""
    if password is None:
        return None
    return ServerCredentials(
        password=unquote(password), username=unquote(username) if username else None
    )


def _tls_configuration(
    query: str, use_tls: bool, tls_scheme: str = "glides"
) -> TlsAdvancedConfiguration | None:
    """The TLS settings of a URL's query (``TLS_OPTIONS``), read and checked
    (``tls_scheme``: the scheme to name when TLS is off)."""
    settings: dict[str, tuple[str, str]] = {}
    unknown = []
    for option, value in parse_qsl(query, keep_blank_values=True):
        setting = TLS_OPTIONS.get(option)
        if setting is None:
            unknown.append(option)
        elif setting in settings:
            raise UsageError(f"{settings[setting][0]!r} and {option!r} set the same thing")
        else:
            settings[setting] = (option, value)
    if unknown:
        raise UsageError(
            f"unknown option(s) in the GLIDE URL: {', '.join(map(repr, unknown))} "
            f"(known: {', '.join(TLS_OPTIONS)})"
        )
    if not settings:
        return None
    if not use_tls:
        options = ", ".join(option for option, _ in settings.values())
        raise UsageError(f"TLS options need a {tls_scheme}:// URL: {options}")
    insecure = _insecure(settings)
    if ("cert" in settings) != ("key" in settings):
        raise UsageError("a client certificate needs both tls_certfile and tls_keyfile")
    certificate: dict[str, bytes] = {}
    if "cert" in settings:
        if "client_cert_pem" not in inspect.signature(TlsAdvancedConfiguration).parameters:
            raise UsageError(
                f"valkey-glide {version('valkey-glide')} cannot present a client "
                "certificate (tls_certfile, tls_keyfile): upgrade valkey-glide"
            )
        certificate = {
            "client_cert_pem": _pem(*settings["cert"]),
            "client_key_pem": _pem(*settings["key"]),
        }
    ca = settings.get("ca")
    return TlsAdvancedConfiguration(
        use_insecure_tls=insecure or None,
        root_pem_cacerts=_pem(*ca) if ca else None,
        **certificate,
    )


def _insecure(settings: dict[str, tuple[str, str]]) -> bool:
    """``tls_insecure=true`` or ``ssl_cert_reqs=none``: no certificate checks."""
    insecure = False
    if "insecure" in settings:
        option, value = settings["insecure"]
        if value.lower() not in _TRUE + _FALSE:
            raise UsageError(f"{option} takes true or false, not {value!r}")
        insecure = value.lower() in _TRUE
    if "cert_reqs" in settings:
        option, value = settings["cert_reqs"]
        reqs = value.lower().removeprefix("cert_")
        if reqs not in ("none", "required"):
            raise UsageError(
                f"{option}={value} has no GLIDE equivalent: GLIDE checks the server's "
                "certificate (required) or not at all (none)"
            )
        insecure = insecure or reqs == "none"
    return insecure


def _pem(option: str, path: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise UsageError(f"cannot read {option}={path}: {error.strerror}") from error
    if not data.strip():
        raise UsageError(f"{option}={path} is empty")
    return data
