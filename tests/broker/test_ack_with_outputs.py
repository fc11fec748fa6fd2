"""The ack with outputs (``Broker.ack_with_outputs``, guarantee 10) over the memory store."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import anyio
import orjson
import pytest

from cproxy.broker import Output
from cproxy.broker.broker import Broker
from cproxy.engine.records import Result
from cproxy.engine.snapshots import Handout
from cproxy.errors import InvalidRequest, QueueNotOwned, StaleResults, StoreError
from cproxy.model import AppendResult, MessageRef, NewMessage, QueueProgress, QueueRef
from cproxy.store.memory import MemoryStore
from tests.broker.test_broker import SETTINGS, config, items, running
from tests.engine.harness import fenced_acks


def outputs(*bodies: int) -> list[Output]:
    return [Output("out", [NewMessage(None, orjson.dumps(b)) for b in bodies])]


async def prepared(broker: Broker, keys: str = "ab", **group: object) -> list[Handout]:
    await broker.create_topic("t", 1)
    await broker.create_topic("out", 1)
    await broker.put_group("g", config(**group))
    await broker.produce("t", items(*keys))
    return (await broker.pull("g", 10, 1000, None, [])).deliveries


async def test_results_and_outputs_are_durable_when_it_returns() -> None:
    store = MemoryStore()
    async with running(store) as broker:
        a, _b = await prepared(broker)
        await broker.put_group("reader", config(topics={"out": {"order_by": "none"}}))
        outcome, stored = await broker.ack_with_outputs("g", fenced_acks(a), outputs(1, 2))
        assert (outcome.applied, outcome.unknown) == (1, [])
        assert [(r.qid, r.offset, r.duplicate) for r in stored[0]] == [(0, 0, False), (0, 1, False)]
        # Durable before the answer: the stored progress already says a is finished.
        persisted = (await store.load_progress("g"))["t", 0]
        assert persisted.open == ((1, 2),)
        assert [m.body_json for m in await store.read("out", 0, 0, 10)] == [b"1", b"2"]
        # Outputs reach groups that read them, as produced messages do.
        got = await broker.pull("reader", 10, 1000, None, [])
        assert [d.message.body_json for d in got.deliveries] == [b"1", b"2"]


async def test_a_stale_result_applies_and_stores_nothing() -> None:
    store = MemoryStore()
    async with running(store) as broker:
        a, b = await prepared(broker)
        late = Result("t", 0, acks=[b.message.offset], attempts={b.message.offset: 7})
        with pytest.raises(StaleResults) as caught:
            await broker.ack_with_outputs("g", [*fenced_acks(a), late], outputs(1))
        assert caught.value.refs == [("t", 0, b.message.offset)]
        assert await store.read("out", 0, 0, 10) == []
        # a is still in flight: its own ack applies.
        assert broker.ack("g", fenced_acks(a)).applied == 1


async def test_the_same_call_twice_stores_once() -> None:
    store = MemoryStore()
    async with running(store) as broker:
        a, _ = await prepared(broker)
        await broker.ack_with_outputs("g", fenced_acks(a), outputs(1))
        with pytest.raises(StaleResults):
            await broker.ack_with_outputs("g", fenced_acks(a), outputs(1))
        assert len(await store.read("out", 0, 0, 10)) == 1


async def test_every_result_must_name_its_attempt() -> None:
    async with running(MemoryStore()) as broker:
        a, _ = await prepared(broker)
        plain = Result("t", 0, acks=[a.message.offset])
        with pytest.raises(InvalidRequest, match="attempt"):
            await broker.ack_with_outputs("g", [plain], outputs(1))


class SlowStore(MemoryStore):
    """``commit_with_outputs`` waits for ``go`` and then fails if ``fail`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.writing = anyio.Event()
        self.go = anyio.Event()
        self.fail = False

    async def commit_with_outputs(
        self,
        group: str,
        progress: Mapping[QueueRef, QueueProgress],
        outputs: Sequence[tuple[str, Sequence[NewMessage]]],
        now_ms: int,
        dedup_window_ms: int,
        redrive_done: Sequence[MessageRef] = (),
    ) -> list[list[AppendResult]]:
        self.writing.set()
        await self.go.wait()
        if self.fail:
            raise StoreError("injected failure")
        return await super().commit_with_outputs(group, progress, outputs, now_ms, dedup_window_ms)


@pytest.mark.parametrize("fail", [False, True], ids=["commits", "fails"])
async def test_deliveries_are_guarded_while_the_transaction_runs(fail: bool) -> None:
    store = SlowStore()
    store.fail = fail
    async with running(store) as broker:
        (a,) = await prepared(broker, "aa", ack_timeout_ms=100, retry_backoff_ms=[10])
        answer: list[object] = []

        async def call() -> None:
            try:
                answer.append(await broker.ack_with_outputs("g", fenced_acks(a), outputs(1)))
            except StoreError as exc:
                answer.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            with anyio.fail_after(5):
                await store.writing.wait()
            # Meanwhile: no other result or extend reaches it, and it does not time out.
            assert broker.ack("g", fenced_acks(a)).unknown == [a.message.ref]
            assert broker.extend("g", [a.message.ref], 1000).unknown == [a.message.ref]
            await anyio.sleep(0.3)  # three ack timeouts
            assert broker._runner("g").stats().in_flight == 1
            got = await broker.pull("g", 10, 0, None, [])
            assert got.deliveries == []  # not redelivered, and a's next message still waits
            store.go.set()
        if fail:
            assert isinstance(answer[0], StoreError)
            assert await store.read("out", 0, 0, 10) == []
            # Back in flight as it was: its deadline long passed, so it is delivered again.
            with anyio.fail_after(5):
                again = await broker.pull("g", 10, 2000, None, [])
            assert [(d.message.ref, d.attempt) for d in again.deliveries] == [
                (a.message.ref, a.attempt + 1)
            ]
        else:
            assert not isinstance(answer[0], Exception)
            assert len(await store.read("out", 0, 0, 10)) == 1
            with anyio.fail_after(5):
                nxt = await broker.pull("g", 10, 2000, None, [])
            assert [(d.message.offset, d.attempt) for d in nxt.deliveries] == [(1, 1)]


class CountingStore(SlowStore):
    """``SlowStore`` that counts transactions and may raise ``lose`` instead of writing."""

    def __init__(self) -> None:
        super().__init__()
        self.transactions: list[int] = []  # outputs per transaction
        self.lose: QueueNotOwned | None = None

    async def commit_with_outputs(
        self,
        group: str,
        progress: Mapping[QueueRef, QueueProgress],
        outputs: Sequence[tuple[str, Sequence[NewMessage]]],
        now_ms: int,
        dedup_window_ms: int,
        redrive_done: Sequence[MessageRef] = (),
    ) -> list[list[AppendResult]]:
        self.transactions.append(len(outputs))
        if self.lose is not None:
            raise self.lose
        return await super().commit_with_outputs(group, progress, outputs, now_ms, dedup_window_ms)


async def test_calls_arriving_during_a_transaction_share_the_next_one() -> None:
    store = CountingStore()
    async with running(store) as broker:
        first, *others = await prepared(broker, "abcd")
        answers: dict[int, object] = {}

        async def call(d: Handout) -> None:
            answers[d.message.offset] = await broker.ack_with_outputs(
                "g", fenced_acks(d), outputs(d.message.offset)
            )

        async with anyio.create_task_group() as tg:
            tg.start_soon(call, first)
            with anyio.fail_after(5):
                await store.writing.wait()
            for d in others:
                tg.start_soon(call, d)
            await anyio.sleep(0.05)  # all three are held and waiting
            store.go.set()
        assert store.transactions == [1, 3]
        assert sorted(answers) == [0, 1, 2, 3]
        bodies = [m.body_json for m in await store.read("out", 0, 0, 10)]
        assert sorted(bodies) == [b"0", b"1", b"2", b"3"]
        assert (await store.load_progress("g"))["t", 0].committed == 4


async def test_a_lost_queue_refuses_its_calls_and_stores_nothing() -> None:
    store = CountingStore()
    store.go.set()
    async with running(store) as broker:
        await broker.create_topic("t", 2)
        await broker.create_topic("out", 1)
        await broker.put_group("g", config())
        await broker.produce("t", [NewMessage("a", b"1", qid=0), NewMessage("b", b"2", qid=1)])
        on0, on1 = sorted(
            (await broker.pull("g", 10, 1000, None, [])).deliveries, key=lambda d: d.message.qid
        )
        store.lose = QueueNotOwned("lost", [("t", 0)])
        with pytest.raises(StaleResults) as caught:
            await broker.ack_with_outputs("g", fenced_acks(on0), outputs(1))
        assert caught.value.refs == [on0.message.ref]
        with pytest.raises(StoreError):  # its queue is not lost: retry may succeed
            await broker.ack_with_outputs("g", fenced_acks(on1), outputs(1))
        assert await store.read("out", 0, 0, 10) == []
        store.lose = None
        outcome, _ = await broker.ack_with_outputs("g", fenced_acks(on1), outputs(1))
        assert outcome.applied == 1


async def test_a_redriven_dead_letter_is_finished_in_the_same_transaction() -> None:
    store = MemoryStore()
    # Commits only when kicked (a dead letter is): none deletes the redrive meanwhile.
    async with running(store, replace(SETTINGS, commit_interval_ms=600_000)) as broker:
        (a,) = await prepared(broker, "a", max_attempts=1)
        fail = Result("t", 0, fails=[(a.message.offset, "boom")], attempts={0: a.attempt})
        assert broker.ack("g", [fail]).applied == 1
        with anyio.fail_after(5):
            while await store.count_dead_letters("g") == 0:
                await anyio.sleep(0.01)
        await broker.operator.redrive("g", None)
        again = (await broker.pull("g", 10, 2000, None, [])).deliveries
        assert [d.message.ref for d in again] == [a.message.ref]
        await broker.ack_with_outputs("g", fenced_acks(*again), outputs(1))
        # Deleted with the outputs, not at the next commit: a crash now redrives nothing.
        assert await store.load_redriving("g") == []


class AmbiguousStore(MemoryStore):
    """``commit_with_outputs`` commits, then reports a failure (a connection lost during the
    COMMIT); ``load_progress`` fails while ``down`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.ambiguous = True
        self.down = False

    async def commit_with_outputs(
        self,
        group: str,
        progress: Mapping[QueueRef, QueueProgress],
        outputs: Sequence[tuple[str, Sequence[NewMessage]]],
        now_ms: int,
        dedup_window_ms: int,
        redrive_done: Sequence[MessageRef] = (),
    ) -> list[list[AppendResult]]:
        stored = await super().commit_with_outputs(
            group, progress, outputs, now_ms, dedup_window_ms, redrive_done
        )
        if self.ambiguous:
            raise StoreError("connection lost during COMMIT")
        return stored

    async def load_progress(self, group: str) -> dict[QueueRef, QueueProgress]:
        if self.down:
            raise StoreError("down")
        return await super().load_progress(group)


@pytest.mark.parametrize("down", [False, True], ids=["readable", "down-then-back"])
async def test_a_commit_reported_failed_that_happened_is_never_repeated(down: bool) -> None:
    store = AmbiguousStore()
    async with running(store) as broker:
        a, b = await prepared(broker)
        store.down = down
        with pytest.raises(StoreError):
            await broker.ack_with_outputs("g", fenced_acks(a), outputs(1))
        # The repeat is refused: the first may have committed (it did).
        with pytest.raises(StaleResults):
            await broker.ack_with_outputs("g", fenced_acks(a), outputs(1))
        if down:
            # Meanwhile no other progress is written over it, and other calls wait too.
            with pytest.raises(StoreError):
                await broker.ack_with_outputs("g", fenced_acks(b), outputs(2))
            store.down = False
            await broker._runner("g").commit()  # the committer finds out first
        assert len(await store.read("out", 0, 0, 10)) == 1
        persisted = (await store.load_progress("g"))["t", 0]
        assert persisted.open == ((1, 2),)  # a is finished, b not
        assert broker._runner("g").stats().in_flight == 1  # a was applied, not put back
        store.ambiguous = False
        outcome, _ = await broker.ack_with_outputs("g", fenced_acks(b), outputs(2))
        assert outcome.applied == 1
        assert len(await store.read("out", 0, 0, 10)) == 2
