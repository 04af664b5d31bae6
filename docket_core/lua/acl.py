"""Server ACL refusals, explained the same way for every client.

Servers word a refusal differently by version and by place: ``NOPERM User
docket has no permissions to run the 'xadd' command`` (Valkey, Redis 7.2+;
Redis 7.0 says "this user"), ``ACL failure in script: ...`` inside a script,
and on Redis 7.0 inside a script ``The user executing the script can't run
this command or subcommand script: <sha1>``, which names no command: the
script is then named, with the commands it runs.
"""

from __future__ import annotations

import hashlib
import re

from . import SCRIPTS

_SCRIPT_NAMES = {hashlib.sha1(source.encode()).hexdigest(): n for n, source in SCRIPTS.items()}
#: script name -> the commands it runs (``redis.call('X'`` and ``pcall(redis.call, 'X'``)
_SCRIPT_COMMANDS = {
    name: sorted({c.upper() for c in re.findall(r"redis\.p?call(?:\(|,)\s*'(\w+)'", source)})
    for name, source in SCRIPTS.items()
}
_MARKERS = (
    "noperm",
    "no permissions",
    "permissiondenied",
    "acl failure",
    "the user executing the script can't",
)


def acl_refusal(message: str, what: str, user: str | None = None) -> str | None:
    """Why the server's ACL refused ``what`` (the command or script sent), naming
    the refused command where the reply allows; ``None`` if ``message`` is no
    ACL refusal."""
    message = message.strip()
    lowered = message.lower()
    if not any(marker in lowered for marker in _MARKERS):
        return None
    named_user = re.search(r"User (\S+) has no permissions", message)
    user = named_user[1] if named_user else user
    who = f" for user {user!r}" if user else ""
    sha = re.search(r"script: ([0-9a-f]{40})", message)
    script = _SCRIPT_NAMES.get(sha[1]) if sha else None
    where = f" in the docket script {script!r}" if script else f" ({what})"
    command = re.search(r"run the '([^']+)' command", message)
    if command:
        name = command[1].replace("|", " ").upper()
        return f"the server's ACL refused the command {name!r}{who}{where}: {message}"
    if "key" in lowered or "channel" in lowered:
        subject = "a key" if "key" in lowered else "a channel"
        whom = f" user {user!r}" if user else ""
        return f"the server's ACL refused{whom} access to {subject}{where}: {message}"
    if script:
        runs = ", ".join(_SCRIPT_COMMANDS[script])
        return (
            f"the server's ACL refused a command{who}{where} (the server does not say "
            f"which; the script runs {runs}): {message}"
        )
    return f"the server's ACL refused a command{who}{where}: {message}"
