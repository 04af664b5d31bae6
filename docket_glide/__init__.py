"""docket_glide: the Valkey GLIDE adapter for ``glide://`` and ``glides://`` (TLS).

It runs the same key layout and Lua scripts as ``docket_redis`` (from
``docket_core.lua``) without importing redis-py.
"""

from .store import GlideStore, configuration_from_url

__all__ = ["GlideStore", "configuration_from_url"]
