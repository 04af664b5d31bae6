"""The Valkey GLIDE adapter for docket (``glide://``, ``glides://`` URLs).

Not implemented yet: the adapter, built on valkey-glide and the same Lua
scripts as the Redis adapter, lands with its own issue.  Until then this
module only says so, clearly, when a docket asks for it.
"""

from __future__ import annotations

from docket_core.sansio.errors import UsageError

__all__ = ["GlideStore"]


class GlideStore:
    """Placeholder for the GLIDE storage adapter; it cannot be built yet."""

    @classmethod
    def from_url(cls, url: str, *, name: str) -> GlideStore:
        raise UsageError(
            "the glide:// adapter is not available yet in this version of docket; use memory://"
        )
