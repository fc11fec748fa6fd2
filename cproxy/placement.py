# cproxy: compiled (mypyc), see cproxy/_native.py
"""Queue selection on produce: Kafka-compatible key hashing and round robin.

Keys are hashed with Kafka's murmur2 (``org.apache.kafka.common.utils.Utils.murmur2``) over
their UTF-8 bytes and mapped with Kafka's ``toPositive(hash) % partitions``, so a key lands on
the same queue number a Java Kafka producer would pick for the same partition count. Python's
``hash()`` is never used: it is salted per process.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Final

from mypy_extensions import i64

from cproxy import _native
from cproxy.errors import InvalidRequest
from cproxy.model import NewMessage

__all__ = ["RoundRobin", "key_hash", "murmur2", "place", "queue_for_key"]

_SEED: Final = 0x9747B28C
_M: Final = 0x5BD1E995
_MASK: Final = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 of ``data`` as a signed 32-bit int, bit-for-bit equal to Java's.

    ``i64`` locals: compiled, they are machine integers (a plain ``int`` operand of 2**30 or
    more sends a multiplication through Python's long arithmetic, ~15x slower). No product
    leaves 64 bits: each factor is masked to 32 bits and ``_M`` is below 2**31."""
    length: i64 = len(data)
    h: i64 = (_SEED ^ length) & _MASK
    tail: i64 = length & 3
    end: i64 = length - tail
    i: i64 = 0
    while i < end:  # 4-byte little-endian blocks
        k: i64 = data[i] | data[i + 1] << 8 | data[i + 2] << 16 | data[i + 3] << 24
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
        i += 4
    if tail:
        # Java's switch falls through from case 3 to case 1.
        if tail == 3:
            h ^= data[end + 2] << 16
        if tail >= 2:
            h ^= data[end + 1] << 8
        h ^= data[end]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return int(h - (1 << 32) if h & 0x80000000 else h)


#: Whether the hot path runs interpreted in this process (no C compiler at install, or
#: ``CPROXY_PURE_PYTHON`` set): ``cproxy._native`` decides it once, for all of its modules.
#: The one branch of the compiled core on how it runs, kept because the best ``key_hash``
#: differs by a factor of 20 (1,000 keys: interpreted, 1.2 ms computed, 63 µs from the cache;
#: compiled, the cache only adds CPU-cache misses).
_INTERPRETED: Final = _native.status() != "compiled"
#: ``key_hash`` of recent keys, interpreted only; emptied when it reaches ``_CACHED_KEYS``.
_KEY_HASHES: Final[dict[str, int]] = {}
_CACHED_KEYS: Final = 65536


def key_hash(key: str) -> int:
    """Kafka's ``toPositive(murmur2(key))``: ``key_hash(key) % queues`` is the key's queue.

    The produce path calls it once per message. Compiled, murmur2 of a short key costs less
    than a lookup in a cache of recent keys (a dict of ~10k keys misses the CPU caches: ~2 %
    of the server's CPU at batch 100), so it is computed every time. Interpreted, murmur2
    costs ~1.7 µs a key and the cache (a plain dict, emptied when full) pays for itself."""
    if not _INTERPRETED:
        return murmur2(key.encode("utf-8")) & 0x7FFFFFFF
    cached = _KEY_HASHES.get(key)
    if cached is not None:
        return cached
    if len(_KEY_HASHES) >= _CACHED_KEYS:
        _KEY_HASHES.clear()
    value = _KEY_HASHES[key] = murmur2(key.encode("utf-8")) & 0x7FFFFFFF
    return value


def place(topic: str, queues: int, messages: Sequence[NewMessage], rr: Iterator[int]) -> None:
    """Give each message without a ``qid`` one, in place: by key, else the next of ``rr``
    (the topic's round robin). ``queues`` >= 1. Here rather than in the topic catalogue
    (``cproxy.broker.topics``, async store I/O, not compiled): it runs once per produced
    message."""
    for i, m in enumerate(messages):
        qid, key = m.qid, m.key
        if qid is not None:
            if not 0 <= qid < queues:
                raise InvalidRequest(
                    f"messages[{i}].qid {qid} is out of range: topic {topic!r} has "
                    f"queues 0..{queues - 1}"
                )
        elif key is not None:
            m.qid = key_hash(key) % queues  # as queue_for_key, one call fewer
        else:
            m.qid = next(rr) % queues


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
