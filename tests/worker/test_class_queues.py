"""Interactive before bulk (queues.py `ClassQueues`): properties over random traffic with a simulated
clock, and the scheduler serving a query behind a bulk flood."""

import asyncio
import copy
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kembed.worker.errors import Overloaded
from kembed.worker.scheduling.groups import RequestGroup, Segment
from kembed.worker.scheduling.queues import ClassPolicy, ClassQueues, Priority, RoundRobin, classify
from kembed.worker.scheduling.scheduler import Scheduler

STEP_S = 0.01  # simulated time between two batches


class _Ignored:
    """A sink for groups whose answers no test reads."""

    def answered(self, group, requests) -> None:
        pass

    def failed(self, group, requests, error) -> None:
        pass


def _request(lengths: list[int], priority: Priority, admitted_at: float) -> RequestGroup:
    """One request of these sequences, as a group of its own (a unary call's)."""
    lengths = np.array(lengths, np.int32)
    return RequestGroup(
        np.zeros(int(lengths.sum()), np.int32), lengths, np.array([len(lengths)]), _Ignored(),
        priority=priority, admitted_at=admitted_at,
    )  # fmt: skip


def _pairs(batch: list[Segment]) -> list[tuple[RequestGroup, int]]:
    """A batch as (request, sequence index) pairs, in the batch's order."""
    return [(seg.group, int(i)) for seg in batch for i in seg.seqs]


def _take_alone(queue: RoundRobin, max_tokens: int, max_sequences: int) -> list[tuple[RequestGroup, int]]:
    """What `queue.take` would give, taken from a copy: (request, sequence index) pairs."""
    copies = {}
    shadow = RoundRobin()
    for group in queue._waiting:
        twin = copy.copy(group)  # taking moves only the copy's own head
        copies[id(twin)] = group
        shadow.push(twin)
    return [(copies[id(twin)], i) for twin, i in _pairs(shadow.take(max_tokens, max_sequences))]


traffic = st.lists(
    st.tuples(
        st.sampled_from([Priority.INTERACTIVE, Priority.BULK]),
        st.lists(st.integers(1, 40), min_size=1, max_size=10),  # sequence lengths
        st.integers(0, 30),  # arrives before this batch
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(
    requests=traffic,
    max_tokens=st.integers(8, 64),
    max_sequences=st.integers(1, 8),
    bulk_step_tokens=st.integers(1, 64),
    bulk_max_wait_s=st.sampled_from([0.0, 0.03, 0.1, 10.0]),
    interactive_hold_s=st.sampled_from([0.0, 0.05, 1.0]),
    endless_interactive=st.booleans(),
)
def test_class_queue_properties(
    requests,
    max_tokens,
    max_sequences,
    bulk_step_tokens,
    bulk_max_wait_s,
    interactive_hold_s,
    endless_interactive,
):
    """Every sequence is taken exactly once, each request's in order; a batch keeps the budget and
    the cap (one longer sequence alone); within a class a request's first sequence is never taken
    after that of a request of its class that arrived later (FCFS across requests); interactive
    work goes first: unless bulk is starving, a batch's interactive part is what the interactive
    queue alone would give, bulk only filling the room left; while interactive is about a batch
    holds at most `bulk_step_tokens` of bulk (or one bulk sequence alone); and bulk is never
    starved, even when a stream of interactive queries fills every batch (`endless_interactive`):
    it gets a sequence within `bulk_max_wait_s` plus a batch."""
    policy = ClassPolicy(
        bulk_step_tokens=bulk_step_tokens,
        interactive_hold_s=interactive_hold_s,
        bulk_max_wait_s=bulk_max_wait_s,
    )
    queues = ClassQueues(policy)
    order = sorted(range(len(requests)), key=lambda i: (requests[i][2], i))
    made: dict[int, RequestGroup] = {}
    taken: dict[int, list[int]] = {}
    first_taken: dict[int, int] = {}  # request -> batch that took its first sequence
    fillers: list[RequestGroup] = []
    bulk_waiting_since: float | None = None
    num_batches = 0
    while num_batches < 2000:
        now = num_batches * STEP_S
        while order and requests[order[0]][2] <= num_batches:
            i = order.pop(0)
            klass, lengths, _ = requests[i]
            made[i] = _request(lengths, klass, now)
            taken[i] = []
            queues.push(made[i], now)
        if endless_interactive and num_batches < 200:  # a full batch of queries arrives every step
            for _ in range(max_sequences):
                filler = _request([max(1, max_tokens // max_sequences)], Priority.INTERACTIVE, now)
                fillers.append(filler)
                queues.push(filler, now)
        if not queues and not order:
            break
        is_bulk_waiting = any(r.num_waiting for r in queues.bulk._waiting)
        if is_bulk_waiting and bulk_waiting_since is None:
            bulk_waiting_since = now
        interactive_before = [r for r in queues.interactive._waiting if r.num_waiting]
        is_about = queues.is_interactive_about(now)
        is_starving = is_bulk_waiting and now - bulk_waiting_since >= bulk_max_wait_s - 1e-9
        interactive_alone = _take_alone(queues.interactive, max_tokens, max_sequences)
        batch = queues.take(max_tokens, max_sequences, now)
        num_batches += 1
        if not batch:
            assert not interactive_before and not is_bulk_waiting, "work waited, nothing was taken"
            continue
        pairs = _pairs(batch)
        tokens = [int(group.lengths[i]) for group, i in pairs]
        assert len(pairs) <= max_sequences
        assert sum(tokens) <= max_tokens or len(pairs) == 1
        bulk = [(group, i) for group, i in pairs if group.priority == Priority.BULK]
        if is_about and len(bulk) > 1:
            assert sum(int(group.lengths[i]) for group, i in bulk) <= bulk_step_tokens
        if not is_starving:  # interactive first: its part is what its queue alone would give
            assert [pair for pair in pairs if pair not in bulk] == interactive_alone
        if bulk:
            assert bulk_waiting_since is not None
            assert now - bulk_waiting_since <= bulk_max_wait_s + STEP_S + 1e-9, "bulk starved"
            bulk_waiting_since = None if not any(r.num_waiting for r in queues.bulk._waiting) else now
        elif is_bulk_waiting:
            assert now - bulk_waiting_since <= bulk_max_wait_s + 1e-9, "bulk starved"
        for group, index in pairs:
            for i, request in made.items():
                if request is group:
                    taken[i].append(index)
                    first_taken.setdefault(i, num_batches)
    assert not queues, "work left after 2000 batches"
    for i, (_, lengths, _) in enumerate(requests):
        assert taken[i] == list(range(len(lengths))), f"request {i}"
    for i in first_taken:  # FCFS across requests within a class
        for j in first_taken:
            if made[i].priority == made[j].priority and made[i].admitted_at < made[j].admitted_at:
                assert first_taken[i] <= first_taken[j], (i, j)


@pytest.mark.parametrize(
    ("said", "num_sequences", "num_tokens", "expected"),
    [
        (Priority.UNSPECIFIED, 1, 14, Priority.INTERACTIVE),
        (Priority.UNSPECIFIED, 8, 1024, Priority.INTERACTIVE),
        (Priority.UNSPECIFIED, 9, 90, Priority.BULK),
        (Priority.UNSPECIFIED, 1, 1025, Priority.BULK),
        (Priority.BULK, 1, 14, Priority.BULK),
        (Priority.INTERACTIVE, 100, 50_000, Priority.INTERACTIVE),
        (7, 1, 14, Priority.INTERACTIVE),  # a value from a newer contract: by size
    ],
    ids=[
        "query",
        "at-the-limits",
        "many-sequences",
        "many-tokens",
        "said-bulk",
        "said-interactive",
        "unknown",
    ],
)
def test_a_request_is_classed_as_said_else_by_size(said, num_sequences, num_tokens, expected):
    assert classify(said, num_sequences, num_tokens) == expected


class _GatedRunner:
    """Each batch's rows are [first id, batch number]; a batch completes when the test opens its gate."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []  # first ids of each batch's sequences
        self.gates: list[threading.Event] = []
        self.launched = threading.Event()

    def pack(self, token_ids, lengths):
        return token_ids.copy(), lengths.copy()

    def step(self, packed):
        token_ids, lengths = packed
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        number = len(self.batches)
        self.batches.append(token_ids[starts].tolist())
        self.launched.set()
        gate = threading.Event()
        self.gates.append(gate)
        rows = np.stack([token_ids[starts], np.full(len(lengths), number)], axis=1).astype(np.float32)

        class Done:
            def wait(self) -> np.ndarray:
                assert gate.wait(10), "gate never opened"
                return rows

        return Done()

    def can_launch_inline(self, packed) -> bool:
        return False  # as an engine without CUDA graphs: every step goes through the launcher thread

    def capture_deferred(self, max_seconds: float) -> int:
        return 0  # nothing to capture


def _ragged(count: int, length: int, first: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.concatenate([np.full(length, first + i, np.int32) for i in range(count)])
    return ids, np.full(count, length, np.int32)


async def _open_gates_until(runner: _GatedRunner, *tasks: asyncio.Task) -> None:
    while not all(task.done() for task in tasks):
        for gate in list(runner.gates):
            gate.set()
        await asyncio.sleep(0.001)


@pytest.mark.parametrize("is_enabled", [True, False], ids=["classes", "fcfs"])
async def test_a_query_behind_fifty_queued_bulk_sequences_goes_in_the_next_step(is_enabled):
    """50 bulk sequences queued (and one bulk batch on the device): a query submitted now is in the
    next batch, ahead of the bulk queued before it. With the classes off it waits for the bulk
    request's turn order, served round robin with it, and still gets the next batch only because it
    is another request (round robin) -- but behind a first bulk sequence."""
    runner = _GatedRunner()
    policy = ClassPolicy(is_enabled=is_enabled, bulk_step_tokens=32, bulk_max_wait_s=10.0)
    scheduler = Scheduler(
        runner, max_batch_tokens=64, max_queued_tokens=10_000, max_inflight_batches=1, policy=policy
    )
    scheduler.start()
    try:
        bulk = asyncio.create_task(scheduler.submit(*_ragged(51, 16, first=0), priority=Priority.BULK))
        await asyncio.to_thread(runner.launched.wait, 5)  # the first bulk batch is on the "device"
        query = asyncio.create_task(scheduler.submit(*_ragged(1, 12, first=1000)))
        await asyncio.sleep(0.01)
        await _open_gates_until(runner, query)
        assert (await query)[0, 1] == 1  # answered from the next batch
        if is_enabled:
            # the query first, then bulk up to bulk_step_tokens (two of 16): the step stays short
            assert runner.batches[1] == [1000, 4, 5]
        else:
            # round robin, bulk's turn first, a full step: turns bulk, query, bulk, bulk; a batch
            # holds each request's run of sequences
            assert runner.batches[1] == [4, 5, 6, 1000]
        await _open_gates_until(runner, bulk)
        assert (await bulk)[:, 0].tolist() == list(range(51))
    finally:
        await scheduler.close()


async def test_bulk_is_refused_before_interactive_when_the_queue_fills():
    runner = _GatedRunner()
    scheduler = Scheduler(
        runner,
        max_batch_tokens=64,
        max_queued_tokens=1000,
        max_inflight_batches=1,
        policy=ClassPolicy(bulk_queue_share=0.5),
    )
    scheduler.start()
    try:
        first = asyncio.create_task(scheduler.submit(*_ragged(25, 16, first=0), priority=Priority.BULK))
        await asyncio.sleep(0.01)  # 400 tokens queued
        with pytest.raises(Overloaded, match="bulk"):
            await scheduler.submit(*_ragged(10, 16, first=100), priority=Priority.BULK)  # 560 > 500
        query = asyncio.create_task(scheduler.submit(*_ragged(8, 16, first=200)))  # 528 <= 1000
        await asyncio.sleep(0.01)
        await _open_gates_until(runner, first, query)
        assert (await query)[:, 0].tolist() == list(range(200, 208))
        assert (await first)[:, 0].tolist() == list(range(25))
    finally:
        await scheduler.close()


async def test_with_max_bulk_inflight_one_bulk_step_is_launched_ahead_of_a_query():
    """While queries are about, a second query-less step is held back until the first ends; a query
    that arrives meanwhile is launched at once, beside it."""
    runner = _GatedRunner()
    policy = ClassPolicy(bulk_step_tokens=32, max_bulk_inflight=1, bulk_max_wait_s=10.0)
    scheduler = Scheduler(
        runner, max_batch_tokens=64, max_queued_tokens=10_000, max_inflight_batches=2, policy=policy
    )
    scheduler.start()
    try:
        first_query = await asyncio.wait_for(
            asyncio.gather(
                scheduler.submit(*_ragged(1, 12, first=900)), _open_gates_until_launched(runner, 1)
            ),
            5,
        )
        assert first_query[0][0, 0] == 900  # interactive traffic is now about
        bulk = asyncio.create_task(scheduler.submit(*_ragged(20, 16, first=0), priority=Priority.BULK))
        await asyncio.to_thread(runner.launched.wait, 5)
        await asyncio.sleep(0.02)
        assert len(runner.batches) == 2  # the query's, then one bulk step; a second is held back
        query = asyncio.create_task(scheduler.submit(*_ragged(1, 12, first=1000)))
        await asyncio.sleep(0.02)
        assert len(runner.batches) == 3 and runner.batches[2][0] == 1000  # launched beside the bulk step
        await _open_gates_until(runner, query, bulk)
        assert (await bulk)[:, 0].tolist() == list(range(20))
    finally:
        await scheduler.close()


async def _open_gates_until_launched(runner: _GatedRunner, count: int) -> None:
    for _ in range(5000):
        if len(runner.gates) >= count:
            for gate in list(runner.gates):
                gate.set()
            return
        await asyncio.sleep(0.001)
    raise AssertionError("never launched")
