"""The ``docket`` command line.

``docket worker`` runs a worker (optionally serving a healthcheck and
Prometheus metrics); ``strike``, ``restore``, ``clear``, ``snapshot``,
``dead-letters``, ``workers ls|for-task``, ``watch`` and ``tasks`` inspect or
steer a docket that lives in a shared store (``commands``).  Built on
argparse (``parsing``), so it needs nothing beyond docket itself.

Imports go one way: this module uses ``parsing`` and ``commands``, and
``commands`` uses ``parsing``; neither imports this module.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import TextIO

from ..sansio.errors import DocketError, UsageError
from . import commands
from .parsing import build_parser, parse_duration, parse_value

__all__ = ["MEMORY_ONLY_IN_PROCESS", "build_parser", "main", "parse_duration", "parse_value"]

MEMORY_ONLY_IN_PROCESS = "memory:// dockets live inside one process; use a redis:// URL for the CLI"


# -- commands ----------------------------------------------------------------------------------


def _is_memory(url: str) -> bool:
    return url.strip().lower().startswith("memory://")


def _split_tasks(values: Sequence[str] | None) -> list[str]:
    raw = list(values) if values else [os.environ.get("DOCKET_TASKS", "")]
    return [part.strip() for value in raw for part in value.split(",") if part.strip()]


def _command_version(out: TextIO) -> int:
    from .. import __version__

    print(__version__, file=out)
    return 0


def _command_worker(args: argparse.Namespace) -> int:
    from functools import partial

    import anyio

    from ..worker import Worker

    logging.basicConfig(
        level=getattr(logging, args.logging_level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    run = partial(
        Worker.run,
        docket_name=args.docket,
        url=args.url,
        name=args.name,
        concurrency=args.concurrency,
        redelivery_timeout=args.redelivery_timeout,
        reconnection_delay=args.reconnection_delay,
        minimum_check_interval=args.minimum_check_interval,
        scheduling_resolution=args.scheduling_resolution,
        schedule_automatic_tasks=args.schedule_automatic_tasks,
        until_finished=args.until_finished,
        healthcheck_port=int(args.healthcheck_port) if args.healthcheck_port else None,
        metrics_port=int(args.metrics_port) if args.metrics_port else None,
        tasks=_split_tasks(args.tasks),
        fallback_task=args.fallback_task or None,
    )
    anyio.run(run)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the ``docket`` command; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:
        code = stop.code
        return code if isinstance(code, int) else (0 if code is None else 2)

    out = sys.stdout
    command: str = args.command
    if command == "version":
        return _command_version(out)

    if command != "worker" and _is_memory(args.url):
        print(f"docket {command}: {MEMORY_ONLY_IN_PROCESS}", file=sys.stderr)
        return 2

    try:
        if command == "worker":
            return _command_worker(args)
        if command in ("strike", "restore"):
            return commands.command_strike(args, out, restore=command == "restore")
        if command == "clear":
            return commands.command_clear(args, out)
        if command == "snapshot":
            return commands.command_snapshot(args, out)
        if command == "dead-letters":
            return commands.command_dead_letters(args, out)
        if command == "workers":
            if args.workers_command == "for-task":
                return commands.command_workers_for_task(args, out)
            return commands.command_workers_ls(args, out)
        if command == "watch":
            return commands.command_watch(args, out)
        if command == "tasks":
            return commands.command_tasks(args, out)
    except UsageError as error:
        print(f"docket {command}: {error}", file=sys.stderr)
        return 2
    except DocketError as error:
        print(f"docket {command}: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    raise AssertionError(f"unhandled command {command!r}")  # argparse only allows known ones
