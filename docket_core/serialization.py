"""Pickling task arguments and results, with errors that say what went wrong."""

from __future__ import annotations

from typing import Any

import cloudpickle

from .sansio.errors import UsageError


def dumps_call(function_name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
    """Pickle a call's arguments; a value that cannot be pickled is the caller's error."""
    try:
        data: bytes = cloudpickle.dumps((args, kwargs))
        return data
    except Exception as error:
        raise UsageError(
            f"the arguments of {function_name} cannot be pickled "
            f"({type(error).__name__}: {error}); nothing was scheduled"
        ) from error


def loads_call(payload: bytes) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Unpickle a call's arguments; raises whatever unpickling raises."""
    args, kwargs = cloudpickle.loads(payload)
    if not isinstance(args, tuple) or not isinstance(kwargs, dict):
        raise TypeError("the message payload is not an (args, kwargs) pair")
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
