"""The Redis/Valkey key layout and Lua scripts, written once for every client.

Both the redis-py adapter (``docket_redis``) and the Valkey GLIDE adapter
(``docket_glide``) run these scripts; this package imports no client library.
``protocol`` turns each store effect into a ``ScriptCall`` and each script
reply into the outcome the core expects, so an adapter only has to run calls.

Key layout of docket ``name`` (``P`` is the hash tag ``{name}``, so every key of
a docket lives in one cluster slot; per-task keys sit in their own
sub-namespaces, so no task key can collide with an internal key):

======================  ======  ===================================================
``P:q``                 stream  queued and delivered messages; group ``docket-workers``
``P:wake``              stream  wake-ups for blocked readers (at most one entry;
                                group ``docket-workers``): a new soonest
                                scheduled message re-arms one reader's timer
``P:due``               zset    task key -> ``when`` of scheduled messages
``P:msg:<key>``         hash    the scheduled message of a task key
``P:run:<key>``         hash    the task key's record (state, generation, result...)
``P:prog:<key>``        hash    progress of a running task
``P:parked``            set     task keys parked behind a full limit
``P:pools``             set     shared namespaces this docket has parked keys in
``P:generation``        string  the docket's generation counter
``P:workers``           zset    worker -> last heartbeat
``P:worker-tasks:<w>``  string  JSON list of a worker's task names (expires)
``P:strikes``           stream  strike and restore instructions, in order
``P:dead``              stream  malformed entries set aside: ``id``, ``reason``,
                                ``at``, ``key``, ``raw`` (their fields, packed);
                                about the newest 10,000 are kept
``P:did:<origin>``      hash    outcomes of a worker's requests, for resends
                                (``_floor`` and request number -> JSON outcome)
``P:events:<key>``      pubsub  state and progress events of a task key
``P:cancel``            pubsub  keys being cancelled, for workers
======================  ======  ===================================================

Concurrency limits live in a namespace ``S``: ``P`` for a limit without a
scope, ``{scope}`` for one with a scope, so every docket naming the scope (and
the docket whose name it is) shares its slots and waiters.  A release in one
docket can so wake a task of another: the scripts then touch keys of two hash
tags, which a standalone server allows and a cluster does not.

======================  ======  ===================================================
``S:slots:<limit>``     zset    concurrency slot holder -> last renewal
``S:wait:<limit>``      list    parked tasks, oldest first: ``<#P>:<P><#key>:<key>``
``S:stale``             zset    limits that have parked tasks -> the time their
                                next stale slot counts from: their oldest slot
                                renewal, or while nobody holds one, their
                                ``S:woken`` (0 if none); a read looks only at
                                the limits due by its cutoff
``S:woken``             hash    limit -> when its last waiter was woken
======================  ======  ===================================================

Admission controls (``Debounce``, ``Cooldown``, ``RateLimit``) keep their
state in the same namespace ``S`` of their scope (``admit.lua`` says what
each field holds); each key expires a minute past the state's own end:

======================  ======  ===================================================
``S:debounce:<key>``    hash    the latest submission, the waiting winner, the
                                executions admitted last
``S:cooldown:<key>``    hash    the execution that started and its window's end
``S:ratelimit:<key>``   zset    execution -> start, the starts of ``2 * per``
======================  ======  ===================================================

A parked record carries ``parked`` (the limit) and ``pin`` (its ``S``).
Permanent keys (no TTL while the docket is in use): ``P:q``, ``P:wake``, ``P:due``,
``P:dead``, ``P:parked``, ``P:pools``, ``S:stale``, ``P:workers``, ``P:strikes``,
``P:generation``.  ``P:did:<origin>`` expires ``remember`` after its
worker's last remembered call, and holds only the outcomes whose replies the
worker may not have had.  A record (``P:run:<key>``) has no TTL while its key is live
and ``execution_ttl`` once it ended; every other key is deleted when emptied or
carries a TTL.
"""

from __future__ import annotations

from importlib import resources

SCRIPT_NAMES = (
    "schedule",
    "read",
    "claim",
    "finish",
    "cancel",
    "renew",
    "acquire",
    "release",
    "heartbeat",
    "progress",
    "inspect",
    "clear",
    "bury",
    "dead",
    "admit",
)


def _load() -> dict[str, str]:
    folder = resources.files(__package__)
    prelude = folder.joinpath("prelude.lua").read_text()
    return {
        name: prelude + "\n" + folder.joinpath(f"{name}.lua").read_text() for name in SCRIPT_NAMES
    }


#: script name -> full Lua source (prelude included)
SCRIPTS: dict[str, str] = _load()
