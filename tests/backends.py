"""The backends a test runs on, by name: ``<store>-<event loop>``.

``conftest.py`` parametrizes every test that takes the ``backend`` fixture
(directly or through ``docket``, ``make_docket`` or ``docket_url``) with these
names; ``@pytest.mark.backends(*names)`` narrows one test or module.  The
stores: ``memory`` (docket_memory), ``redis``/``valkey`` (redis-py on a
private redis-server/valkey-server), ``glide_redis``/``glide_valkey`` (GLIDE on
the same servers), ``redis_cluster``/``glide_cluster`` (both clients on a
private 3-primary Valkey Cluster) and ``redis_sentinel`` (redis-py through
private sentinels).  redis-py has no trio support, so it runs under asyncio only.
"""

from __future__ import annotations

#: the in-process store, under both event loops: where a test with no docket
#: fixture (and no marker) runs
MEMORY_BACKENDS = ["memory-asyncio", "memory-trio"]

#: a real server behind each client (GLIDE also under trio)
SERVER_BACKENDS = [
    "redis-asyncio",
    "valkey-asyncio",
    "glide_valkey-asyncio",
    "glide_valkey-trio",
    "glide_redis-asyncio",
]

#: a 3-primary Valkey Cluster through each client, and a Sentinel set
#: (primary, replica, three sentinels) through redis-py
CLUSTER_BACKENDS = [
    "redis_cluster-asyncio",
    "glide_cluster-asyncio",
    "redis_sentinel-asyncio",
]

#: every backend: where a test that takes ``docket``, ``make_docket`` or
#: ``docket_url`` runs unless it is marked (tests/contract/ is such tests)
CONTRACT_BACKENDS = [*MEMORY_BACKENDS, *SERVER_BACKENDS, *CLUSTER_BACKENDS]
