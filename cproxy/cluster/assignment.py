"""Which live member should own each queue: rendezvous hashing with bounded load.

A pure function of the queue set and the member set, so every proxy computes the same answer
from the same inputs without talking to the others. Each (queue, member) pair gets a score
from a stable hash (blake2b, never Python's salted ``hash()``); a queue prefers the members in
descending score order. Plain rendezvous hashing moves only the queues of a member that leaves
(and only about ``1/(m+1)`` of the queues to a member that joins), but with few queues it can
be uneven (4 queues on 3 members may put 3 on one). So each member takes
``floor(queues / members)`` queues, and ``queues % members`` of them one more: queues are
placed in a fixed order (by their best score, highest first), each on its most preferred
member that still has room. The result is even
(counts differ by at most one) and stays close to plain rendezvous hashing, which keeps
movement on a join or leave small (``tests/cluster/test_assignment.py`` measures both).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable

from cproxy.model import QueueRef


def score(ref: QueueRef, member: str) -> int:
    """The stable preference of ``ref`` for ``member`` (higher wins)."""
    topic, qid = ref
    digest = hashlib.blake2b(f"{topic}\x00{qid}\x00{member}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def assign(queues: Iterable[QueueRef], members: Collection[str]) -> dict[QueueRef, str]:
    """The member that should own each queue; empty when there are no members."""
    names = sorted(set(members))
    refs = sorted(set(queues))
    if not names:
        return {}
    # Each member takes ``base`` queues, and ``extra`` of them one more: exactly even.
    base, extra = divmod(len(refs), len(names))
    ranked = {ref: _preference(ref, names) for ref in refs}
    # Queues with the strongest first choice are placed first, so they get it.
    order = sorted(refs, key=lambda r: (score(r, ranked[r][0]), r), reverse=True)
    load = dict.fromkeys(names, 0)
    out: dict[QueueRef, str] = {}
    for ref in order:
        for member in ranked[ref]:
            if load[member] < base or (load[member] == base and extra > 0):
                if load[member] == base:
                    extra -= 1
                out[ref] = member
                load[member] += 1
                break
    return out


def _preference(ref: QueueRef, names: list[str]) -> list[str]:
    """Members in the order ``ref`` prefers them (ties, never expected, by name)."""
    return sorted(names, key=lambda m: (score(ref, m), m), reverse=True)


def owned_by(assignment: dict[QueueRef, str], member: str) -> set[QueueRef]:
    """The queues ``assignment`` gives to ``member``."""
    return {ref for ref, owner in assignment.items() if owner == member}
