"""``Debounce``, ``Cooldown`` and ``RateLimit``: admission controls declared
on a task, as pydocket 0.27 declares them.

Each works as a parameter default (one control for the whole task) or as
``Annotated`` metadata on a parameter (one control per value of that
argument, shared by every task that names the same parameter and value, as
in pydocket), with an optional ``scope`` (default: the docket's name; dockets
naming the same scope share the control).  At run time each reduces to a
policy value (``docket_core.sansio.admission``) that the worker's core
judges before the task starts; the task itself receives the declaration.
A scope that names the docket itself is the docket's own namespace (the
policy's ``scope`` is ``None``): its controls are judged, and a blocked
delivery settled, in the docket's step.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, ClassVar

from ._resolution import Dependency
from .sansio.admission import (
    Control,
    CooldownPolicy,
    DebouncePolicy,
    RateLimitPolicy,
)
from .sansio.errors import UsageError


class _AdmissionControl(Dependency):
    """What the three controls share: their key, per task or per argument."""

    _per_call: ClassVar[bool] = True
    #: the word in the control's key (``<scope>:<kind>:...``)
    _kind: ClassVar[str] = ""

    scope: str | None
    _argument: str | None = None

    def _bind_to_parameter(self, parameter: str) -> Dependency:
        bound = copy.copy(self)
        bound._describes_argument = True
        bound._argument = parameter
        return bound

    def _key(self, function_name: str, docket_name: str, arguments: Mapping[str, Any]) -> str:
        prefix = f"{self.scope or docket_name}:{self._kind}"
        name = self._argument
        if name is None:
            return f"{prefix}:{function_name}"
        try:
            value = arguments[name]
        except KeyError:
            raise UsageError(
                f"{type(self).__name__} on {name!r} but the call has no such argument"
            ) from None
        return f"{prefix}:{name}:{value!r}"

    def _control(self, key: str, scope: str | None) -> Control:
        raise NotImplementedError

    def _call_policy(
        self, function_name: str, docket_name: str, arguments: Mapping[str, Any]
    ) -> dict[str, Any]:
        key = self._key(function_name, docket_name, arguments)
        scope = None if self.scope == docket_name else self.scope
        return {"admission": (self._control(key, scope),)}

    def _check(self, function: Callable[..., Any], parameter: str, top_level: bool) -> None:
        if not top_level:
            raise UsageError(
                f"{type(self).__name__} belongs on a task's own parameters, not on a dependency's"
            )


def _seconds(value: timedelta, what: str, *, positive: bool = False) -> float:
    if not isinstance(value, timedelta):
        raise UsageError(f"{what} must be a timedelta, not {value!r}")
    seconds = value.total_seconds()
    if seconds < 0 or (positive and seconds == 0):
        raise UsageError(f"{what} must be {'positive' if positive else 'at least 0'}")
    return seconds


class Debounce(_AdmissionControl):
    """Trailing edge: after the last submission, wait for ``settle`` of
    quiet, then run once; the other submissions are dropped."""

    single: ClassVar[bool] = True
    _kind: ClassVar[str] = "debounce"

    def __init__(self, settle: timedelta, *, scope: str | None = None) -> None:
        self._settle = _seconds(settle, "Debounce settle")
        self.settle = settle
        self.scope = scope

    def _control(self, key: str, scope: str | None) -> Control:
        return DebouncePolicy(key=key, settle=self._settle, scope=scope)

    def __repr__(self) -> str:
        return f"Debounce({self.settle!r}, scope={self.scope!r})"


class Cooldown(_AdmissionControl):
    """Leading edge: the first submission runs; the others within
    ``window`` of its start are dropped."""

    _kind: ClassVar[str] = "cooldown"

    def __init__(self, window: timedelta, *, scope: str | None = None) -> None:
        self._window = _seconds(window, "Cooldown window")
        self.window = window
        self.scope = scope

    def _control(self, key: str, scope: str | None) -> Control:
        return CooldownPolicy(key=key, window=self._window, scope=scope)

    def __repr__(self) -> str:
        return f"Cooldown({self.window!r}, scope={self.scope!r})"


class RateLimit(_AdmissionControl):
    """At most ``limit`` starts in any window of ``per``; the excess runs
    when a place in the window opens, or is dropped with ``drop``."""

    _kind: ClassVar[str] = "ratelimit"

    def __init__(
        self, limit: int, *, per: timedelta, drop: bool = False, scope: str | None = None
    ) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise UsageError(f"RateLimit limit must be a whole number of at least 1, not {limit!r}")
        self._per = _seconds(per, "RateLimit per", positive=True)
        self.limit = limit
        self.per = per
        self.drop = drop
        self.scope = scope

    def _control(self, key: str, scope: str | None) -> Control:
        return RateLimitPolicy(
            key=key, limit=self.limit, per=self._per, drop=self.drop, scope=scope
        )

    def __repr__(self) -> str:
        return f"RateLimit({self.limit}, per={self.per!r}, drop={self.drop}, scope={self.scope!r})"


__all__ = ["Cooldown", "Debounce", "RateLimit"]
