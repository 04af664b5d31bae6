"""Pickling task arguments and results, with errors that say what went wrong."""

from __future__ import annotations

from typing import Any

import cloudpickle

from .sansio.errors import UsageError


def dumps_call(
    function_name: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> bytes:
    """Pickle a call's arguments (and its ``headers``, such as the trace
    context of the code that scheduled it); a value that cannot be pickled is
    the caller's error."""
    try:
        data: bytes = cloudpickle.dumps((args, kwargs, headers) if headers else (args, kwargs))
        return data
    except Exception as error:
        raise UsageError(
            f"the arguments of {function_name} cannot be pickled "
            f"({type(error).__name__}: {error}); nothing was scheduled"
        ) from error


def loads_message(
    payload: bytes,
) -> tuple[tuple[Any, ...], dict[str, Any], dict[str, str]]:
    """Unpickle a call's arguments and headers; raises whatever unpickling raises."""
    call = cloudpickle.loads(payload)
    if not isinstance(call, tuple) or len(call) not in (2, 3):
        raise TypeError("the message payload is not an (args, kwargs) pair")
    args, kwargs = call[0], call[1]
    headers = call[2] if len(call) == 3 else {}
    if not isinstance(args, tuple) or not isinstance(kwargs, dict) or not isinstance(headers, dict):
        raise TypeError("the message payload is not an (args, kwargs) pair")
    return args, kwargs, headers


def loads_call(payload: bytes) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Unpickle a call's arguments; raises whatever unpickling raises."""
    args, kwargs, _ = loads_message(payload)
    return args, kwargs


def dumps_value(value: Any) -> bytes | None:
    """Pickle a result or exception to keep; ``None`` if it cannot be pickled."""
    try:
        data: bytes = cloudpickle.dumps(value)
        return data
    except Exception:
        return None


def loads_value(data: bytes) -> Any:
    return cloudpickle.loads(data)


def describe(error: BaseException) -> str:
    """``"Type: message"``, the form errors are recorded in."""
    return f"{type(error).__name__}: {error}"
