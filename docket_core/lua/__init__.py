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
``P:prog:<key>``        hash    progress of a running task, made by its first
                                report (none: 0 of 100 while it runs), which
                                marks the record ``prog``: its end deletes it
``P:parked``            set     task keys parked behind a full limit without
                                a scope
``P:waiters:<S>|<l>``   zset    task key -> when it parked, the keys of this
                                docket parked behind limit ``l`` of scope ``S``
                                (their messages wait in ``P:due`` at their
                                retry time, and count as scheduled there)
``P:generation``        string  the docket's generation counter
``P:scan``              hash    the reads' scan for stale deliveries: ``at``
                                (when the last one began) and ``cursor``
                                (where it stopped; ``0-0``: it went through)
``P:workers``           zset    worker -> last heartbeat
``P:worker-tasks:<w>``  string  JSON list of a worker's task names (expires)
``P:strikes``           stream  strike and restore instructions, in order
``P:dead``              stream  malformed entries set aside: ``id``, ``reason``,
                                ``at``, ``key``, ``raw`` (their fields, packed);
                                about the newest 10,000 are kept
``P:did:<origin>``      hash    outcomes of a worker's requests, for resends
                                (``_floor`` and request number -> JSON outcome)
``P:partitions``        string  how many partitions the docket is spread over
                                (absent: 1; ``layout.lua``, ``PartitionedStore``)
``P:leaving``           string  the count a change of it left, until that
                                count's partitions are sealed (``layout.lua``)
``P:epoch``             string  how many times the count changed
``P:closing``           set     ``<n>:<owner>``, the leases of the changes of the
                                docket's count to n under way (expiring): this
                                partition takes no new task (``close.lua``)
``P:closed``            string  ``sealed:<n>:<e>``: the docket's count changed to
                                n (its e-th change): this partition takes only
                                the adds of count n (``close.lua``; an older
                                store's ``lease:<n>``, expiring, takes none)
``P:fence``             (none)  never written: every call declares it beside
                                ``P:q``, so none runs while the slot moves
``P:events:<key>``      pubsub  state and progress events of a task key
``P:cancel``            pubsub  keys being cancelled, for workers
======================  ======  ===================================================

Concurrency limits live in a namespace ``S``: ``P`` for a limit without a
scope, ``{scope}`` for one with a scope, so every docket naming the scope (and
the docket whose name it is) shares its slots.  Every script touches the keys
of one hash tag only, the one it is called with: a scoped limit is taken and
released in a chain of single-slot steps (``take`` in ``S``, ``confirm`` or
``park`` in ``P``; ``release`` in ``S``, ``wake`` in the waiting docket,
``enlist`` in ``S``; docs/cluster.md, section 4), and its parked keys wait in
their own docket (``P:waiters:<S>|<limit>``), each also scheduled at a retry
time, so a wake-up lost between two steps costs only latency.

======================  ======  ===================================================
``S:slots:<limit>``     zset    concurrency slot holder -> last renewal
``S:stale:<limit>``     zset    a scoped limit's waiting dockets: docket name ->
                                when it (first) waited; popped oldest first by
                                a release, expires with the slot set
``P:wait:<limit>``      list    parked tasks of a limit without a scope, oldest
                                first: ``<#P>:<P><#key>:<key>``
``P:stale``             zset    limits without a scope that have parked tasks ->
                                the time their next stale slot counts from:
                                their oldest slot renewal, or while nobody
                                holds one, their ``P:woken`` (0 if none); a
                                read looks only at the limits due by its cutoff
``P:woken``             hash    limit -> when its last waiter was woken
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

A parked record carries ``parked`` (the limit) and ``pin`` (its ``S``); a
running one that holds a scoped slot carries ``slot`` and ``pin``.  Permanent
keys (no TTL while the docket is in use): ``P:q``, ``P:wake``, ``P:due``,
``P:dead``, ``P:parked``, ``P:stale``, ``P:workers``, ``P:strikes``,
``P:generation``, ``P:scan``, ``P:partitions``, ``P:epoch``, a sealed ``P:closed`` (an
older docket's ``P:pools`` is no longer read).
``P:did:<origin>`` expires ``remember`` after its worker's last remembered
call, and holds only the outcomes whose replies the worker may not have had.
A record (``P:run:<key>``) has no TTL while its key is live and
``execution_ttl`` once it ended; every other key is deleted when emptied or
carries a TTL.
"""

from __future__ import annotations

import re
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
    "step",
    "heartbeat",
    "progress",
    "inspect",
    "clear",
    "bury",
    "dead",
    "admit",
    "take",
    "confirm",
    "park",
    "wake",
    "enlist",
    "renew_slots",
    "layout",
    "close",
)


#: a top-level definition of the prelude: ``local function name`` or ``local a, b =``
_DEFINITION = re.compile(r"^local (?:function (\w+)|([\w, ]+?)\s*=)")
#: a comment or a string literal (their words name nothing)
_NOT_CODE = re.compile(r"--[^\n]*|'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"")
_NAME = re.compile(r"\b[A-Za-z_]\w*\b")


def _names(code: str) -> set[str]:
    """The identifiers ``code`` mentions, comments and strings aside."""
    return set(_NAME.findall(_NOT_CODE.sub(" ", code)))


def _definitions(prelude: str) -> list[tuple[set[str], str]]:
    """The prelude cut at each top-level ``local`` line: (names it defines,
    text), each with the comment lines just before it."""
    parts: list[tuple[set[str], str]] = []
    comments = ""
    for line in prelude.splitlines(keepends=True):
        found = _DEFINITION.match(line)
        if found:
            names = found[1] or found[2]
            parts.append(({name.strip() for name in names.split(",")}, comments + line))
            comments = ""
        elif line.startswith("--") or not line.strip():
            comments += line
        else:
            if parts:
                parts[-1] = (parts[-1][0], parts[-1][1] + comments + line)
            comments = ""
    return parts


def with_prelude(prelude: str, body: str) -> str:
    """``body`` after the prelude's definitions it needs (with those they
    need, in the prelude's order): every call runs the prelude, and defining
    the ~40 functions no script needs all of costs the server ~2 us a call."""
    parts = _definitions(prelude)
    needed = _names(body)
    kept = [False] * len(parts)
    grew = True
    while grew:
        grew = False
        for index, (names, text) in enumerate(parts):
            if not kept[index] and names & needed:
                kept[index] = grew = True
                needed |= _names(text)
    return "".join(text for (_, text), keep in zip(parts, kept, strict=True) if keep) + body


#: the line of a script that ends its fast path: the text before it runs
#: ahead of the prelude (and must name nothing of it), the text after it
#: after the prelude's definitions (``with_prelude``)
PRELUDE_GOES_HERE = "-- (the prelude goes here)\n"


def _assemble(prelude: str, script: str) -> str:
    """A script's text as the server runs it: its fast path, if it has one
    (and the marker line, a comment), then the prelude's definitions it
    needs, then its body."""
    head, marker, body = script.partition(PRELUDE_GOES_HERE)
    if not marker:
        head, body = "", script
    return head + marker + with_prelude(prelude, body)


def _load() -> dict[str, str]:
    folder = resources.files(__package__)
    prelude = folder.joinpath("prelude.lua").read_text()
    return {
        name: _assemble(prelude, folder.joinpath(f"{name}.lua").read_text())
        for name in SCRIPT_NAMES
    }


#: script name -> Lua source (with the parts of the prelude it uses)
SCRIPTS: dict[str, str] = _load()
