from __future__ import annotations

import random

import pytest

from cproxy import placement
from cproxy.placement import RoundRobin, key_hash, murmur2, queue_for_key

# org.apache.kafka.common.utils.UtilsTest#testMurmur2, plus the empty input.
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
    b"": 275646681,
}


@pytest.mark.parametrize(("data", "expected"), KAFKA_VECTORS.items())
def test_murmur2_matches_kafka(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


def _int32(x: int) -> int:
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x >= 1 << 31 else x


def _java_murmur2(data: bytes) -> int:
    """A line-by-line port of Kafka's Java code, with Java's signed int and ``>>>``."""
    m, r = 0x5BD1E995, 24
    h = _int32(0x9747B28C ^ len(data))
    for i in range(len(data) // 4):
        k = data[4 * i] | data[4 * i + 1] << 8 | data[4 * i + 2] << 16 | data[4 * i + 3] << 24
        k = _int32(k * m)
        k = _int32(k ^ ((k & 0xFFFFFFFF) >> r))
        k = _int32(k * m)
        h = _int32(h * m)
        h = _int32(h ^ k)
    base, rest = len(data) & ~3, len(data) % 4
    if rest >= 3:
        h ^= data[base + 2] << 16
    if rest >= 2:
        h ^= data[base + 1] << 8
    if rest >= 1:
        h ^= data[base]
        h = _int32(h * m)
    h = _int32(h ^ ((h & 0xFFFFFFFF) >> 13))
    h = _int32(h * m)
    return _int32(h ^ ((h & 0xFFFFFFFF) >> 15))


def test_murmur2_matches_java_arithmetic_for_every_tail_length() -> None:
    rng = random.Random(7)
    for length in range(40):
        for _ in range(20):
            data = rng.randbytes(length)
            assert murmur2(data) == _java_murmur2(data), data


def test_queue_for_key_uses_kafka_to_positive() -> None:
    # Kafka masks the sign bit; abs() would pick a different queue for negative hashes.
    assert queue_for_key("foobar", 50) == 16
    h = KAFKA_VECTORS[b"21"]
    assert queue_for_key("21", 7) == (h & 0x7FFFFFFF) % 7 != abs(h) % 7


def test_queue_for_key_hashes_utf8() -> None:
    key = "Fahrt-ü-🚕"
    assert queue_for_key(key, 1024) == (murmur2(key.encode("utf-8")) & 0x7FFFFFFF) % 1024


def test_queue_for_key_is_in_range_and_spreads() -> None:
    hits = [queue_for_key(f"ride-{i}", 8) for i in range(8000)]
    assert set(hits) == set(range(8))
    assert min(hits.count(q) for q in range(8)) > 800


def test_queue_for_key_rejects_no_queues() -> None:
    with pytest.raises(ValueError):
        queue_for_key("k", 0)


def test_round_robin_cycles_per_topic() -> None:
    rr = RoundRobin()
    assert [rr.next("a", 3) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert [rr.next("b", 2) for _ in range(3)] == [0, 1, 0]
    assert rr.next("a", 3) == 1
    with pytest.raises(ValueError):
        rr.next("c", 0)


def test_key_hash_is_murmur2_of_the_utf8_key_made_positive() -> None:
    for key in ["", "a", "user-42", "caf\u00e9", "\U0001f600" * 3, "x" * 1000]:
        assert key_hash(key) == murmur2(key.encode("utf-8")) & 0x7FFFFFFF


def test_key_hash_caches_only_interpreted_and_stays_bounded() -> None:
    keys = [f"user-{i}" for i in range(placement._CACHED_KEYS + 5000)]
    for key in keys + keys[:100]:
        assert key_hash(key) == murmur2(key.encode("utf-8")) & 0x7FFFFFFF
    assert len(placement._KEY_HASHES) <= placement._CACHED_KEYS
    # Compiled, hashing is cheaper than the cache: nothing is kept.
    assert (len(placement._KEY_HASHES) > 0) == placement._INTERPRETED
