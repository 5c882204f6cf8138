"""FCFS token-budget scheduler: plain Python over token counts, no torch, testable without a device.

Requests are queued in arrival order. A batch takes their sequences round robin, oldest request
first: one sequence of each waiting request in turn, then a second of each that has more, until the
next one would pass `max_batch_tokens` (one longer than the budget runs alone) or the sequence cap;
each request's sequences go in order and may span batches (`RoundRobin`). A lone request is served
exactly first come, first served; a one-query request that arrives behind one of thousands of
sequences gets a place in the next batch instead of waiting for all of them. Interactive requests
go before bulk ones, and keep bulk steps short while they are about, without starving bulk
(`ClassQueues`, queues.py). Up to `max_inflight_batches` batches are launched at once, so while
batch N runs the loop already packs and launches N+1. Admission is bounded: past
`max_queued_tokens` a request is refused at once (`Overloaded`), never queued without bound; bulk
already past `bulk_queue_share` of it.

The device work goes through a `BatchRunner`; waiting for a batch's rows happens on a dedicated
waiter thread so the event loop never blocks on the device. A batch whose step only replays a
captured graph (`can_launch_inline`) is launched from the event loop while the launcher thread is
idle, saving the hand-off to that thread (a wake-up: 60-130 µs on a GPU host); other batches, and
every call that captures or runs eagerly, go through the launcher thread. The rows of one such batch
at a time are polled for on the loop (`ResultHandle.is_ready`, a CUDA event query that never
blocks), saving the waiter thread's wake-up of the loop as well.

An engine with an interactive lane (the CUDA engine's `lane`: a second stream whose steps run beside
the main path's) gets a second path: its own loop, in-flight bound, launcher and waiter threads.
While the main path is busy, interactive batches go to the lane and the main path runs bulk alone
(queues.py); an idle main path still takes a query itself.

Span pooling (a sequence pooled once per span of its tokens) rides along per sequence: a batch holding
any span sequence passes every sequence's spans (None for the others) to `pack`, and its rows, one
per span of a span sequence and one per other sequence, are split back per sequence.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, cast

import numpy as np

from kembed.worker.errors import InvalidInput, Overloaded, Unavailable
from kembed.worker.queues import ClassPolicy, ClassQueues, Priority, QueuedSequence, Request, classify
from kembed.worker.results import ResultHandle

log = logging.getLogger(__name__)

IDLE_CAPTURE_SLICE_S = 0.01  # captures started per call: in effect one at a time


class BatchRunner(Protocol):
    """What the scheduler needs of an engine."""

    def pack(
        self,
        token_ids: np.ndarray,
        lengths: np.ndarray,
        token_type_ids: np.ndarray | None = None,
        spans: list[np.ndarray | None] | None = None,
    ) -> Any: ...

    def step(self, batch: Any) -> ResultHandle: ...

    def can_launch_inline(self, batch: Any) -> bool:
        """True when `step(batch)` does only cheap host work (a captured graph's replay: no capture, no
        eager forward), so it may run on the event loop. An engine without CUDA graphs answers False."""

    def capture_deferred(self, max_seconds: float) -> int:
        """Capture what could not be captured before serving (buckets prewarm had no time for, batches
        no captured bucket held), starting none after `max_seconds`; returns how many were. Called on
        the launcher thread while the worker is idle. An engine without CUDA graphs answers 0."""


def _ignore(*_: object) -> None:
    pass


@dataclass(frozen=True)
class SchedulerHooks:
    """Plain callbacks for what the scheduler sees (the metrics; the scheduler imports none). They run
    on the event loop and must be cheap. Durations are in seconds."""

    # per launched batch: (num_seqs, num_tokens, num_bulk_tokens), the last the bulk class's share
    batch_launched: Callable[[int, int, int], None] = _ignore
    # per request: admission to its first batch's launch, and its class ("interactive" or "bulk")
    queue_waited: Callable[[float, str], None] = _ignore
    batch_finished: Callable[[float], None] = _ignore  # per batch: launch to rows on the host
    # per batch, batch_finished split in four (seconds): packing on the loop; the step's own CPU work
    # (staging, copy, the graph launch), after a hand-off to the launcher thread unless launched from
    # the loop; device time plus the waiter's copy of the rows; the waiter's hand-off back to the loop
    batch_stages: Callable[[float, float, float, float], None] = _ignore
    # per request: admission to answer (or failure), and its class
    request_finished: Callable[[float, str], None] = _ignore


class Scheduler:
    """Admits ragged requests, batches their sequences FCFS under a token budget, runs the batches."""

    def __init__(
        self,
        runner: BatchRunner,
        max_batch_tokens: int,
        max_queued_tokens: int,
        max_inflight_batches: int = 2,
        hooks: SchedulerHooks | None = None,
        max_batch_sequences: int = 256,
        idle_capture_check_s: float = 0.5,
        policy: ClassPolicy | None = None,
        lane: BatchRunner | None = None,
        lane_max_batch_tokens: int = 2048,
        lane_max_batch_sequences: int = 32,
        lane_inflight_batches: int = 2,
    ) -> None:
        self._runner = runner
        self.max_batch_tokens = max_batch_tokens
        # Sequence cap as well: the CUDA engine's largest sequence bucket; past it a batch of many
        # short sequences would fit no captured graph.
        self.max_batch_sequences = max_batch_sequences
        self.max_queued_tokens = max_queued_tokens
        self._hooks = hooks or SchedulerHooks()
        self.policy = policy or ClassPolicy()
        policy_on = self.policy.is_enabled
        self._lane = lane if policy_on else None
        self._lane_tokens = min(lane_max_batch_tokens, max_batch_tokens)
        self._lane_seqs = min(lane_max_batch_sequences, max_batch_sequences)
        self._queue = ClassQueues(self.policy, self._lane_tokens if self._lane is not None else 0)
        self._queued_tokens = 0
        self._queued_bulk_tokens = 0  # of which bulk
        self._has_work = asyncio.Event()
        self._inflight = asyncio.Semaphore(max_inflight_batches)
        self._inflight_tasks: set[asyncio.Task[None]] = set()
        # One launcher thread keeps device work in launch order; a separate waiter thread means a
        # wait on batch N never delays the launch of batch N+1.
        self._launcher = ThreadPoolExecutor(1, thread_name_prefix="kembed-launch")
        self._waiter = ThreadPoolExecutor(1, thread_name_prefix="kembed-wait")
        self._loop_task: asyncio.Task[None] | None = None
        self._closed = False
        self._num_threaded = 0  # launcher-thread jobs (batches until their rows are back, device calls)
        self._idle_task: asyncio.Task[None] | None = None
        self._idle_capture_check_s = idle_capture_check_s  # how often an idle worker looks for them
        self._num_batches = 0  # batches launched since start
        self._num_inflight = 0  # batches taken and not yet finished
        self._num_polled = 0  # batches whose completion the loop is polling for now (0 or 1)
        # the interactive lane's path (unused without one)
        self._has_lane_work = asyncio.Event()
        self._lane_inflight = asyncio.Semaphore(lane_inflight_batches)
        self._lane_launcher = ThreadPoolExecutor(1, thread_name_prefix="kembed-lane")
        self._lane_waiter = ThreadPoolExecutor(1, thread_name_prefix="kembed-lane-wait")
        self._lane_task: asyncio.Task[None] | None = None
        self.num_lane_batches = 0  # batches the lane ran since start

    @property
    def queued_tokens(self) -> int:
        """Tokens admitted and not yet answered."""
        return self._queued_tokens

    @property
    def queued_tokens_by_class(self) -> dict[str, int]:
        """`queued_tokens` per class."""
        bulk = self._queued_bulk_tokens
        return {"interactive": self._queued_tokens - bulk, "bulk": bulk}

    @property
    def has_lane(self) -> bool:
        return self._lane is not None

    def start(self) -> None:
        self._loop_task = asyncio.create_task(self._run(), name="kembed-scheduler")
        if self._lane is not None:
            self._lane_task = asyncio.create_task(self._run_lane(), name="kembed-lane")
        self._idle_task = asyncio.create_task(self._capture_when_idle(), name="kembed-idle-capture")

    async def close(self) -> None:
        """Stop taking work, fail what is queued, let launched batches finish."""
        self._closed = True
        tasks = [task for task in (self._loop_task, self._idle_task, self._lane_task) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for request in self._queue.pop_all():
            self._fail(request, Unavailable("worker is shutting down"))
        await asyncio.gather(*self._inflight_tasks, return_exceptions=True)
        for executor in (self._launcher, self._waiter, self._lane_launcher, self._lane_waiter):
            executor.shutdown(wait=True)

    async def run_on_device(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn(*args)` on the launcher thread, in order with the batches (prewarm, smoke tests):
        the engine is never driven from two threads, and the event loop never blocks on it."""
        if self._closed:
            raise Unavailable("worker is shutting down")
        self._num_threaded += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._launcher, fn, *args)
        finally:
            self._num_threaded -= 1

    async def submit(
        self,
        token_ids: np.ndarray,
        lengths: np.ndarray,
        token_type_ids: np.ndarray | None = None,
        spans: list[np.ndarray | None] | None = None,
        priority: int = Priority.UNSPECIFIED,
    ) -> np.ndarray:
        """Queue a request's sequences; return their rows [num_seqs, dim] in order once all ran.
        `token_type_ids` (cross-encoder pairs) ride along with the ids; absent means all zeros.
        `spans`: per sequence None or its k + 1 span boundaries (k rows instead of one, in order).
        `priority`: its class (queues.py); unspecified, by its size. A bulk request is refused once
        the queue holds `bulk_queue_share` of `max_queued_tokens`, so interactive work has room left."""
        if self._closed:
            raise Unavailable("worker is shutting down")
        num_tokens = int(lengths.sum())
        if num_tokens > self.max_queued_tokens:
            raise InvalidInput(
                f"request of {num_tokens} tokens exceeds this worker's max_queued_tokens "
                f"({self.max_queued_tokens}); split it into smaller requests"
            )
        klass = classify(priority, len(lengths), num_tokens)
        if self._queued_tokens + num_tokens > self.max_queued_tokens:
            raise Overloaded(
                f"queue full: {self._queued_tokens} tokens queued, {num_tokens} more would pass "
                f"max_queued_tokens={self.max_queued_tokens}"
            )
        if klass == Priority.BULK and self.policy.is_enabled and self._queued_tokens > 0:
            bulk_cap = int(self.max_queued_tokens * self.policy.bulk_queue_share)
            if self._queued_tokens + num_tokens > bulk_cap:
                raise Overloaded(
                    f"queue full for bulk work: {self._queued_tokens} tokens queued, {num_tokens} more "
                    f"would pass {bulk_cap} ({self.policy.bulk_queue_share:g} of max_queued_tokens, "
                    "the rest kept for interactive requests)"
                )
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        request = Request(
            token_ids=token_ids,
            offsets=offsets,
            future=asyncio.get_running_loop().create_future(),
            token_type_ids=token_type_ids,
            spans=spans,
            rows=[None] * len(lengths),
            num_pending=len(lengths),
            num_queued_tokens=num_tokens,
            admitted_at=time.perf_counter(),
            priority=klass,
        )
        self._queued_tokens += num_tokens
        if klass == Priority.BULK:
            self._queued_bulk_tokens += num_tokens
        self._queue.push(request, request.admitted_at)
        self._has_work.set()
        if self._lane is not None and klass != Priority.BULK:
            self._has_lane_work.set()
        try:
            return await request.future
        except asyncio.CancelledError:
            self._release(request)  # its queued sequences are skipped when they come up
            raise
        finally:
            self._hooks.request_finished(time.perf_counter() - request.admitted_at, request.priority.label)

    async def _run(self) -> None:
        while True:
            await self._has_work.wait()
            await self._inflight.acquire()
            if self._queue.is_holding_bulk(self._num_inflight, time.perf_counter()):
                self._inflight.release()
                self._has_work.clear()  # set again by a new request or a batch's end
                continue
            batch = self._take_batch()
            if not batch:
                self._inflight.release()
                self._has_work.clear()
                continue
            self._num_batches += 1
            self._num_inflight += 1
            task = asyncio.create_task(self._execute(batch))
            self._inflight_tasks.add(task)
            task.add_done_callback(self._inflight_tasks.discard)
            if self._lane is not None and self._queue.has_lane_work():
                self._has_lane_work.set()  # the main path is busy now: queries go to the lane

    def _is_main_idle(self) -> bool:
        """Nothing in flight on the main path and no bulk waiting: a query is best served there."""
        return self._num_inflight == 0 and not self._queue.bulk

    async def _run_lane(self) -> None:
        """The interactive lane's loop: while the main path is busy, interactive batches run here."""
        while True:
            await self._has_lane_work.wait()
            await self._lane_inflight.acquire()
            batch = [] if self._is_main_idle() else self._queue.take_lane(self._lane_tokens, self._lane_seqs)
            if not batch:
                self._lane_inflight.release()
                self._has_lane_work.clear()  # set again by a query, or by the main path turning busy
                if self._queue:
                    self._has_work.set()  # the idle main path takes it
                continue
            self._num_batches += 1
            self.num_lane_batches += 1
            task = asyncio.create_task(self._execute(batch, on_lane=True))
            self._inflight_tasks.add(task)
            task.add_done_callback(self._inflight_tasks.discard)

    async def _capture_when_idle(self) -> None:
        """Captures what the engine deferred (`capture_deferred`), one short slice at a time and only
        while the worker is idle, so a request that arrives meanwhile waits for at most one capture
        (~20 ms for a BGE-M3-sized model). Asks again only after new batches, which may have found a
        bucket uncovered."""
        batches_seen = -1
        while True:
            await asyncio.sleep(self._idle_capture_check_s)
            is_idle = not self._queue and not self._inflight_tasks and self._num_threaded == 0
            if not is_idle or batches_seen == self._num_batches:
                continue
            batches_seen = self._num_batches
            try:
                capture = self._runner.capture_deferred
                while is_idle and await self.run_on_device(capture, IDLE_CAPTURE_SLICE_S):
                    is_idle = not self._queue and not self._inflight_tasks
            except Unavailable:  # closing
                return
            except Exception:
                log.exception("capturing deferred buckets failed")

    def _take_batch(self) -> list[QueuedSequence]:
        with_interactive = self._lane is None or self._is_main_idle()
        return self._queue.take(
            self.max_batch_tokens,
            self.max_batch_sequences,
            time.perf_counter(),
            with_interactive=with_interactive,
        )

    async def _execute(self, batch: list[QueuedSequence], on_lane: bool = False) -> None:
        started = time.perf_counter()
        runner = self._lane if on_lane and self._lane is not None else self._runner
        for seq in batch:
            if not seq.request.is_started:
                seq.request.is_started = True
                self._hooks.queue_waited(started - seq.request.admitted_at, seq.request.priority.label)
        try:
            lengths = np.fromiter((s.num_tokens for s in batch), dtype=np.int32, count=len(batch))
            token_ids = np.concatenate([s.token_ids() for s in batch])
            token_type_ids = (
                np.concatenate([s.token_type_ids() for s in batch])
                if any(s.request.token_type_ids is not None for s in batch)
                else None
            )
            spans = [s.spans() for s in batch] if any(s.request.spans is not None for s in batch) else None
            if spans is not None:
                packed = runner.pack(token_ids, lengths, token_type_ids, spans)
            elif token_type_ids is not None:
                packed = runner.pack(token_ids, lengths, token_type_ids)
            else:
                packed = runner.pack(token_ids, lengths)
            packed_at = time.perf_counter()
            if on_lane:
                rows, launched_at, ready_at = await self._on_device(
                    packed, runner, self._lane_launcher, self._lane_waiter
                )
            elif self._num_threaded == 0 and self._runner.can_launch_inline(packed):
                rows, launched_at, ready_at = await self._inline(packed)
            else:
                rows, launched_at, ready_at = await self._on_device(
                    packed, self._runner, self._launcher, self._waiter
                )
            per_sequence = rows if spans is None else _rows_per_sequence(rows, spans)
            finished = time.perf_counter()
            num_bulk = sum(s.num_tokens for s in batch if s.request.priority == Priority.BULK)
            self._hooks.batch_launched(len(batch), int(lengths.sum()), num_bulk)
            self._hooks.batch_finished(finished - started)
            self._hooks.batch_stages(
                packed_at - started, launched_at - packed_at, ready_at - launched_at, finished - ready_at
            )
        except Exception as exc:  # a failed batch fails its requests, never the loop
            log.exception("batch of %d sequences failed", len(batch))
            for seq in batch:
                self._fail(seq.request, exc)
        else:
            for seq, row in zip(batch, per_sequence, strict=True):
                self._deliver(seq, row)
        finally:
            if on_lane:
                self._lane_inflight.release()
                if self._queue.has_lane_work():
                    self._has_lane_work.set()
            else:
                self._num_inflight -= 1
                self._inflight.release()
            if self._queue:
                self._has_work.set()  # a step held back for this one may go now

    async def _inline(self, packed: Any) -> tuple[np.ndarray, float, float]:
        """(rows, launched_at, ready_at) of `packed`, launched from the loop: the launcher thread is
        idle, so the engine is still driven by one thread at a time, and the hand-off to it (a
        thread wake-up) is saved. Its result is polled for on the loop (`is_ready`, which never
        blocks: the CUDA engine's is an event query), one batch at a time, which saves the waiter
        thread's wake-up of the loop; a batch launched while another is polled for is waited for on
        the waiter thread."""
        pending = self._runner.step(packed)
        launched_at = time.perf_counter()
        if self._num_polled == 0:
            self._num_polled += 1
            try:
                await self._poll(pending.is_ready)
            finally:
                self._num_polled -= 1
            ready_at = time.perf_counter()
            return pending.wait(), launched_at, ready_at

        def wait() -> tuple[np.ndarray, float]:  # on the waiter thread: ready_at before the hand-off
            rows = pending.wait()
            return rows, time.perf_counter()

        rows, ready_at = await asyncio.get_running_loop().run_in_executor(self._waiter, wait)
        return rows, launched_at, ready_at

    @staticmethod
    def _poll(is_ready: Callable[[], bool]) -> asyncio.Future[None]:
        """Resolves once `is_ready()`; asks once per turn of the loop, so the loop keeps reading
        sockets and running other callbacks meanwhile (a turn with callbacks pending polls its
        sockets without sleeping). Measured on the H200 host against the waiter thread, interleaved:
        the resume stage at one client 0.04-0.06 ms against 0.09 (p99 0.09-0.12 against 0.28), and
        less worker CPU per request at 2-16 clients (the waiter thread's spin and GIL hand-over go);
        end to end within the runs' spread. On a CPU engine there is nothing to poll."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()

        def check() -> None:
            if future.done():
                return
            if is_ready():
                future.set_result(None)
            else:
                loop.call_soon(check)

        loop.call_soon(check)
        return future

    def _on_device(
        self, packed: Any, runner: BatchRunner, launcher: ThreadPoolExecutor, waiter: ThreadPoolExecutor
    ) -> asyncio.Future[tuple[np.ndarray, float, float]]:
        """(rows, launched_at, ready_at) of `packed`: launched on the launcher thread, which hands the
        pending result straight to the waiter thread, so the event loop is woken once per batch (when
        its rows are on the host), not once for the launch and once for the rows. The two times
        (perf_counter) are when `step` returned and when the rows were on the host."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[np.ndarray, float, float]] = loop.create_future()
        is_main = launcher is self._launcher  # the main launcher's jobs keep the loop from launching
        self._num_threaded += is_main

        def settle(  # on the loop
            result: tuple[np.ndarray, float, float] | None, error: BaseException | None
        ) -> None:
            self._num_threaded -= is_main
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                assert result is not None
                future.set_result(result)

        def settle_threadsafe(
            result: tuple[np.ndarray, float, float] | None, error: BaseException | None
        ) -> None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody awaits the rows
                loop.call_soon_threadsafe(settle, result, error)

        def wait(pending: ResultHandle, launched_at: float) -> None:  # on the waiter thread
            try:
                rows = pending.wait()
            except BaseException as error:
                settle_threadsafe(None, error)
            else:
                settle_threadsafe((rows, launched_at, time.perf_counter()), None)

        def launch() -> None:  # on the launcher thread
            try:
                pending = runner.step(packed)
                waiter.submit(wait, pending, time.perf_counter())
            except BaseException as error:
                settle_threadsafe(None, error)

        launcher.submit(launch)
        return future

    def _deliver(self, seq: QueuedSequence, row: np.ndarray) -> None:
        request = seq.request
        if request.future.done():
            return
        request.rows[seq.index] = row
        request.num_pending -= 1
        request.num_queued_tokens -= seq.num_tokens
        self._queued_tokens -= seq.num_tokens
        if request.priority == Priority.BULK:
            self._queued_bulk_tokens -= seq.num_tokens
        if request.num_pending == 0:
            # every row is set once none is pending
            rows = cast("list[np.ndarray]", request.rows)
            if request.spans is None:
                request.future.set_result(np.stack(rows))
            else:  # a span sequence's rows are [num_spans, dim]
                request.future.set_result(np.concatenate([r.reshape(-1, r.shape[-1]) for r in rows]))

    def _fail(self, request: Request, exc: BaseException) -> None:
        if not request.future.done():
            request.future.set_exception(exc)
        self._release(request)

    def _release(self, request: Request) -> None:
        """Return a finished-early request's remaining tokens to the admission budget."""
        self._queued_tokens -= request.num_queued_tokens
        if request.priority == Priority.BULK:
            self._queued_bulk_tokens -= request.num_queued_tokens
        request.num_queued_tokens = 0


def _rows_per_sequence(rows: np.ndarray, spans: list[np.ndarray | None]) -> list[np.ndarray]:
    """A span batch's rows split per sequence: [dim] for a sequence without spans, [k, dim] for one
    with k spans."""
    out: list[np.ndarray] = []
    start = 0
    for bounds in spans:
        if bounds is None:
            out.append(rows[start])
            start += 1
        else:
            out.append(rows[start : start + len(bounds) - 1])
            start += len(bounds) - 1
    assert start == len(rows), "the engine answers one row per span and per other sequence"
    return out
