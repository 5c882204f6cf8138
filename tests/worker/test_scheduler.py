"""The token-budget scheduler (round robin across requests, FCFS within), with a recording runner in
place of the engine (no torch)."""

import asyncio
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kembed.worker.errors import InvalidInput, Overloaded
from kembed.worker.scheduling.groups import RequestGroup
from kembed.worker.scheduling.queues import ClassPolicy, Priority, RoundRobin
from kembed.worker.scheduling.scheduler import Scheduler, SchedulerHooks


class _Done:
    def __init__(self, rows: np.ndarray, gate: threading.Event | None = None) -> None:
        self._rows = rows
        self._gate = gate

    def wait(self) -> np.ndarray:
        if self._gate is not None:
            assert self._gate.wait(10), "test gate never opened"
        return self._rows


class RecordingRunner:
    """Row i of a batch is [first id, length, batch number]: checkable against what was sent."""

    def __init__(self, gated: bool = False, fail_batches: tuple[int, ...] = ()) -> None:
        self.batches: list[list[int]] = []  # lengths of each launched batch
        self.gates: list[threading.Event] = []
        self.gated = gated
        self.fail_batches = fail_batches
        self.launched = threading.Event()

    def pack(self, token_ids, lengths):
        return token_ids.copy(), lengths.copy()

    def step(self, packed):
        token_ids, lengths = packed
        number = len(self.batches)
        self.batches.append(lengths.tolist())
        self.launched.set()
        if number in self.fail_batches:
            raise RuntimeError(f"batch {number} exploded")
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        rows = np.stack(
            [
                token_ids[starts].astype(np.float32),
                lengths.astype(np.float32),
                np.full(len(lengths), number, np.float32),
            ],
            axis=1,
        )
        gate = threading.Event() if self.gated else None
        if gate is not None:
            self.gates.append(gate)
        return _Done(rows, gate)

    def can_launch_inline(self, packed) -> bool:
        return False  # as an engine without CUDA graphs: every step goes through the launcher thread

    def capture_deferred(self, max_seconds: float) -> int:
        return 0  # nothing to capture


def ragged(*lengths: int, first: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Sequences whose ids all equal their global index (first, first+1, ...), so rows identify them."""
    ids = np.concatenate([np.full(n, first + i, np.int32) for i, n in enumerate(lengths)])
    return ids, np.array(lengths, np.int32)


@pytest.fixture
async def make_scheduler():
    made: list[Scheduler] = []

    def make(runner, **kwargs) -> Scheduler:
        kwargs.setdefault("max_batch_tokens", 10)
        kwargs.setdefault("max_queued_tokens", 100)
        scheduler = Scheduler(runner, **kwargs)
        scheduler.start()
        made.append(scheduler)
        return scheduler

    yield make
    for scheduler in made:
        await scheduler.close()


async def test_sequences_fill_batches_in_arrival_order_under_the_token_budget(make_scheduler):
    runner = RecordingRunner()
    scheduler = make_scheduler(runner, max_batch_tokens=10, max_inflight_batches=1)
    rows = await scheduler.submit(*ragged(4, 4, 4, 3, 9, 1))
    # 4+4 fits, +4 would pass 10; 4+3 fits, +9 would not; 9+1 fits exactly.
    assert runner.batches == [[4, 4], [4, 3], [9, 1]]
    assert rows[:, 0].tolist() == [0, 1, 2, 3, 4, 5]  # answered in request order
    assert rows[:, 1].tolist() == [4, 4, 4, 3, 9, 1]
    assert scheduler.queued_tokens == 0


async def test_a_sequence_longer_than_the_budget_runs_alone(make_scheduler):
    runner = RecordingRunner()
    scheduler = make_scheduler(runner, max_batch_tokens=10, max_inflight_batches=1)
    rows = await scheduler.submit(*ragged(2, 25, 2))
    assert runner.batches == [[2], [25], [2]]
    assert rows[:, 1].tolist() == [2, 25, 2]


async def test_concurrent_requests_are_answered_with_their_own_rows(make_scheduler):
    runner = RecordingRunner()
    scheduler = make_scheduler(runner, max_batch_tokens=7, max_queued_tokens=1000)
    requests = [ragged(*(1 + (r + i) % 5 for i in range(r % 4 + 1)), first=100 * r) for r in range(20)]
    results = await asyncio.gather(*(scheduler.submit(ids, lengths) for ids, lengths in requests))
    for (ids, lengths), rows in zip(requests, results, strict=True):
        assert rows[:, 1].tolist() == lengths.tolist()
        assert rows[:, 0].tolist() == [ids[0] + i for i in range(len(lengths))]
    assert all(sum(batch) <= 7 for batch in runner.batches)


async def test_admission_past_the_queue_cap_is_refused_at_once(make_scheduler):
    runner = RecordingRunner(gated=True)
    scheduler = make_scheduler(runner, max_batch_tokens=10, max_queued_tokens=20, max_inflight_batches=1)
    first = asyncio.create_task(scheduler.submit(*ragged(10, 5)))
    await asyncio.to_thread(runner.launched.wait, 5)
    assert scheduler.queued_tokens == 15
    with pytest.raises(Overloaded, match="queue full"):
        await scheduler.submit(*ragged(6))
    fits = asyncio.create_task(scheduler.submit(*ragged(5)))
    await asyncio.sleep(0)
    for _ in range(3):  # open every gate as its batch appears
        await asyncio.to_thread(lambda: [g.set() for g in runner.gates])
        await asyncio.sleep(0.01)
    await asyncio.wait_for(asyncio.gather(first, fits), 5)
    assert scheduler.queued_tokens == 0


async def test_a_request_larger_than_the_queue_cap_is_invalid_not_overload(make_scheduler):
    scheduler = make_scheduler(RecordingRunner(), max_batch_tokens=10, max_queued_tokens=20)
    with pytest.raises(InvalidInput, match="max_queued_tokens"):
        await scheduler.submit(*ragged(15, 15))


async def test_batch_n_plus_1_launches_while_batch_n_is_still_running(make_scheduler):
    runner = RecordingRunner(gated=True)
    scheduler = make_scheduler(runner, max_batch_tokens=4, max_inflight_batches=2)
    task = asyncio.create_task(scheduler.submit(*ragged(4, 4, 4)))
    for _ in range(100):
        if len(runner.batches) >= 2:
            break
        await asyncio.sleep(0.01)
    # Two batches launched, none collected: the second was packed and launched during the first.
    assert len(runner.batches) == 2 and not any(g.is_set() for g in runner.gates)
    while not task.done():
        for gate in list(runner.gates):
            gate.set()
        await asyncio.sleep(0.01)
    assert (await task)[:, 1].tolist() == [4, 4, 4]
    assert len(runner.batches) == 3


async def test_a_failed_batch_fails_its_requests_and_the_scheduler_keeps_serving(make_scheduler):
    runner = RecordingRunner(fail_batches=(0,))
    scheduler = make_scheduler(runner, max_batch_tokens=10, max_inflight_batches=1)
    with pytest.raises(RuntimeError, match="exploded"):
        await scheduler.submit(*ragged(3))
    rows = await scheduler.submit(*ragged(3))
    assert rows[:, 1].tolist() == [3]
    assert scheduler.queued_tokens == 0


async def test_a_batch_whose_rows_never_arrive_fails_its_requests_and_not_the_next(make_scheduler):
    class _Lost:
        def wait(self) -> np.ndarray:
            raise RuntimeError("device lost the batch")

    class FirstWaitFails(RecordingRunner):
        def step(self, packed):
            done = super().step(packed)
            return _Lost() if len(self.batches) == 1 else done

    runner = FirstWaitFails()
    scheduler = make_scheduler(runner, max_batch_tokens=10, max_inflight_batches=1)
    with pytest.raises(RuntimeError, match="lost the batch"):
        await scheduler.submit(*ragged(3))
    assert (await scheduler.submit(*ragged(2)))[:, 1].tolist() == [2]
    assert scheduler.queued_tokens == 0


async def test_a_cancelled_request_gives_back_its_tokens_and_its_sequences_are_skipped(make_scheduler):
    runner = RecordingRunner(gated=True)
    scheduler = make_scheduler(runner, max_batch_tokens=5, max_inflight_batches=1)
    blocker = asyncio.create_task(scheduler.submit(*ragged(5)))
    await asyncio.to_thread(runner.launched.wait, 5)
    victim = asyncio.create_task(scheduler.submit(*ragged(5, 5, 5, first=10)))
    await asyncio.sleep(0.01)
    assert scheduler.queued_tokens == 20
    victim.cancel()
    await asyncio.gather(victim, return_exceptions=True)
    assert scheduler.queued_tokens == 5
    runner.gates[0].set()
    await blocker
    survivor = asyncio.create_task(scheduler.submit(*ragged(2, first=50)))
    while not survivor.done():
        for gate in list(runner.gates):
            gate.set()
        await asyncio.sleep(0.01)
    assert (await survivor)[:, 0].tolist() == [50]
    assert runner.batches == [[5], [2]]  # the cancelled request's sequences never ran


async def test_a_batch_never_holds_more_sequences_than_the_cap(make_scheduler):
    runner = RecordingRunner()
    scheduler = make_scheduler(runner, max_batch_tokens=100, max_inflight_batches=1, max_batch_sequences=4)
    rows = await scheduler.submit(*ragged(*[1] * 10))
    assert runner.batches == [[1] * 4, [1] * 4, [1] * 2]
    assert rows[:, 0].tolist() == list(range(10))


async def test_the_batch_stages_split_the_batch_time_where_the_time_is_spent(make_scheduler):
    """pack on the loop, step on the launcher thread, wait on the waiter: each slow part shows up in
    its own stage, and the four add up to the batch time."""

    class SlowRunner(RecordingRunner):
        def pack(self, token_ids, lengths):
            time.sleep(0.02)
            return super().pack(token_ids, lengths)

        def step(self, packed):
            time.sleep(0.04)
            done = super().step(packed)
            original = done.wait

            def wait():
                time.sleep(0.06)
                return original()

            done.wait = wait
            return done

    stages, totals = [], []
    hooks = SchedulerHooks(batch_stages=lambda *s: stages.append(s), batch_finished=totals.append)
    scheduler = make_scheduler(SlowRunner(), hooks=hooks)
    await scheduler.submit(*ragged(3, 4))
    [(pack, launch, device, resume)] = stages
    # each sleep is in its own stage (a misplaced one would leave its stage short), and the stages
    # partition the batch time
    assert pack >= 0.02 and launch >= 0.04 and device >= 0.06 and resume >= 0
    assert sum(stages[0]) == pytest.approx(totals[0], abs=1e-6)


async def test_a_small_request_behind_a_large_one_gets_a_place_in_the_next_batch(make_scheduler):
    """Round robin across requests (of one class: the classes off): a one-query request arriving
    behind 40 sequences of another waits for the batch in flight, not for all 40 (first come, first
    served would run it 11th)."""
    runner = RecordingRunner(gated=True)
    scheduler = make_scheduler(
        runner,
        max_batch_tokens=16,
        max_inflight_batches=1,
        max_queued_tokens=1000,
        policy=ClassPolicy(is_enabled=False),
    )
    bulk = asyncio.create_task(scheduler.submit(*ragged(*[4] * 40)))
    await asyncio.to_thread(runner.launched.wait, 5)  # the first batch of 4 is on the "device"
    query = asyncio.create_task(scheduler.submit(*ragged(3, first=1000)))
    await asyncio.sleep(0.01)
    while not query.done():
        for gate in list(runner.gates):
            gate.set()
        await asyncio.sleep(0.001)
    assert (await query)[0, 2] == 1  # the query's row came from batch 1, the next one
    # turns: bulk, query, bulk, bulk (round robin, oldest first); a batch holds each group's run
    assert runner.batches[1] == [4, 4, 4, 3]
    for gate in runner.gates:
        gate.set()
    while not bulk.done():
        for gate in list(runner.gates):
            gate.set()
        await asyncio.sleep(0.001)
    assert (await bulk)[:, 0].tolist() == list(range(40))


class _Ignored:
    """A sink for groups whose answers no test reads."""

    def answered(self, group, requests) -> None:
        pass

    def failed(self, group, requests, error) -> None:
        pass


def _queued(lengths: list[int], first: int) -> RequestGroup:
    """One request of these sequences, as a group of its own (a unary call's)."""
    lengths = np.array(lengths, np.int32)
    return RequestGroup(
        np.zeros(int(lengths.sum()), np.int32), lengths, np.array([len(lengths)]), _Ignored(),
        priority=Priority.INTERACTIVE, admitted_at=first,
    )  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    requests=st.lists(st.lists(st.integers(1, 12), min_size=1, max_size=8), min_size=1, max_size=12),
    arrivals=st.lists(st.integers(0, 12), min_size=12, max_size=12),
    cancelled=st.sets(st.integers(0, 11), max_size=3),
    max_tokens=st.integers(1, 24),
    max_sequences=st.integers(1, 6),
)
def test_round_robin_properties(requests, arrivals, cancelled, max_tokens, max_sequences):
    """Requests arrive between batches (after `arrivals[i]` batches); some are cancelled. Then:
    every sequence of a live request is taken exactly once, a request's in order; a batch keeps the
    budget and the cap (one over-long sequence alone); within a batch, an older request never gets
    fewer sequences than a younger one unless it has none left, nor more than one more unless the
    younger has none left; a
    request waiting at a batch's start is left out only if the batch is full (no starvation: each
    batch serves the oldest waiting request)."""
    queue = RoundRobin()
    made = [_queued(lengths, i) for i, lengths in enumerate(requests)]
    for i in cancelled & set(range(len(made))):
        made[i].finish(np.array([0]))
    pending = sorted(range(len(made)), key=lambda i: (arrivals[i], i))
    taken: dict[int, list[int]] = {i: [] for i in range(len(made))}
    num_batches = 0
    while pending or queue:
        while pending and arrivals[pending[0]] <= num_batches:
            queue.push(made[pending.pop(0)])
        waiting = [r for r in queue._waiting if r.num_waiting]  # oldest first, as the queue holds them
        remaining = {id(r): r.num_waiting for r in waiting}
        next_length = {id(r): int(r.next_lengths(1)[0]) for r in waiting}
        batch = queue.take(max_tokens, max_sequences)
        num_batches += 1
        if not waiting:
            assert batch == []
            continue
        assert batch, "a batch with requests waiting took nothing"
        tokens = [int(n) for seg in batch for n in seg.group.lengths[seg.seqs]]
        assert len(tokens) <= max_sequences
        assert sum(tokens) <= max_tokens or len(tokens) == 1
        assert all(seg.num_tokens == int(seg.group.lengths[seg.seqs].sum()) for seg in batch)
        counts = [sum(len(seg.seqs) for seg in batch if seg.group is r) for r in waiting]
        assert counts[0] >= 1  # the oldest waiting request is always served
        if 0 in counts:  # one left out: its next sequence did not fit
            left_out = waiting[counts.index(0)]
            assert len(tokens) == max_sequences or sum(tokens) + next_length[id(left_out)] > max_tokens
        for older, younger, r_old, r_young in zip(counts, counts[1:], waiting, waiting[1:], strict=False):
            assert older <= younger + 1 or younger == remaining[id(r_young)]
            assert older >= younger or older == remaining[id(r_old)]
        for seg in batch:
            taken[made.index(seg.group)] += seg.seqs.tolist()
    for i in range(len(made)):
        assert taken[i] == ([] if i in cancelled else list(range(len(requests[i])))), i
