"""Partitions: how a docket spreads over the shards of a cluster.

A docket of ``N`` partitions keeps ``N`` queues, schedules and record sets,
each under its own hash tag, so that each lives in one hash slot (every
guarantee holds per partition) and the partitions land on different shards.

- With ``N = 1`` nothing changes: the one partition's tag is ``{name}``.
- With ``N > 1``, partition ``i``'s tag is ``{name|i.s}``, where ``s`` is the
  smallest integer >= 0 that puts the tag's hash slot (CRC16/XMODEM of the
  text between the braces, modulo 16384, as a cluster computes it) in the
  ``i``-th of ``N`` equal ranges of the 16384 slots.  On a cluster sharded
  evenly over ``N`` primaries, each partition then lives on its own primary.
- A task key goes to partition ``crc32(key) % N``: stable across processes
  (unlike ``hash``) and never changing for a key, so its generations stay
  increasing within its partition.
- Docket-wide keys (strikes, workers, the recorded partition count, limits
  without a scope) keep the tag ``{name}``.
- Delivery ids name their partition when ``N > 1``: ``"<i>/<entry id>"``.

Pure functions only: the core and every adapter compute the same layout.
"""

from __future__ import annotations

import zlib

#: the hash slots of a Redis/Valkey Cluster
SLOTS = 16384


def _crc16_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
        table.append(crc & 0xFFFF)
    return tuple(table)


_CRC16 = _crc16_table()


def crc16(data: bytes) -> int:
    """CRC16/XMODEM, the checksum a cluster hashes keys with."""
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ _CRC16[((crc >> 8) ^ byte) & 0xFF]
    return crc


def key_slot(key: str) -> int:
    """The hash slot of ``key``: of its hash tag (the text between the first
    ``{`` and the next ``}``, when not empty), else of the whole key."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            key = key[start + 1 : end]
    return crc16(key.encode()) % SLOTS


def partition_tags(name: str, partitions: int) -> tuple[str, ...]:
    """The hash tag (with its braces) of each of a docket's partitions."""
    if partitions < 1:
        raise ValueError(f"partitions must be at least 1, not {partitions}")
    if partitions == 1:
        return ("{" + name + "}",)
    tags = []
    for index in range(partitions):
        low, high = index * SLOTS // partitions, (index + 1) * SLOTS // partitions
        salt = 0
        while not low <= key_slot("{" + f"{name}|{index}.{salt}" + "}") < high:
            salt += 1
        tags.append("{" + f"{name}|{index}.{salt}" + "}")
    return tuple(tags)


def partition_of(key: str, partitions: int) -> int:
    """The partition a task key belongs to."""
    if partitions == 1:
        return 0
    return zlib.crc32(key.encode()) % partitions


def delivery_id(partition: int, entry_id: str, partitions: int) -> str:
    """A delivery's id: the stream entry id, prefixed by its partition when
    the docket has more than one."""
    return entry_id if partitions == 1 else f"{partition}/{entry_id}"


def layout_changed(name: str, partitions: int, recorded: int) -> str | None:
    """Why a worker of docket ``name`` opened with ``partitions`` must stop
    when the docket's recorded count is ``recorded`` (``None``: it is the same)."""
    if recorded == partitions:
        return None
    return (
        f"docket {name} is recorded with {recorded} partitions now, not the {partitions} "
        f"this worker opened it with: it reads queues no producer fills any more; "
        f"start it again with partitions={recorded}"
    )


def entry_of(delivery: str) -> str:
    """The stream entry id of a delivery id, with or without its partition's
    prefix (an entry id has no ``/``): what a partition's store acts on when
    it is handed a ``Finish`` as the docket names it."""
    return delivery[delivery.find("/") + 1 :]


def split_delivery_id(delivery: str, partitions: int) -> tuple[int, str]:
    """``(partition, entry id)`` of a delivery id; ``ValueError`` when it
    does not name a partition of this docket."""
    if partitions == 1:
        return 0, delivery
    head, sep, entry_id = delivery.partition("/")
    if not sep or not head.isdigit() or not int(head) < partitions:
        raise ValueError(f"delivery id {delivery!r} names no partition of {partitions}")
    return int(head), entry_id
