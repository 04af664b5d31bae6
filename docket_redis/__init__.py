"""docket_redis: the redis-py adapter for ``redis://``, ``rediss://`` and ``unix://``.

It runs the shared key layout and Lua scripts of ``docket_core.lua``; all the
storage logic lives there, this package only talks to redis-py.
"""

from .store import RedisStore

__all__ = ["RedisStore"]
