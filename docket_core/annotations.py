"""Markers for ``Annotated`` task parameters that change how docket treats
the argument without replacing it (pydocket's ``docket.annotations``).

``Logged`` shows an argument in the worker's log lines, where arguments are
otherwise printed as ``...``::

    async def greet(
        name: Annotated[str, Logged],
        friends: Annotated[list[str], Logged(length_only=True)],
        password: str,
    ) -> None: ...

logs the call as ``greet('Ada', [len 2], ...){key}``.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Self

__all__ = ["Annotation", "Logged"]


class Annotation:
    """Base of the markers: one instance per annotated parameter.

    As metadata, the class itself stands for an instance made with no
    arguments (``Annotated[int, Logged]`` is ``Annotated[int, Logged()]``).
    """

    _found: ClassVar[dict[tuple[type[Annotation], inspect.Signature], Mapping[str, Any]]] = {}

    @classmethod
    def annotated_parameters(cls, signature: inspect.Signature) -> Mapping[str, Self]:
        """The parameters of ``signature`` annotated with this marker, by name."""
        key = (cls, signature)
        try:
            return cls._found[key]
        except KeyError:
            pass
        except TypeError:  # a default that cannot be hashed: no caching
            return cls._scan(signature)
        found = cls._found[key] = cls._scan(signature)
        return found

    @classmethod
    def _scan(cls, signature: inspect.Signature) -> dict[str, Self]:
        found: dict[str, Self] = {}
        for name, parameter in signature.parameters.items():
            marker = cls.among(metadata_of(parameter.annotation))
            if marker is not None:
                found[name] = marker
        return found

    @classmethod
    def among(cls, metadata: tuple[Any, ...]) -> Self | None:
        """The last marker of this kind in ``Annotated`` metadata, if any."""
        marker: Self | None = None
        for item in metadata:
            if isinstance(item, cls):
                marker = item
            elif isinstance(item, type) and issubclass(item, cls):
                marker = item()
        return marker


def metadata_of(annotation: Any) -> tuple[Any, ...]:
    """The ``Annotated`` metadata of an annotation (none for any other)."""
    if typing.get_origin(annotation) is Annotated:
        return tuple(annotation.__metadata__)
    return ()


class Logged(Annotation):
    """Show this argument in log lines: its ``repr``, or with
    ``length_only=True`` only its length: ``[len 2]`` for a list (or any other
    sized value), ``{len 2}`` for a dict or set, ``(len 2)`` for a tuple."""

    def __init__(self, length_only: bool = False) -> None:
        self.length_only = length_only

    def format(self, value: Any) -> str:
        """The argument as a log line shows it (never raises)."""
        try:
            if self.length_only:
                if isinstance(value, dict | set):
                    return f"{{len {len(value)}}}"
                if isinstance(value, tuple):
                    return f"(len {len(value)})"
                if hasattr(value, "__len__"):
                    return f"[len {len(value)}]"
            return repr(value)
        except Exception:
            return f"<{type(value).__name__}>"

    def __repr__(self) -> str:
        return f"Logged(length_only={self.length_only})"
