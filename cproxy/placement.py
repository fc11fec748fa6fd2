"""Queue selection on produce: Kafka-compatible key hashing and round robin.

Keys are hashed with Kafka's murmur2 (``org.apache.kafka.common.utils.Utils.murmur2``) over
their UTF-8 bytes and mapped with Kafka's ``toPositive(hash) % partitions``, so a key lands on
the same queue number a Java Kafka producer would pick for the same partition count. Python's
``hash()`` is never used: it is salted per process.
"""

from __future__ import annotations

import struct
from typing import Final

__all__ = ["RoundRobin", "key_hash", "murmur2", "queue_for_key"]

_SEED: Final = 0x9747B28C
_M: Final = 0x5BD1E995
_MASK: Final = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 of ``data`` as a signed 32-bit int, bit-for-bit equal to Java's."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    blocks = length // 4
    # Unpacking all 4-byte little-endian blocks at once is much faster than per-byte indexing.
    for block in struct.unpack_from(f"<{blocks}I", data):
        k = (block * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = length & 3
    if tail:
        base = length - tail
        # Java's switch falls through from case 3 to case 1.
        if tail == 3:
            h ^= data[base + 2] << 16
        if tail >= 2:
            h ^= data[base + 1] << 8
        h ^= data[base]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


#: ``key_hash`` of recent keys; emptied whenever it reaches ``_CACHED_KEYS`` entries.
_KEY_HASHES: Final[dict[str, int]] = {}
_CACHED_KEYS: Final = 65536


def key_hash(key: str) -> int:
    """Kafka's ``toPositive(murmur2(key))``: ``key_hash(key) % queues`` is the key's queue.

    Cached because the same keys (ride ids, user ids) recur constantly on the produce path,
    which calls this once per message. A plain dict, emptied when full, rather than an
    ``lru_cache``: compiled, a hit is one dict lookup, with no call through the cache's
    wrapper and no recency list to update (an ``lru_cache`` was ~1.5 % of the server's CPU
    at batch 100)."""
    cached = _KEY_HASHES.get(key)
    if cached is not None:
        return cached
    if len(_KEY_HASHES) >= _CACHED_KEYS:
        _KEY_HASHES.clear()
    value = _KEY_HASHES[key] = murmur2(key.encode("utf-8")) & 0x7FFFFFFF
    return value


def queue_for_key(key: str, queues: int) -> int:
    """The queue for ``key`` among ``queues``, as Kafka's default partitioner computes it."""
    if queues < 1:
        raise ValueError(f"queues must be >= 1, got {queues}")
    return key_hash(key) % queues


class RoundRobin:
    """Per-topic round robin over queues, for messages with neither ``qid`` nor ``key``."""

    __slots__ = ("_counters",)

    def __init__(self) -> None:
        self._counters: dict[str, int] = {}

    def next(self, topic: str, queues: int) -> int:
        """The next queue for ``topic``; successive calls cycle through ``0..queues-1``."""
        if queues < 1:
            raise ValueError(f"queues must be >= 1, got {queues}")
        n = self._counters.get(topic, 0)
        self._counters[topic] = n + 1
        return n % queues
