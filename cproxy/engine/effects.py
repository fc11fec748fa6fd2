# cproxy: compiled (mypyc), see cproxy/_native.py
"""What an engine call made due for its driver: a bit-set of wake-ups.

The engine changes state; the driver (``cproxy.broker.runner``) runs the loops that react to
it (hand ready work to waiting pulls, read the store, persist, fire timers). Every verb that
changes state ORs here what its change made due, once per call (never per message), and the
driver takes the bits after its calls (``GroupEngine.take_effects``) and wakes its loops from
one place. An int rather than an object: it costs no allocation on the hot path.
"""

from __future__ import annotations

from typing import Final

#: Work may be ready to hand out: waiting pulls should be served.
READY: Final = 1
#: Reads may be due (new messages, freed buffer space, a reload, a moved position).
FETCH: Final = 2
#: Something should be persisted now, not at the next interval (dead letters, delivery
#: numbers to reserve, a retention skip).
COMMIT: Final = 4
#: New deadlines (ack timeouts, retries): the timer may have to wake earlier.
DEADLINE: Final = 8
