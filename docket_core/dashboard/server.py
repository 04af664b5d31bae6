"""A small read-only HTTP/1.1 server on anyio streams for the dashboard.

It answers ``GET`` only (any other method gets 405), one request a
connection: the page (``/``), its script and style, and the latest view as
JSON (``/api/state``).  Every response forbids framing, sniffing and caching,
and its Content-Security-Policy lets the page load nothing but this server's
own script and style: no inline script, no other origin.  Bound to a loopback
address, it answers only requests whose ``Host`` is a loopback name, so a web
page that rebinds its own name to this address cannot read the docket.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable
from importlib import resources
from urllib.parse import urlsplit

import anyio
import attrs
from anyio.abc import SocketAttribute, SocketStream, TaskStatus
from anyio.streams.buffered import BufferedByteReceiveStream

logger = logging.getLogger("docket.dashboard")

#: the longest request head read, and how long a client may take to send it
MAX_HEAD = 16 * 1024
READ_SECONDS = 10.0
#: how long a response may take to go out
WRITE_SECONDS = 10.0
#: how long, and how much, a client's unread request body is read after the response
LINGER_SECONDS = 1.0
MAX_LINGER_BYTES = 1 << 20

SECURITY_HEADERS = (
    (
        "Content-Security-Policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    ),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
)

#: path -> (file under static/, content type)
ASSETS = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
}
STATE_PATH = "/api/state"
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})

REASONS = {
    200: "OK",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    505: "HTTP Version Not Supported",
}


@attrs.frozen(slots=True, kw_only=True)
class Request:
    method: str
    path: str
    host: str | None


@attrs.frozen(slots=True, kw_only=True)
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    extra_headers: tuple[tuple[str, str], ...] = ()

    def encode(self) -> bytes:
        lines = [f"HTTP/1.1 {self.status} {REASONS.get(self.status, 'Error')}"]
        headers = (
            ("Content-Type", self.content_type),
            ("Content-Length", str(len(self.body))),
            ("Connection", "close"),
            *SECURITY_HEADERS,
            *self.extra_headers,
        )
        lines.extend(f"{name}: {value}" for name, value in headers)
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + self.body


def plain(status: int, text: str, *headers: tuple[str, str]) -> Response:
    return Response(status=status, body=(text + "\n").encode(), extra_headers=headers)


def load_assets() -> dict[str, tuple[bytes, str]]:
    """The page's files, read once from the package."""
    folder = resources.files(__package__ or "docket_core.dashboard") / "static"
    return {path: ((folder / name).read_bytes(), kind) for path, (name, kind) in ASSETS.items()}


def parse_head(head: bytes) -> Request | Response:
    """The request a head (without its final blank line) asks for, or the
    error response to send."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
        return plain(400, "bad request")
    request_line, *header_lines = text.split("\r\n")
    parts = request_line.split(" ")
    if len(parts) != 3 or not parts[0].isalpha():
        return plain(400, "bad request line")
    method, target, version = parts
    if not version.startswith("HTTP/1."):
        return plain(505, "HTTP/1.x only")
    host = None
    for line in header_lines:
        name, sep, value = line.partition(":")
        if not sep:
            return plain(400, "bad header line")
        if name.strip().lower() == "host":
            host = value.strip()
    path = target.split("?", 1)[0].split("#", 1)[0]
    return Request(method=method, path=path, host=host)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a bind address or a name) is this machine only."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(header: str | None) -> str | None:
    """The host name of a ``Host`` header (without its port or brackets)."""
    if not header:
        return None
    try:
        return urlsplit("//" + header).hostname
    except ValueError:
        return None


def respond(
    request: Request,
    *,
    assets: dict[str, tuple[bytes, str]],
    state: Callable[[], bytes],
    loopback_only: bool,
) -> Response:
    """The response to one parsed request."""
    if request.method != "GET":
        return plain(405, "the dashboard is read-only: GET only", ("Allow", "GET"))
    if loopback_only:
        name = host_name(request.host)
        if name is None or not is_loopback(name):
            return plain(403, "this dashboard answers to a loopback host name only")
    if request.path == STATE_PATH:
        return Response(status=200, body=state(), content_type="application/json")
    asset = assets.get(request.path)
    if asset is None:
        return plain(404, "not found")
    body, content_type = asset
    return Response(status=200, body=body, content_type=content_type)


async def read_head(stream: SocketStream) -> bytes | Response | None:
    """The request head, an error response, or ``None`` if the client went away."""
    buffered = BufferedByteReceiveStream(stream)
    try:
        with anyio.fail_after(READ_SECONDS):
            return await buffered.receive_until(b"\r\n\r\n", MAX_HEAD)
    except anyio.DelimiterNotFound:
        return plain(431, "request head too large")
    except (TimeoutError, anyio.IncompleteRead, anyio.BrokenResourceError, OSError):
        return None


async def linger(stream: SocketStream) -> None:
    """Say the response is complete, then read what the client still sends (a
    refused request's body) until it closes: closing a socket with unread
    data resets it, and the client could lose the response."""
    await stream.send_eof()
    drained = 0
    with anyio.move_on_after(LINGER_SECONDS):
        while drained < MAX_LINGER_BYTES:
            try:
                drained += len(await stream.receive())
            except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                return


class DashboardServer:
    """Serves the page and ``state()`` (the JSON view) on ``host``/``port``."""

    def __init__(self, state: Callable[[], bytes], *, host: str, port: int) -> None:
        self.state = state
        self.host = host
        self.port = port
        self.assets = load_assets()
        self.loopback_only = is_loopback(host)

    async def serve(self, *, task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen and serve until cancelled; tells ``task_status`` the bound port."""
        listener = await anyio.create_tcp_listener(local_host=self.host, local_port=self.port)
        async with listener:
            port = self.port
            for one in listener.listeners:
                port = one.extra(SocketAttribute.local_port)
                break
            task_status.started(port)
            await listener.serve(self.handle)

    async def handle(self, stream: SocketStream) -> None:
        """Answer one request on ``stream``; nothing a client sends escapes."""
        try:
            async with stream:
                head = await read_head(stream)
                if head is None:
                    return
                if isinstance(head, Response):
                    response = head
                else:
                    parsed = parse_head(head)
                    response = (
                        parsed
                        if isinstance(parsed, Response)
                        else respond(
                            parsed,
                            assets=self.assets,
                            state=self.state,
                            loopback_only=self.loopback_only,
                        )
                    )
                with anyio.fail_after(WRITE_SECONDS):
                    await stream.send(response.encode())
                await linger(stream)
        except (TimeoutError, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            return  # the client went away
        except Exception:  # one bad connection must not stop the server
            logger.exception("the dashboard failed to answer a request")
