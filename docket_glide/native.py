"""Docket scripts straight into GLIDE's native ``invoke_script`` call.

Every ``docket.add`` is one ``EVALSHA``, and on the GLIDE client most of its
Python time was the wrapping of the arguments, not the call: ``invoke_script``
turns each key and each argument into a cffi object of its own (an encode, a
``from_buffer`` and a ``cast`` apiece, then two arrays per list), looks up the
async library, encodes the script's hash and converts an absent route, for
about 6 us of a 2-key, 4-argument call.  ``NativeScripts`` makes the same
native call from one buffer: the keys and arguments joined into one ``bytes``,
the two arrays of addresses and lengths built from plain integers, the hashes
encoded once (about 2 us).  What GLIDE does around the call stays GLIDE's: the
request id, the pending-request table its pipe reader answers, the closed and
fork checks, its errors; a client it cannot serve (trio's, one with tracing on,
a closed one) takes ``invoke_script`` itself.

The installed GLIDE's version (its major.minor, in ``TESTED``) and the native
function's C signature are checked once per client against the ones this was
written and tested for (GLIDE 2.6): a GLIDE of another version, or whose client
lacks these internals or whose signature differs, gets no ``NativeScripts``,
and its store goes through ``invoke_script`` as before: slower by a few µs a
call, never wrong (``tests/store/test_glide_native.py`` says which).  Add a
version to ``TESTED`` only after that test file passes on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from glide import OpenTelemetry, Script

from docket_core.lua.protocol import ScriptCall

__all__ = ["INSTALLED", "SIGNATURE", "TESTED", "NativeScripts"]

#: the GLIDE versions (major.minor) whose client internals this was tested on
TESTED = ("2.6",)


def _installed() -> str:
    try:
        return ".".join(version("valkey-glide").split(".")[:2])
    except PackageNotFoundError:
        return ""


#: the installed GLIDE's major.minor
INSTALLED = _installed()

#: ``invoke_script`` of GLIDE 2.6's FFI, as cffi spells its type
SIGNATURE = (
    "CommandResult *(*)(void *, uintptr_t, char *, unsigned long, size_t *,"
    " unsigned long *, unsigned long, size_t *, unsigned long *, unsigned char *,"
    " size_t, uint64_t)"
)

#: the client internals a native call uses (all of ``BaseClient`` in GLIDE 2.6)
_INTERNALS = (
    "_ffi",
    "_lib",
    "_core_client",
    "_is_closed",
    "_is_asyncio",
    "_pending_futures",
    "_get_callback_id",
    "_register_future",
    "_check_same_process",
)


class _Pending:
    """One script call in GLIDE's table of pending requests, in the place of
    the future ``invoke_script`` puts there: it passes the reply on to the
    caller's future, and keeps the call's buffer alive until the reply came
    (or the client closed), even when the caller was cancelled first: the
    native side reads the keys and arguments from that buffer."""

    __slots__ = ("buffer", "future")

    def __init__(self, future: asyncio.Future[Any], buffer: bytes) -> None:
        self.future = future
        self.buffer = buffer

    def done(self) -> bool:
        return self.future.done()

    def set_result(self, result: Any) -> None:
        if not self.future.done():
            self.future.set_result(result)

    def set_exception(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)


class NativeScripts:
    """``EVALSHA`` of the docket scripts on one GLIDE client through its
    native ``invoke_script``, from one buffer per call (module docstring)."""

    __slots__ = (
        "_cast",
        "_chars",
        "_client",
        "_from_buffer",
        "_hashes",
        "_lengths",
        "_new",
        "_null",
        "_pointers",
        "_scripts",
        "_size",
    )

    def __init__(self, client: Any, scripts: Mapping[str, Script]) -> None:
        ffi = client._ffi
        self._client = client
        self._scripts = scripts
        self._new = ffi.new
        self._cast = ffi.cast
        self._from_buffer = ffi.from_buffer
        self._null = ffi.NULL
        self._chars = ffi.typeof("char[]")
        self._size = ffi.typeof("size_t")
        self._pointers = ffi.typeof("size_t[]")
        self._lengths = ffi.typeof("unsigned long[]")
        #: script name -> its SHA1 as a NUL-terminated C string, made once
        self._hashes = {
            name: ffi.new("char[]", script.get_hash().encode()) for name, script in scripts.items()
        }

    @classmethod
    def for_client(cls, client: Any, scripts: Mapping[str, Script]) -> NativeScripts | None:
        """The native calls of ``client``, or ``None`` when its GLIDE is not
        the one they were written for, or the client runs under trio."""
        if INSTALLED not in TESTED:
            return None
        if not all(hasattr(client, name) for name in _INTERNALS):
            return None
        if client._is_asyncio is not True or not isinstance(client._pending_futures, dict):
            return None
        try:
            native = client._ffi.typeof(client._lib.invoke_script)
        except (AttributeError, TypeError):
            return None
        if native.cname != SIGNATURE:
            return None
        return cls(client, scripts)

    @property
    def client(self) -> Any:
        return self._client

    async def invoke(self, call: ScriptCall) -> Any:
        """The reply of ``call`` (GLIDE's errors raised as ``invoke_script``
        raises them)."""
        client = self._client
        if client._is_closed or OpenTelemetry.is_tracing_enabled():
            # (the closed client's error, or a traced call's span: GLIDE's own)
            script = self._scripts[call.name]
            return await client.invoke_script(script, keys=list(call.keys), args=list(call.args))
        client._check_same_process()
        parts = [part if isinstance(part, bytes) else part.encode() for part in call.keys]
        parts += [part if isinstance(part, bytes) else part.encode() for part in call.args]
        buffer = b"".join(parts)
        at = int(self._cast(self._size, self._from_buffer(self._chars, buffer)))
        addresses = []
        lengths = []
        for part in parts:
            addresses.append(at)
            size = len(part)
            lengths.append(size)
            at += size
        pointers = self._new(self._pointers, addresses)
        sizes = self._new(self._lengths, lengths)
        keys = len(call.keys)
        args = len(parts) - keys
        pending = _Pending(asyncio.get_running_loop().create_future(), buffer)
        request = client._get_callback_id()
        client._register_future(request, pending)
        try:
            client._lib.invoke_script(
                client._core_client,
                request,
                self._hashes[call.name],
                keys,
                pointers if keys else self._null,
                sizes if keys else self._null,
                args,
                pointers + keys if args else self._null,
                sizes + keys if args else self._null,
                self._null,  # no route: GLIDE routes by the keys
                0,
                0,  # no span (tracing takes ``invoke_script``)
            )
        except BaseException:
            client._pending_futures.pop(request, None)
            raise
        return await pending.future
