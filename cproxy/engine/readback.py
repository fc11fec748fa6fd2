# cproxy: compiled (mypyc), see cproxy/_native.py
"""Reading back below a queue's fetch position: the restore and the scan after a restart,
and the reload of a parked chain (``cproxy.engine.reader`` plans these reads and hands back
what they found to the methods here).

``ReadBack`` is a collaborator of ``Reader``, built with what it reads and writes (the
sequencer, the tally, the buffer bound, the group's screen and order values): it runs only
after a restart or when a parked chain runs dry, never for new messages.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from cproxy.engine.cursor import FetchRequest, QueueCursor
from cproxy.engine.sequencer import Sequencer
from cproxy.engine.work import Entry, Tally
from cproxy.model import Record


class ReadBack:
    """Take-in of restore, scan and reload reads. ``screen(message, first_read)`` gives the
    entry to hold for a message read again (None: not held); ``extract`` its order value."""

    def __init__(
        self,
        seq: Sequencer,
        tally: Tally,
        max_buffered: int,
        screen: Callable[[Record, bool], Entry | None],
        extract: Callable[[Record], str | None],
    ) -> None:
        self._seq = seq
        self._tally = tally
        self._max_buffered = max_buffered
        self._screen = screen
        self._extract = extract

    def reload_failed(self, request: FetchRequest, cur: QueueCursor | None) -> None:
        """The reload ``request`` (of queue cursor ``cur``, None if no longer served)
        failed: it is planned again."""
        assert request.chain_value is not None
        chain = self._seq.chain(request.topic, request.chain_value)
        if chain is None:
            return
        if cur is not None and cur.epoch == request.epoch:
            chain.note_parked(request.qid, request.from_offset)
            self._seq.reload_done(chain, request.qid)
        else:
            self._seq.reload_done(chain, None)

    def take_restore(
        self, request: FetchRequest, cur: QueueCursor, messages: Sequence[Record]
    ) -> None:
        if not cur.restore or cur.restore[0][0] != request.from_offset:
            return  # stale
        start, end = cur.restore[0]
        for message in messages:
            if message.offset >= end or self._tally.held >= self._max_buffered:
                break
            entry = self._screen(message, False)
            if entry is not None:
                cur.renumber(entry)
                self._seq.admit(entry, self._extract(message))
            start = message.offset + 1
        if len(messages) < request.max_count:
            start = end  # the store has no more of the range (retention deleted it)
        if start >= end:
            cur.restore.pop(0)
        else:
            cur.restore[0] = (start, end)

    def take_scan(
        self, request: FetchRequest, cur: QueueCursor, messages: Sequence[Record]
    ) -> None:
        if not cur.scan or cur.scan_from != request.from_offset:
            return  # stale
        position = request.upto if len(messages) < request.max_count else request.from_offset
        for message in messages:
            offset = message.offset
            if offset >= request.upto:
                position = request.upto
                break
            value = self._extract(message)
            first = cur.scan.get(value) if value is not None else None
            if first is not None and offset >= first:
                if self._tally.held >= self._max_buffered:
                    # No room: every chain still to read waits parked from here on.
                    for v, f in cur.scan.items():
                        self._seq.restore_parked(cur.topic, v, cur.qid, max(f, offset))
                    cur.scan.clear()
                    return
                entry = self._screen(message, False)
                if entry is not None:
                    cur.renumber(entry)
                    self._seq.admit(entry, value)
            position = offset + 1
        cur.scan_from = max(cur.scan_from, position)
        if cur.scan_from >= request.upto:
            cur.scan.clear()

    def take_reload(
        self, request: FetchRequest, cur: QueueCursor | None, messages: Sequence[Record]
    ) -> None:
        assert request.chain_value is not None
        chain = self._seq.chain(request.topic, request.chain_value)
        if chain is None:
            return
        if cur is None or cur.epoch != request.epoch:
            self._seq.reload_done(chain, None)
            return  # a seek dropped this queue's parked state meanwhile
        # Where the scan stopped: a full read may have more behind it; a short one reached
        # the end of what the store holds below ``upto``.
        scanned_to = messages[-1].offset + 1 if len(messages) >= request.max_count else request.upto
        for message in messages:
            offset = message.offset
            if offset >= request.upto:
                scanned_to = request.upto
                break
            if self._extract(message) != chain.value or cur.is_finished(offset):
                continue
            if self._tally.held >= self._max_buffered:
                scanned_to = offset  # no room: the rest of the chain stays parked
                break
            entry = self._screen(message, False)
            if entry is not None:
                cur.renumber(entry, chain.attempt_floor)
                self._seq.admit_reloaded(entry, chain)
        scanned_to = min(scanned_to, request.upto)
        if scanned_to < request.upto:
            chain.note_parked(request.qid, scanned_to)
        self._seq.reload_done(chain, request.qid)
