"""The scheduler's interactive lane: with an engine that offers a second path (the CUDA engine's
`lane`, a stream whose steps run beside the main path's), queries go there while the main path is
busy, and the main path runs bulk alone in full steps. Recording runners stand in for both paths
(no torch): what each path was given is what is checked."""

import asyncio

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_class_queues import _pairs, _request
from test_scheduler import RecordingRunner, ragged

from kembed.worker.scheduling.queues import ClassPolicy, ClassQueues, Priority
from kembed.worker.scheduling.scheduler import Scheduler

INTERACTIVE, BULK = Priority.INTERACTIVE, Priority.BULK


@pytest.fixture
async def make_scheduler():
    made: list[Scheduler] = []

    def make(main, lane, **kwargs) -> Scheduler:
        kwargs.setdefault("max_batch_tokens", 64)
        kwargs.setdefault("max_queued_tokens", 10_000)
        kwargs.setdefault("lane_max_batch_tokens", 16)
        scheduler = Scheduler(main, lane=lane, **kwargs)
        scheduler.start()
        made.append(scheduler)
        return scheduler

    yield make
    for scheduler in made:
        paths = [path for path in (scheduler.lane, scheduler.main) if path is not None]
        for runner in (path.runner for path in paths):  # open any gate still shut
            for gate in getattr(runner, "gates", []):
                gate.set()
        await scheduler.close()


async def wait_for(condition, timeout_s: float = 5.0) -> None:
    for _ in range(int(timeout_s / 0.005)):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not met in time")


async def test_a_query_runs_on_the_lane_while_bulk_holds_the_main_path(make_scheduler):
    main, lane = RecordingRunner(gated=True), RecordingRunner()
    scheduler = make_scheduler(main, lane, max_inflight_batches=2)
    bulk = asyncio.create_task(scheduler.submit(*ragged(*[30] * 8), priority=BULK))
    await wait_for(lambda: len(main.batches) == 2)  # two bulk steps in flight, neither finished
    query = await asyncio.wait_for(scheduler.submit(*ragged(5, first=100), priority=INTERACTIVE), 5)
    assert query[:, 0].tolist() == [100]  # answered while the bulk steps are still running
    assert lane.batches == [[5]]
    assert all(n == 30 for batch in main.batches for n in batch)  # the main path never took it
    assert scheduler.num_lane_batches == 1
    for _ in range(10):  # let the bulk steps through
        for gate in main.gates:
            gate.set()
        await asyncio.sleep(0.01)
    rows = await asyncio.wait_for(bulk, 5)
    assert rows[:, 0].tolist() == list(range(8))


async def test_bulk_steps_are_full_with_a_lane_and_capped_without(make_scheduler):
    """Without a lane a query about caps bulk steps at bulk_step_tokens (it would wait behind them);
    with one, bulk runs in full steps, as no query waits behind them."""
    policy = ClassPolicy(bulk_step_tokens=20)
    for lane in (None, RecordingRunner()):
        main = RecordingRunner(gated=True)
        scheduler = make_scheduler(main, lane, max_inflight_batches=1, policy=policy)
        first = asyncio.create_task(scheduler.submit(*ragged(10), priority=BULK))  # holds the path
        await wait_for(lambda main=main: len(main.batches) == 1)
        query = asyncio.create_task(scheduler.submit(*ragged(4, first=50), priority=INTERACTIVE))
        bulk = asyncio.create_task(scheduler.submit(*ragged(*[10] * 12, first=1), priority=BULK))
        await asyncio.sleep(0.02)
        while not (first.done() and query.done() and bulk.done()):
            for gate in main.gates:
                gate.set()
            await asyncio.sleep(0.005)
        bulk_steps = [sum(b) for b in main.batches[1:] if 4 not in b]
        if lane is None:
            assert max(bulk_steps) <= 20
        else:
            assert max(bulk_steps) == 60  # 6 of 10 tokens: the 64-token budget, not the cap
            assert lane.batches == [[4]]


async def test_an_idle_main_path_takes_a_query_itself(make_scheduler):
    main, lane = RecordingRunner(), RecordingRunner()
    scheduler = make_scheduler(main, lane)
    for i in range(5):  # one at a time: the main path is idle each time
        rows = await scheduler.submit(*ragged(3, first=i), priority=INTERACTIVE)
        assert rows[:, 0].tolist() == [i]
    assert main.batches == [[3]] * 5
    assert lane.batches == []


async def test_a_query_longer_than_the_lane_runs_on_the_main_path(make_scheduler):
    main, lane = RecordingRunner(gated=True), RecordingRunner()
    scheduler = make_scheduler(main, lane, max_inflight_batches=2)
    bulk = asyncio.create_task(scheduler.submit(*ragged(*[30] * 4), priority=BULK))
    await wait_for(lambda: len(main.batches) == 2)
    long_query = asyncio.create_task(scheduler.submit(*ragged(40, first=70), priority=INTERACTIVE))
    await asyncio.sleep(0.02)
    assert lane.batches == []  # 40 tokens: past the lane's 16
    while not (long_query.done() and bulk.done()):
        for gate in main.gates:
            gate.set()
        await asyncio.sleep(0.005)
    assert (await long_query)[:, 0].tolist() == [70]
    assert [40] in main.batches


async def test_no_lane_with_the_classes_off(make_scheduler):
    main, lane = RecordingRunner(gated=True), RecordingRunner()
    scheduler = make_scheduler(main, lane, policy=ClassPolicy(is_enabled=False))
    assert not scheduler.has_lane
    bulk = asyncio.create_task(scheduler.submit(*ragged(*[30] * 4), priority=BULK))
    await wait_for(lambda: len(main.batches) >= 1)
    query = asyncio.create_task(scheduler.submit(*ragged(5, first=100), priority=INTERACTIVE))
    while not (query.done() and bulk.done()):
        for gate in main.gates:
            gate.set()
        await asyncio.sleep(0.005)
    assert lane.batches == []


async def test_under_mixed_load_every_sequence_is_answered_once_with_its_own_row(make_scheduler):
    main, lane = RecordingRunner(), RecordingRunner()
    scheduler = make_scheduler(main, lane, max_inflight_batches=2)
    rng = np.random.default_rng(0)
    submitted = []
    total = 0
    for _ in range(60):
        bulk = rng.random() < 0.3
        lengths = rng.integers(1, 30 if bulk else 12, size=rng.integers(10, 20) if bulk else 1)
        priority = BULK if bulk else INTERACTIVE
        call = scheduler.submit(*ragged(*lengths, first=total), priority=priority)
        submitted.append((total, len(lengths), asyncio.ensure_future(call)))
        total += len(lengths)
    results = await asyncio.wait_for(asyncio.gather(*(task for *_, task in submitted)), 20)
    for (first, count, _), rows in zip(submitted, results, strict=True):
        assert rows[:, 0].tolist() == list(range(first, first + count))
    launched = [n for batches in (main.batches, lane.batches) for batch in batches for n in batch]
    assert len(launched) == total  # each sequence launched exactly once, on one path or the other
    assert lane.batches, "with bulk in flight some queries took the lane"
    assert all(sum(batch) <= 16 for batch in lane.batches)
    assert scheduler.queued_tokens == 0


@settings(max_examples=200, deadline=None)
@given(
    requests=st.lists(
        st.tuples(st.lists(st.integers(1, 40), min_size=1, max_size=6), st.booleans()),
        min_size=1,
        max_size=12,
    ),
    lane_tokens=st.integers(1, 32),
    picks=st.lists(st.booleans(), min_size=1, max_size=200),
)
def test_the_lane_takes_only_interactive_sequences_that_fit_it(requests, lane_tokens, picks):
    """Whatever the order of lane and main takes: the lane gets interactive sequences of at most its
    budget, the main path without interactive gets bulk or the one interactive head too long for
    the lane, every sequence is taken exactly once, each request's in order."""
    queues = ClassQueues(ClassPolicy(), lane_tokens=lane_tokens)
    made = [_request(lengths, BULK if bulk else INTERACTIVE, 0.0) for lengths, bulk in requests]
    for request in made:
        queues.push(request, 0.0)
    taken: dict[int, list[int]] = {id(r): [] for r in made}
    for step, lane_turn in enumerate([*picks, *[False] * 500]):
        if not queues:
            break
        if lane_turn:
            batch = queues.take_lane(lane_tokens, 8)
            assert sum(s.num_tokens for s in batch) <= lane_tokens
            assert all(s.group.priority == INTERACTIVE for s in batch)
        else:
            head = queues.interactive.next_num_tokens()
            batch = queues.take(64, 8, float(step), with_interactive=False)
            interactive = [s for s in batch if s.group.priority == INTERACTIVE]
            assert not interactive or (head is not None and head > lane_tokens)
            if not batch:  # interactive work left that only the lane may take: give it the turn
                batch = queues.take_lane(lane_tokens, 8)
        for group, index in _pairs(batch):
            taken[id(group)].append(index)
    assert not queues
    for request in made:
        assert taken[id(request)] == list(range(request.num_seqs))


async def test_the_metrics_count_the_lanes_batches(make_scheduler):
    from prometheus_client import generate_latest

    from kembed.worker.info import EngineStats, ModelInfo
    from kembed.worker.metrics import WorkerMetrics

    info = ModelInfo("m", "bert", "embed", 3, 512, 1000, "mean", True, "float32", "cpu", "sdpa")
    metrics = WorkerMetrics(info, revision="r1")
    main, lane = RecordingRunner(gated=True), RecordingRunner()
    scheduler = make_scheduler(main, lane, max_inflight_batches=2, hooks=metrics.hooks())
    metrics.watch(EngineStats, scheduler, 1 << 20)

    def lane_batches() -> float:
        text = generate_latest(metrics.registry).decode()
        (line,) = [ln for ln in text.splitlines() if ln.startswith("kembed_worker_lane_batches_total ")]
        return float(line.split()[1])

    assert lane_batches() == 0
    bulk = asyncio.create_task(scheduler.submit(*ragged(*[30] * 4), priority=BULK))
    await wait_for(lambda: len(main.batches) == 2)
    for i in range(3):
        await scheduler.submit(*ragged(5, first=100 + i), priority=INTERACTIVE)
    assert lane_batches() == len(lane.batches) == 3
    while not bulk.done():
        for gate in main.gates:
            gate.set()
        await asyncio.sleep(0.005)
