"""The Redis adapter for docket (``redis://``, ``rediss://``, ``unix://`` URLs).

Not implemented yet: the adapter, built on redis-py and Lua scripts that carry
out the storage algebra of ``docket_core.adapter``, lands with its own issue.
Until then this module only says so, clearly, when a docket asks for it.
"""

from __future__ import annotations

from docket_core.sansio.errors import UsageError

__all__ = ["RedisStore"]


class RedisStore:
    """Placeholder for the Redis storage adapter; it cannot be built yet."""

    @classmethod
    def from_url(cls, url: str, *, name: str) -> RedisStore:
        raise UsageError(
            "the redis:// adapter is not available yet in this version of docket; use memory://"
        )
