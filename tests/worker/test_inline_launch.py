"""The idle fast path: a replay-only batch is launched from the event loop while the launcher thread is
idle; other batches go through the launcher thread. Both give the same rows."""

import asyncio
import itertools
import threading
import time

import numpy as np
import pytest

from kembed.worker.results import ResultHandle
from kembed.worker.scheduling.scheduler import Scheduler


class _Pending(ResultHandle):
    """Ready `step_s` after the step; `is_ready` asks without blocking, as a CUDA event query does."""

    def __init__(self, rows: np.ndarray, ready_at: float, log: list[str]) -> None:
        self._rows, self._ready_at, self._log = rows, ready_at, log

    def is_ready(self) -> bool:
        self._log.append("is_ready:" + threading.current_thread().name)
        return time.perf_counter() >= self._ready_at

    def wait(self) -> np.ndarray:
        time.sleep(max(0.0, self._ready_at - time.perf_counter()))
        self._log.append("wait:" + threading.current_thread().name)
        return self._rows


class DeviceLikeRunner:
    """Rows depend only on the sequences (a deterministic function of ids and lengths); each step
    'runs on the device' for `step_s`. `inline` says what `can_launch_inline` answers."""

    def __init__(self, inline: bool, step_s: float = 0.001) -> None:
        self.inline, self.step_s = inline, step_s
        self.log: list[str] = []

    def pack(self, token_ids, lengths):
        return token_ids.copy(), lengths.copy()

    def can_launch_inline(self, packed) -> bool:
        return self.inline

    def step(self, packed):
        token_ids, lengths = packed
        self.log.append("step:" + threading.current_thread().name)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        rows = np.stack(
            [[token_ids[a:b].sum() * 0.5, b - a, token_ids[a] % 7] for a, b in itertools.pairwise(offsets)]
        ).astype(np.float32)
        return _Pending(rows, time.perf_counter() + self.step_s, self.log)

    def capture_deferred(self, max_seconds: float) -> int:
        return 0  # every bucket captured before serving (DeferringRunner holds some back)


def _requests(seed: int, count: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        lengths = rng.integers(1, 9, size=rng.integers(1, 5)).astype(np.int32)
        out.append((rng.integers(0, 1000, size=int(lengths.sum())).astype(np.int32), lengths))
    return out


async def _run_all(runner, requests, **kwargs) -> list[np.ndarray]:
    scheduler = Scheduler(runner, max_batch_tokens=16, max_queued_tokens=10_000, **kwargs)
    scheduler.start()
    try:
        return await asyncio.gather(*(scheduler.submit(ids, lengths) for ids, lengths in requests))
    finally:
        await scheduler.close()


@pytest.mark.parametrize("concurrent", [False, True], ids=["one-at-a-time", "sixty-at-once"])
async def test_inline_and_threaded_paths_give_identical_rows(concurrent):
    requests = _requests(seed=7, count=60)
    inline, threaded = DeviceLikeRunner(inline=True), DeviceLikeRunner(inline=False)
    if concurrent:
        via_inline = await _run_all(inline, requests)
        via_threads = await _run_all(threaded, requests)
    else:
        via_inline = [(await _run_all(inline, [r]))[0] for r in requests]
        via_threads = [(await _run_all(threaded, [r]))[0] for r in requests]
    for a, b in zip(via_inline, via_threads, strict=True):
        np.testing.assert_array_equal(a, b)
    assert any(e == "step:MainThread" for e in inline.log)
    assert all(e.startswith("step:kembed-launch") for e in threaded.log if e.startswith("step:"))


async def test_a_batch_launched_while_another_is_polled_is_waited_for_on_the_waiter_thread():
    runner = DeviceLikeRunner(inline=True, step_s=0.05)
    full = [(np.arange(16, dtype=np.int32) + i, np.array([16], np.int32)) for i in range(2)]  # a batch each
    await _run_all(runner, full)
    steps = [e for e in runner.log if e.startswith("step:")]
    waits = sorted(e for e in runner.log if e.startswith("wait:"))
    assert steps == ["step:MainThread"] * 2  # both launched from the loop: no hand-off
    assert waits[0] == "wait:MainThread" and waits[1].startswith("wait:kembed-wait")  # one polled at a time


async def test_a_busy_launcher_keeps_later_batches_on_it():
    # While the launcher thread holds work (a prewarm, a smoke test, a batch that captures), a
    # replay must not be launched beside it from the loop: the engine is driven by one thread.
    runner = DeviceLikeRunner(inline=True, step_s=0.001)
    scheduler = Scheduler(runner, max_batch_tokens=16, max_queued_tokens=10_000)
    scheduler.start()
    release = threading.Event()
    try:
        held = asyncio.create_task(scheduler.run_on_device(release.wait, 10))
        await asyncio.sleep(0.01)
        ids, lengths = _requests(seed=5, count=1)[0]
        answer = asyncio.create_task(scheduler.submit(ids, lengths))
        await asyncio.sleep(0.02)
        assert runner.log == []  # queued behind the device call on the launcher, not launched inline
        release.set()
        await asyncio.gather(held, answer)
        assert runner.log[0].startswith("step:kembed-launch")
    finally:
        await scheduler.close()


class DeferringRunner(DeviceLikeRunner):
    """Holds `num_deferred` captures the engine could not make before serving."""

    def __init__(self, num_deferred: int) -> None:
        super().__init__(inline=True)
        self.num_deferred = num_deferred
        self.captures: list[tuple[str, int]] = []  # (thread, batches in flight then)
        self.in_flight = 0

    def step(self, packed):
        self.in_flight += 1
        pending = super().step(packed)
        wait = pending.wait

        def done():
            rows = wait()
            self.in_flight -= 1
            return rows

        pending.wait = done
        return pending

    def capture_deferred(self, max_seconds: float) -> int:
        if not self.num_deferred:
            return 0
        self.num_deferred -= 1
        self.captures.append((threading.current_thread().name, self.in_flight))
        return 1


async def test_deferred_captures_run_on_the_launcher_only_while_idle():
    runner = DeferringRunner(num_deferred=3)
    scheduler = Scheduler(runner, max_batch_tokens=16, max_queued_tokens=10_000, idle_capture_check_s=0.01)
    scheduler.start()
    try:
        for ids, lengths in _requests(seed=9, count=20):  # traffic, then idle
            await scheduler.submit(ids, lengths)
        for _ in range(100):
            if not runner.num_deferred:
                break
            await asyncio.sleep(0.01)
    finally:
        await scheduler.close()
    assert runner.num_deferred == 0
    assert len(runner.captures) == 3
    assert all(thread.startswith("kembed-launch") and in_flight == 0 for thread, in_flight in runner.captures)


async def test_an_idle_worker_polls_the_result_on_the_loop_without_blocking_it():
    runner = DeviceLikeRunner(inline=True, step_s=0.02)
    scheduler = Scheduler(runner, max_batch_tokens=16, max_queued_tokens=10_000)
    scheduler.start()
    try:
        ids, lengths = _requests(seed=3, count=1)[0]
        answer = asyncio.create_task(scheduler.submit(ids, lengths))
        ticks = 0
        while not answer.done():  # the loop keeps turning while the batch is on the "device"
            ticks += 1
            await asyncio.sleep(0.001)
        await answer
    finally:
        await scheduler.close()
    assert ticks >= 5
    assert runner.log[0] == "step:MainThread"
    polls = [e for e in runner.log if e.startswith("is_ready:")]
    assert len(polls) > 1 and all(e == "is_ready:MainThread" for e in polls)
    assert runner.log[-1] == "wait:MainThread"  # rows taken on the loop once ready: nothing left to wait for


@pytest.mark.parametrize(("num_seqs", "polled"), [(16, True), (17, False)], ids=["small", "large"])
async def test_only_a_small_batch_alone_is_polled_on_the_loop(num_seqs, polled):
    """Polling spins the loop for a whole step: a busy worker's large batches are waited for asleep."""
    runner = DeviceLikeRunner(inline=True, step_s=0.02)
    ids, lengths = np.arange(num_seqs, dtype=np.int32), np.ones(num_seqs, np.int32)
    scheduler = Scheduler(runner, max_batch_tokens=64, max_queued_tokens=10_000)
    scheduler.start()
    try:
        await scheduler.submit(ids, lengths)
    finally:
        await scheduler.close()
    waits = [e for e in runner.log if e.startswith("wait:")]
    assert runner.log.count("step:MainThread") == 1  # launched from the loop either way
    assert waits == (
        ["wait:MainThread"] if polled else [w for w in waits if w.startswith("wait:kembed-wait")]
    )
    assert bool(waits) and any(e.startswith("is_ready:") for e in runner.log) == polled


async def test_an_idle_worker_spends_at_most_two_percent_of_a_core():
    """Nothing spins once the batches are answered: neither the loop's poll of a lone batch nor the
    waiter thread of the others (a lone query's batch, a large one, one behind another), nor the
    scheduler's idle tasks, wake the process more than a few times a second."""
    runner = DeviceLikeRunner(inline=True, step_s=0.002)
    scheduler = Scheduler(runner, max_batch_tokens=64, max_queued_tokens=10_000, idle_capture_check_s=0.05)
    scheduler.start()
    try:
        await scheduler.submit(np.arange(4, dtype=np.int32), np.ones(4, np.int32))  # polled on the loop
        await scheduler.submit(np.arange(32, dtype=np.int32), np.ones(32, np.int32))  # on the waiter
        requests = _requests(seed=5, count=40)  # batches behind one another, on the waiter
        await asyncio.gather(*(scheduler.submit(ids, lengths) for ids, lengths in requests))
        cpu, started = time.process_time(), time.perf_counter()
        await asyncio.sleep(1.0)
        idle = (time.process_time() - cpu) / (time.perf_counter() - started)
    finally:
        await scheduler.close()
    assert any(e.startswith("wait:kembed-wait") for e in runner.log)
    assert idle <= 0.02, f"idle worker at {idle:.1%} of a core"
