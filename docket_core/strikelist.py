"""``StrikeList``: the strikes in effect, with pydocket's public surface.

``Strike`` and ``Restore`` are instruction values, built positionally as in
pydocket: ``Strike("send", "customer", "==", 42)``.  A strike list answers
``is_stricken`` for an ``Execution`` or for a mapping of arguments by name.

- ``docket.strike_list`` is the list a ``Docket`` holds on its own store:
  it shows the strikes as of the docket's last look at the store (every
  ``add``, every strike, ``await docket.wait_for_strikes_loaded()``).
- ``StrikeList(url=..., name=...)`` used as an async context manager opens
  its own connection to the docket ``name`` at ``url`` (any docket URL,
  ``memory://`` included), reads its strikes on entering and follows new
  ones every second until it exits; ``strike``/``restore`` write for every
  process of that docket.
- ``StrikeList()`` without a URL is local only: ``update`` changes it.

The matching itself is the core's (``docket_core.sansio.strikes``);
instructions given to ``update`` are kept apart from the store's, so a
local change never reaches other processes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from contextlib import AsyncExitStack
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import anyio
import attrs

from ._resolution import bind_arguments
from .adapter import StorageAdapter, adapter_for_url
from .lua.base import ScriptedStore
from .sansio.errors import UsageError
from .sansio.strikes import Operator
from .sansio.strikes import StrikeInstruction as CoreInstruction
from .sansio.strikes import StrikeList as CoreStrikeList
from .serialization import Signing, SigningKeys

if TYPE_CHECKING:
    from .execution import Execution

logger = logging.getLogger("docket.strikes")

#: how often a strike list with its own connection reads new strikes
FOLLOW_SECONDS = 1.0

LiteralOperator = Literal["==", "!=", ">", ">=", "<", "<=", "between"]

#: the name no task has: ``is_stricken`` of a mapping matches only the
#: strikes that name no task
_NO_TASK = ""


@attrs.frozen(slots=True)
class StrikeInstruction:
    """A strike or a restore: ``function`` alone is the whole task,
    ``parameter`` alone any task called with a matching value for it, both
    that task with that value."""

    direction: ClassVar[Literal["strike", "restore"]]

    function: str | None = None
    parameter: str | None = None
    operator: Operator = attrs.field(default=Operator.EQUAL, converter=Operator)
    value: Any = None

    def instruction(self) -> CoreInstruction:
        """The core's value for this instruction."""
        return CoreInstruction(
            function=self.function,
            parameter=self.parameter,
            operator=self.operator,
            value=self.value,
            restore=self.direction == "restore",
        )

    def call_repr(self) -> str:
        """``task(parameter op value)``, ``*`` for what it leaves open."""
        value = repr(self.value) if self.parameter else "*"
        return f"{self.function or '*'}({self.parameter or '*'} {self.operator.value} {value})"

    def labels(self) -> dict[str, str]:
        """The instruction's telemetry attributes."""
        labels: dict[str, str] = {}
        if self.function:
            labels["docket.task"] = self.function
        if self.parameter:
            labels["docket.parameter"] = self.parameter
            labels["docket.operator"] = self.operator.value
            labels["docket.value"] = repr(self.value)
        return labels


@attrs.frozen(slots=True)
class Strike(StrikeInstruction):
    """Stop matching calls from being scheduled or run."""

    direction: ClassVar[Literal["strike", "restore"]] = "strike"


@attrs.frozen(slots=True)
class Restore(StrikeInstruction):
    """Lift a strike made with the same function, parameter, operator and value."""

    direction: ClassVar[Literal["strike", "restore"]] = "restore"


def instruction_for(
    direction: type[StrikeInstruction],
    function: Callable[..., Any] | str | None,
    parameter: str | None,
    operator: Operator | str,
    value: Any,
) -> StrikeInstruction:
    """A ``Strike`` or ``Restore`` naming ``function`` (a task or its name)."""
    if function is not None and not isinstance(function, str):
        function = str(function.__name__)
    if not function and parameter is None:
        raise UsageError("a strike needs a function, a parameter, or both")
    return direction(function, parameter, Operator(operator), value)


MinimalStrike = tuple[Operator, Any]
ParameterStrikes = dict[str, set[MinimalStrike]]
TaskStrikes = dict[str, ParameterStrikes]


class StrikeList:
    """The strikes of one docket (or local ones); see the module's documentation."""

    def __init__(
        self,
        url: str | None = None,
        name: str = "strikelist",
        *,
        adapter: StorageAdapter | None = None,
        signing_key: SigningKeys | None = None,
    ) -> None:
        """``url`` and ``name`` pick the docket whose strikes to follow (with
        ``signing_key`` if its strikes are signed); ``adapter`` shares an
        open adapter instead (``Docket`` passes its own), which this list
        never opens or closes."""
        self.url = url
        self.name = name
        self._owns_adapter = adapter is None and url is not None
        if adapter is None and url is not None:
            adapter = adapter_for_url(url, name)
            if isinstance(adapter, ScriptedStore):
                adapter.signing = Signing.resolve(signing_key)
        self._adapter = adapter
        self._store: CoreStrikeList | None = None
        self._local = CoreStrikeList()
        self._conditions: list[Callable[[Execution], bool]] = []
        self._stack: AsyncExitStack | None = None

    # -- connection ----------------------------------------------------------------

    async def __aenter__(self) -> StrikeList:
        if self._stack is not None:
            raise UsageError("a StrikeList is not re-entrant")
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            if self._adapter is not None and self._owns_adapter:
                await self._adapter.open()
                stack.push_async_callback(self._adapter.close)
                await self.refresh()
                group = await stack.enter_async_context(anyio.create_task_group())
                stack.callback(group.cancel_scope.cancel)
                group.start_soon(self._follow)
            elif self._adapter is not None:
                await self.refresh()
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()

    async def _follow(self) -> None:
        while True:
            await anyio.sleep(FOLLOW_SECONDS)
            try:
                await self.refresh()
            except Exception as error:
                logger.warning("strike list %s could not read strikes: %s", self.name, error)

    async def refresh(self) -> None:
        """Read the store's strikes now (no-op for a local list)."""
        if self._adapter is not None:
            self._store = await self._adapter.strikes()

    async def wait_for_strikes_loaded(self) -> None:
        """Make sure the store's strikes are loaded (no-op for a local list)."""
        await self.refresh()

    # -- instructions --------------------------------------------------------------

    async def send_instruction(self, instruction: StrikeInstruction) -> None:
        """Write ``instruction`` for every process of the docket."""
        if self._adapter is None or (self._owns_adapter and self._stack is None):
            raise RuntimeError(
                "Cannot send strike instruction: not connected; use 'async with "
                "StrikeList(url=..., name=...)' first"
            )
        await self._adapter.add_strike(instruction.instruction())
        await self.refresh()

    async def strike(
        self,
        function: str | None = None,
        parameter: str | None = None,
        operator: Operator | LiteralOperator = "==",
        value: Any = None,
    ) -> None:
        """Strike calls of ``function`` and/or with ``parameter <operator> value``."""
        await self.send_instruction(instruction_for(Strike, function, parameter, operator, value))

    async def restore(
        self,
        function: str | None = None,
        parameter: str | None = None,
        operator: Operator | LiteralOperator = "==",
        value: Any = None,
    ) -> None:
        """Lift a strike made with the same arguments."""
        await self.send_instruction(instruction_for(Restore, function, parameter, operator, value))

    def update(self, instruction: StrikeInstruction) -> None:
        """Apply ``instruction`` to this list only (other processes never see it)."""
        self._local.apply(instruction.instruction())

    def add_condition(self, condition: Callable[[Execution], bool]) -> None:
        """Also count an execution as stricken when ``condition(execution)``;
        ``Docket.add``/``replace`` and batches honour it."""
        self._conditions.insert(0, condition)

    def remove_condition(self, condition: Callable[[Execution], bool]) -> None:
        self._conditions.remove(condition)

    # -- matching --------------------------------------------------------------------

    def _layers(self) -> Iterable[CoreStrikeList]:
        if self._store is not None:
            yield self._store
        yield self._local

    def meets_condition(self, execution: Execution) -> bool:
        """Whether a condition given to ``add_condition`` matches ``execution``."""
        return any(condition(execution) for condition in self._conditions)

    def is_stricken(self, target: Execution | Mapping[str, Any]) -> bool:
        """Whether a strike matches: an ``Execution`` (its task, its
        arguments, the conditions), or a mapping of arguments by parameter
        name (only strikes that name no task apply to it)."""
        if isinstance(target, Mapping):
            function, arguments = _NO_TASK, target
        else:
            if self.meets_condition(target):
                return True
            function, arguments = target.function_name, _arguments_of(target)
        return any(layer.is_struck(function, arguments) for layer in self._layers())

    @property
    def task_strikes(self) -> TaskStrikes:
        """Strikes naming a task: ``{task: {parameter: {(operator, value)}}}``,
        ``{task: {}}`` for a whole task (a read-only view)."""
        strikes: TaskStrikes = {}
        for layer in self._layers():
            for whole in layer.functions:
                strikes.setdefault(whole, {})
            for (function, parameter), entries in layer.conditions.items():
                if function is not None:
                    found = strikes.setdefault(function, {}).setdefault(parameter, set())
                    found.update(_hashable(entries))
        return strikes

    @property
    def parameter_strikes(self) -> ParameterStrikes:
        """Strikes of any task by argument: ``{parameter: {(operator, value)}}``."""
        strikes: ParameterStrikes = {}
        for layer in self._layers():
            for (function, parameter), entries in layer.conditions.items():
                if function is None:
                    strikes.setdefault(parameter, set()).update(_hashable(entries))
        return strikes


def _arguments_of(execution: Execution) -> Mapping[str, Any]:
    if execution.function is None:
        return execution.kwargs
    try:
        return bind_arguments(execution.function, execution.args, execution.kwargs)
    except Exception:
        return execution.kwargs


def _hashable(entries: Iterable[MinimalStrike]) -> list[MinimalStrike]:
    kept = []
    for entry in entries:
        try:
            hash(entry)
        except TypeError:
            continue
        kept.append(entry)
    return kept


__all__ = [
    "LiteralOperator",
    "Operator",
    "Restore",
    "Strike",
    "StrikeInstruction",
    "StrikeList",
]
