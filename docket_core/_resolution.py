"""The machinery behind ``docket_core.dependencies``: the ``Dependency``
base, per-function plans, argument binding and policies (the resolution of
one execution's dependencies is ``_run_resolution``'s).

Everything that depends only on the function (its signature, its declared
dependencies, its ``Annotated`` metadata, the static part of its policy) is
computed once into a ``_Plan`` and cached by function; the per-call work is a
dictionary lookup plus whatever the declared dependencies really need.
"""

from __future__ import annotations

import contextvars
import inspect
import sys
import typing
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from .annotations import Logged as Logged
from .annotations import metadata_of
from .sansio.admission import gate_order
from .sansio.errors import ForcedRetry as ForcedRetry
from .sansio.errors import UsageError
from .sansio.inputs import FollowUp
from .sansio.values import NO_POLICY, TaskPolicy

if TYPE_CHECKING:
    from ._run_resolution import Run

current_docket: contextvars.ContextVar[Any] = contextvars.ContextVar("current_docket")
current_worker: contextvars.ContextVar[Any] = contextvars.ContextVar("current_worker")
current_execution: contextvars.ContextVar[Any] = contextvars.ContextVar("current_execution")


class Dependency:
    """Base of everything that can be declared as a parameter default (or as
    ``Annotated`` metadata) and is filled in when the task runs.

    ``single`` dependencies may appear at most once per task function (counting
    subclasses as the same kind, so ``Retry`` and ``ExponentialRetry`` clash).
    """

    single: ClassVar[bool] = False
    #: as ``Annotated`` metadata it describes the argument instead of replacing it
    _describes_argument: bool = False
    #: contributes to the policy with values that depend on the call's arguments
    _per_call: ClassVar[bool] = False
    #: the extension point this dependency is (``extensions``): "runtime",
    #: "failure" or "completion"
    _role: ClassVar[str | None] = None

    def __class_getitem__(cls, item: Any) -> Any:
        """``Dependency["T"]``, as pydocket's generic base is written: the class."""
        return cls

    async def _inject(self, run: Run, parameter: str) -> Any:
        """The value handed to the task for this dependency: itself, or, for a
        custom dependency that is an async context manager (pydocket's way),
        what entering it gives (it exits after the task)."""
        if _entered(type(self)):
            return await run.stack.enter_async_context(self)  # type: ignore[arg-type]
        return self

    def _cache_key(self) -> object | None:
        """Values are shared within one execution by this key (``None``: not cached)."""
        return None

    def _bind_to_parameter(self, parameter: str) -> Dependency:
        """The dependency as ``Annotated`` metadata on ``parameter``."""
        return self

    def _check(self, function: Callable[..., Any], parameter: str, top_level: bool) -> None:
        """Raise ``UsageError`` if this declaration cannot work."""

    def _policy(self) -> dict[str, Any]:
        """``TaskPolicy`` fields that do not depend on the call."""
        return {}

    def _call_policy(
        self, function_name: str, docket_name: str, arguments: Mapping[str, Any]
    ) -> dict[str, Any]:
        """``TaskPolicy`` fields that depend on the call (when ``_per_call``)."""
        return {}

    def _follow_up(self) -> FollowUp | None:
        """What this per-execution copy asks of the task's future."""
        return None


_NO_DEPENDENCIES: Mapping[str, Dependency] = {}


def _single_bases(cls: type[Dependency]) -> list[type[Dependency]]:
    """The classes of ``cls``'s lineage that declare ``single = True``, the
    most specific first."""
    return [
        base
        for base in cls.__mro__
        if isinstance(base, type)
        and issubclass(base, Dependency)
        and vars(base).get("single") is True
    ]


def check_singles(dependencies: Sequence[Dependency]) -> None:
    """Refuse two ``single`` dependencies of one kind, as pydocket words it:
    the same class is named as itself (``Retry``), two classes of one single
    lineage by the closest class they share (``Retry`` for a ``Retry`` and an
    ``ExponentialRetry``, ``Runtime`` for a ``Timeout`` and a custom runtime)."""
    singles = [d for d in dependencies if d.single]
    seen: set[type[Dependency]] = set()
    for dependency in singles:
        kind = type(dependency)
        if kind in seen:
            raise UsageError(f"Only one {kind.__name__} dependency is allowed per task")
        seen.add(kind)
    claimed: dict[type[Dependency], Dependency] = {}
    for dependency in singles:
        for base in _single_bases(type(dependency)):
            other = claimed.get(base)
            if other is not None:
                shared = next(b for b in _single_bases(type(other)) if isinstance(dependency, b))
                raise UsageError(f"Only one {shared.__name__} dependency is allowed per task")
        for base in _single_bases(type(dependency)):
            claimed[base] = dependency


# -- plans ---------------------------------------------------------------------


@attrs.frozen(slots=True)
class _Injected:
    name: str
    #: index when the parameter can be passed by position, else a large number
    position: int
    dependency: Dependency


@attrs.frozen(slots=True)
class _Plan:
    injected: tuple[_Injected, ...]
    policy: TaskPolicy
    per_call: tuple[Dependency, ...]
    #: every dependency the function declares (parameters and ``Annotated``)
    declared: tuple[Dependency, ...]
    positional: tuple[str, ...]
    var_positional: str | None
    defaults: Mapping[str, Any]
    logged: Mapping[str, Logged]
    parameters: frozenset[str]
    var_keyword: bool
    #: every injected dependency is its own value (``_self_injecting``): a
    #: run fills them in without a ``Run`` (no cache, cleanups or roles)
    self_injected: bool = False


def _entered(kind: type[Dependency]) -> bool:
    """Whether a dependency of ``kind`` is an async context manager: what the
    task gets is what entering it gives (``Dependency._inject``)."""
    return hasattr(kind, "__aenter__") and hasattr(kind, "__aexit__")


def _self_injecting(dependency: Dependency) -> bool:
    """Whether ``dependency`` hands the task itself and nothing more: the
    base ``_inject``, no context manager to enter, no role (as a
    ``ConcurrencyLimit`` or a ``Cooldown``)."""
    kind = type(dependency)
    return kind._inject is Dependency._inject and not _entered(kind) and dependency._role is None


@attrs.frozen(slots=True)
class FactoryPlan:
    """How to call a ``Depends`` factory: its own dependencies and its kind."""

    injected: tuple[tuple[str, Dependency], ...]
    #: "asyncgen", "gen" or "call"
    kind: str


_PLANS: dict[Any, _Plan] = {}
_FACTORY_PLANS: dict[Any, FactoryPlan] = {}
_NOT_POSITIONAL = sys.maxsize


def _signature(function: Callable[..., Any]) -> inspect.Signature:
    try:
        return inspect.signature(function)
    except (TypeError, ValueError) as error:
        raise UsageError(f"can't inspect the signature of {function!r}: {error}") from None


def _annotations(function: Callable[..., Any], signature: inspect.Signature) -> dict[str, Any]:
    """Parameter annotations, evaluated when they are strings (best effort)."""
    raw = {
        name: p.annotation
        for name, p in signature.parameters.items()
        if p.annotation is not inspect.Parameter.empty
    }
    if any(isinstance(a, str) for a in raw.values()):
        try:
            hints = typing.get_type_hints(function, include_extras=True)
        except Exception:
            hints = {}
        raw = {name: hints.get(name, a) for name, a in raw.items()}
    return raw


def _scan(
    function: Callable[..., Any], top_level: bool
) -> tuple[
    inspect.Signature,
    list[tuple[inspect.Parameter, Dependency]],
    list[Dependency],
    dict[str, Logged],
]:
    """Dependencies to inject, argument-describing dependencies and ``Logged`` markers."""
    signature = _signature(function)
    annotations = _annotations(function, signature)
    injected: list[tuple[inspect.Parameter, Dependency]] = []
    describing: list[Dependency] = []
    logged: dict[str, Logged] = {}
    for name, parameter in signature.parameters.items():
        found: list[Dependency] = []
        if isinstance(parameter.default, Dependency):
            found.append(parameter.default)
        metadata = metadata_of(annotations.get(name))
        marker = Logged.among(metadata)
        if marker is not None:
            logged[name] = marker
        for item in metadata:
            if isinstance(item, Dependency):
                bound = item._bind_to_parameter(name)
                if bound._describes_argument:
                    bound._check(function, name, top_level)
                    describing.append(bound)
                else:
                    found.append(bound)
        if len(found) > 1:
            raise UsageError(f"parameter {name!r} of {_name(function)} has two dependencies")
        if found:
            if parameter.kind in (
                parameter.POSITIONAL_ONLY,
                parameter.VAR_POSITIONAL,
                parameter.VAR_KEYWORD,
            ):
                raise UsageError(
                    f"dependency parameter {name!r} of {_name(function)} must be "
                    "passable by keyword"
                )
            found[0]._check(function, name, top_level)
            injected.append((parameter, found[0]))
    return signature, injected, describing, logged


def _name(function: Callable[..., Any]) -> str:
    return getattr(function, "__qualname__", None) or repr(function)


def _build_plan(function: Callable[..., Any]) -> _Plan:
    signature, injected, describing, logged = _scan(function, top_level=True)
    everything = [d for _, d in injected] + describing
    check_singles(everything)
    fields: dict[str, Any] = {}
    for dependency in everything:
        fields.update(dependency._policy())
    positional: list[str] = []
    var_positional: str | None = None
    defaults: dict[str, Any] = {}
    for name, p in signature.parameters.items():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            positional.append(name)
        elif p.kind is p.VAR_POSITIONAL:
            var_positional = name
        if p.default is not p.empty and not isinstance(p.default, Dependency):
            defaults[name] = p.default
    position = {name: i for i, name in enumerate(positional)}
    return _Plan(
        injected=tuple(
            _Injected(p.name, position.get(p.name, _NOT_POSITIONAL), d) for p, d in injected
        ),
        policy=TaskPolicy(**fields) if fields else NO_POLICY,
        per_call=tuple(d for d in everything if d._per_call),
        declared=tuple(everything),
        positional=tuple(positional),
        var_positional=var_positional,
        defaults=defaults,
        logged=logged,
        parameters=frozenset(signature.parameters),
        var_keyword=any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()),
        self_injected=all(_self_injecting(d) for _, d in injected),
    )


def _plan(function: Callable[..., Any]) -> _Plan:
    try:
        return _PLANS[function]
    except KeyError:
        pass
    except TypeError:  # unhashable callable: no caching
        return _build_plan(function)
    plan = _PLANS[function] = _build_plan(function)
    return plan


def factory_plan(factory: Callable[..., Any]) -> FactoryPlan:
    """The cached plan of a ``Depends`` factory (validating it on first use)."""
    try:
        return _FACTORY_PLANS[factory]
    except KeyError:
        pass
    _, injected, _, _ = _scan(factory, top_level=False)
    covered = {p.name for p, _ in injected}
    for name, p in _signature(factory).parameters.items():
        if name in covered or p.default is not p.empty:
            continue
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        raise UsageError(
            f"parameter {name!r} of dependency {_name(factory)} needs a dependency default"
        )
    if inspect.isasyncgenfunction(factory):
        kind = "asyncgen"
    elif inspect.isgeneratorfunction(factory):
        kind = "gen"
    else:  # plain or async function; ``@contextmanager`` ones return a manager
        kind = "call"
    plan = FactoryPlan(tuple((p.name, d) for p, d in injected), kind)
    try:
        _FACTORY_PLANS[factory] = plan
    except TypeError:
        pass
    return plan


# -- the public entry points -------------------------------------------------------


def validate(function: Callable[..., Any]) -> None:
    """Raise ``UsageError`` when ``function``'s dependency declarations cannot work."""
    _plan(function)


def task_policy(
    function: Callable[..., Any],
    function_name: str,
    docket_name: str,
    arguments: Mapping[str, Any],
    worker_dependencies: Mapping[str, Dependency] = _NO_DEPENDENCIES,
) -> TaskPolicy:
    """What the core must know about one call of ``function``; a worker's
    own dependencies add what the task does not say itself (a ``Retry`` of
    the worker retries every task that declares none), and clash with the
    task's like two of the task's would (``check_singles``)."""
    plan = _PLANS.get(function) or _plan(function)
    if not plan.per_call and not worker_dependencies:
        return plan.policy
    policy = plan.policy
    fields: dict[str, Any] = {
        "retry": policy.retry,
        "perpetual": policy.perpetual,
        "timeout": policy.timeout,
        "concurrency": policy.concurrency,
        "admission": policy.admission,
    }
    for dependency in plan.per_call:
        for name, value in dependency._call_policy(function_name, docket_name, arguments).items():
            # every admission control counts; any other field is the last one's
            fields[name] = (*fields[name], *value) if name == "admission" else value
    if worker_dependencies:
        check_singles([*plan.declared, *worker_dependencies.values()])
        for dependency in worker_dependencies.values():
            given = dependency._policy()
            if dependency._per_call:
                given.update(dependency._call_policy(function_name, docket_name, arguments))
            for name, value in given.items():
                if name == "admission":
                    fields[name] = (*fields[name], *value)
                elif fields[name] is None:
                    fields[name] = value
    if fields["admission"]:
        fields["admission"] = gate_order(fields["admission"])
    return TaskPolicy(**fields)


def bind_arguments(
    function: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """The call's arguments by parameter name, plain defaults filled in.

    Dependency parameters appear only when passed explicitly; extra keyword
    arguments (for ``**kwargs``) appear under their own names.
    """
    plan = _PLANS.get(function) or _plan(function)
    bound = dict(zip(plan.positional, args, strict=False))
    if plan.var_positional is not None and len(args) > len(plan.positional):
        bound[plan.var_positional] = args[len(plan.positional) :]
    bound.update(kwargs)
    for name, value in plan.defaults.items():
        bound.setdefault(name, value)
    return bound


def call_repr(
    function: Callable[..., Any],
    function_name: str,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
) -> str:
    """``name(arg, key=...)`` for log lines: only ``Logged`` arguments show values."""
    plan = _PLANS.get(function) or _plan(function)
    shown: list[str] = []
    for index, value in enumerate(args):
        name = plan.positional[index] if index < len(plan.positional) else plan.var_positional
        marker = plan.logged.get(name) if name is not None else None
        shown.append(marker.format(value) if marker is not None else "...")
    for name, value in kwargs.items():
        marker = plan.logged.get(name)
        shown.append(f"{name}={marker.format(value) if marker is not None else '...'}")
    return f"{function_name}({', '.join(shown)})"


@attrs.define
class TaskContext:
    """Everything the dependencies of one execution may draw on."""

    docket: Any
    worker: Any
    execution: Any
    function_name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    now: Callable[[], float]
    deadline: float | None
    on_deadline_change: Callable[[float], None]
    report_progress: Callable[..., Awaitable[Any]]
