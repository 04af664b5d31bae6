"""docket_memory: the in-process storage adapter (``memory://name``).

It needs no server, runs under asyncio and trio, and is the reference
implementation of the storage algebra the other adapters follow.
"""

from .shelf import Shelf
from .store import MemoryStore

__all__ = ["MemoryStore", "Shelf"]
