"""The partition layout (``docket_core.sansio.partitions``): pure, and the
same on every process."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot as redis_key_slot

from docket_core.sansio.partitions import (
    SLOTS,
    delivery_id,
    key_slot,
    partition_of,
    partition_tags,
    split_delivery_id,
)

names = st.text(st.characters(blacklist_characters="{}", blacklist_categories=["Cs"]), max_size=20)


@given(st.text(st.characters(blacklist_categories=["Cs"]), max_size=40))
def test_key_slot_is_the_clusters(key: str) -> None:
    assert key_slot(key) == redis_key_slot(key.encode())


def test_one_partition_is_todays_layout() -> None:
    assert partition_tags("orders", 1) == ("{orders}",)
    assert partition_of("any-key", 1) == 0
    assert delivery_id(0, "1-0", 1) == "1-0"
    assert split_delivery_id("1-0", 1) == (0, "1-0")


@given(names, st.integers(min_value=2, max_value=16))
def test_each_partition_owns_its_share_of_the_slots(name: str, n: int) -> None:
    tags = partition_tags(name, n)
    assert len(set(tags)) == n
    for index, tag in enumerate(tags):
        assert tag.startswith("{" + name + "|") and tag.endswith("}")
        assert index * SLOTS // n <= key_slot(tag + ":q") < (index + 1) * SLOTS // n


def test_partition_tags_are_stable() -> None:
    # the layout is part of the stored data: it must never change between releases
    assert partition_tags("orders", 3) == ("{orders|0.1}", "{orders|1.0}", "{orders|2.0}")


@given(st.text(max_size=30), st.integers(min_value=1, max_value=16))
def test_a_key_always_goes_to_the_same_partition(key: str, n: int) -> None:
    assert partition_of(key, n) == partition_of(key, n)
    assert 0 <= partition_of(key, n) < n


def test_keys_spread_over_partitions() -> None:
    counts = [0, 0, 0]
    for i in range(3000):
        counts[partition_of(f"task-{i}", 3)] += 1
    assert all(900 < c < 1100 for c in counts), counts


@given(st.integers(min_value=0, max_value=7), st.from_regex(r"\d{1,13}-\d{1,3}", fullmatch=True))
def test_delivery_ids_round_trip(partition: int, entry: str) -> None:
    assert split_delivery_id(delivery_id(partition, entry, 8), 8) == (partition, entry)


@pytest.mark.parametrize("bad", ["1-0", "9/1-0", "x/1-0", "/1-0"])
def test_a_delivery_id_naming_no_partition_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="names no partition"):
        split_delivery_id(bad, 8)


def test_fewer_than_one_partition_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        partition_tags("orders", 0)
