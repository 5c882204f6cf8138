"""The token-budget scheduler: admission, the class queues and one loop over the device paths.
Plain Python and numpy over token counts, no torch, testable without a device.

Requests arrive in groups (groups.py): a data-port frame's requests of one class, or one unary
request. Admission is per request and vectorized over the group: in order, while the queue holds
at most `max_queued_tokens`; what does not fit is refused at once (`Overloaded`), never queued
without bound, and bulk once the queue holds `bulk_queue_share` of the cap, so interactive work
always finds room. A request larger than the cap is invalid.

Batches are taken round robin across groups under each device path's token budget and sequence
cap, interactive before bulk (`ClassQueues`, queues.py). A device path (device_path.py) is an
engine with its in-flight bound and its threads: the main path, and on a CUDA engine with an
interactive lane, the lane, whose steps run beside the main path's on a stream of their own. The
loop gives each path with room its next batch: while batch N runs, N+1 is packed and launched. The
lane is used only while the main path has bulk work (in flight or waiting): queries then run
beside the bulk steps, and the main path runs bulk alone, in full steps; with no bulk about, the
main path serves queries as if there were no classes, and the lane stays idle.

A request is answered once its last row is back; a failed batch fails its requests, never the
loop. Each request may carry a deadline: a timer fails those that pass it (DEADLINE_EXCEEDED) and
frees their place. Cancelled requests leave the queue at once. Metrics come through `SchedulerHooks`,
per batch and per group (a group's requests share their admission time, so one call counts them all).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from kembed.worker.classes import ClassPolicy, Priority, classify
from kembed.worker.errors import DeadlineExceeded, InvalidInput, Overloaded, Unavailable
from kembed.worker.hooks import SchedulerHooks
from kembed.worker.scheduling.deadlines import Deadlines
from kembed.worker.scheduling.device_path import BatchRunner, DevicePath
from kembed.worker.scheduling.groups import FutureSink, RequestGroup, Segment, pack_arguments
from kembed.worker.scheduling.queues import ClassQueues, batch_size
from kembed.worker.scheduling.stalls import StepWatch

__all__ = ["BatchRunner", "Scheduler", "SchedulerHooks"]

log = logging.getLogger(__name__)

_NONE = np.empty(0, dtype=np.int64)


class Scheduler:
    """Admits groups of ragged requests, batches their sequences under token budgets, runs the
    batches on its device paths."""

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
        steps: StepWatch | None = None,
    ) -> None:
        self.max_batch_tokens = max_batch_tokens
        # Sequence cap as well: the CUDA engine's largest sequence bucket; past it a batch of many
        # short sequences would fit no captured graph.
        self.max_batch_sequences = max_batch_sequences
        self.max_queued_tokens = max_queued_tokens
        self.policy = policy or ClassPolicy()
        # every device step timed: a stalled one, and the device's rate (stalls.py)
        self.steps = steps or StepWatch(min_batch_tokens=max_batch_tokens // 4)
        self._hooks = hooks or SchedulerHooks()
        self.main = DevicePath("main", runner, max_batch_tokens, max_batch_sequences, max_inflight_batches)
        self.lane: DevicePath | None = None
        if lane is not None and self.policy.is_enabled:
            lane_tokens, lane_seqs = (
                min(lane_max_batch_tokens, max_batch_tokens),
                min(lane_max_batch_sequences, max_batch_sequences),
            )
            self.lane = DevicePath(
                "lane", lane, lane_tokens, lane_seqs, lane_inflight_batches, is_inline=False
            )
        self._queue = ClassQueues(self.policy, self.lane.max_tokens if self.lane is not None else 0)
        self._queued_tokens = 0
        self._queued_bulk_tokens = 0  # of which bulk
        self.num_groups = 0  # groups admitted since start (a frame's requests of a class, or a unary call)
        self.num_requests = 0  # requests admitted since start
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()  # batches in flight
        self._loop_task: asyncio.Task[None] | None = None
        self._idle_task: asyncio.Task[None] | None = None
        self._idle_capture_check_s = idle_capture_check_s  # how often an idle worker looks for captures
        self._closed = False
        late = DeadlineExceeded("deadline exceeded in the worker")
        self._deadlines = Deadlines(lambda group, requests: self._finish(group, requests, late))

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
        return self.lane is not None

    @property
    def num_lane_batches(self) -> int:
        """Batches the lane ran since start."""
        return 0 if self.lane is None else self.lane.num_batches

    def start(self) -> None:
        self._loop_task = asyncio.create_task(self._run(), name="kembed-scheduler")
        capture = self.main.capture_when_idle(self._is_idle, self._idle_capture_check_s)
        self._idle_task = asyncio.create_task(capture, name="kembed-idle-capture")

    async def close(self) -> None:
        """Stop taking work, fail what is queued, let launched batches finish."""
        self._closed = True
        tasks = [task for task in (self._loop_task, self._idle_task) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._deadlines.close()
        closing = Unavailable("worker is shutting down")
        for group in self._queue.pop_all():
            self._finish(group, np.flatnonzero(~group.is_settled), closing)
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for path in (self.main, self.lane):
            if path is not None:
                path.close()

    async def run_on_device(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn(*args)` on the main path's launcher thread, in order with the batches (prewarm,
        smoke tests)."""
        if self._closed:
            raise Unavailable("worker is shutting down")
        return await self.main.call(fn, *args)

    # --- admission ---

    async def submit(
        self,
        token_ids: np.ndarray,
        lengths: np.ndarray,
        token_type_ids: np.ndarray | None = None,
        spans: list[np.ndarray | None] | None = None,
        priority: int = Priority.UNSPECIFIED,
        outputs: np.ndarray | None = None,
        rows_per_seq: np.ndarray | None = None,
    ) -> np.ndarray:
        """One request's rows [num_rows, width] in order, once all its sequences ran (unary calls).
        `token_type_ids` (cross-encoder pairs) ride along with the ids; absent means all zeros.
        `spans`: per sequence None or its k + 1 span boundaries (k rows instead of one, in order).
        `priority`: its class; unspecified, by its size. `outputs`, `rows_per_seq`: per sequence its
        Output bitmask and the rows answering it (several outputs, kembed.proto.outputs)."""
        if self._closed:
            raise Unavailable("worker is shutting down")
        klass = classify(priority, len(lengths), int(lengths.sum()))
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        group = RequestGroup(
            token_ids,
            lengths,
            np.array([len(lengths)]),
            FutureSink(future),
            priority=klass,
            admitted_at=time.perf_counter(),
            token_type_ids=token_type_ids,
            spans=spans,
            outputs=outputs,
            rows_per_seq=rows_per_seq,
        )
        self.admit(group)
        try:
            return await future
        except asyncio.CancelledError:
            self.cancel(group, np.array([0]))  # its waiting sequences leave the queue
            raise

    def admit(self, group: RequestGroup) -> None:
        """Queue what fits of `group`; its other requests fail at once through its sink."""
        if self._closed:
            self._finish(group, np.arange(group.num_requests), Unavailable("worker is shutting down"))
            return
        tokens = group.tokens_per_request
        too_large = np.flatnonzero(tokens > self.max_queued_tokens)
        for request in too_large.tolist():  # a message each: it names the request's size
            self._finish(
                group,
                np.array([request]),
                InvalidInput(
                    f"request of {int(tokens[request])} tokens exceeds this worker's max_queued_tokens "
                    f"({self.max_queued_tokens}); split it into smaller requests"
                ),
            )
        refused, reason = self._refused(group)
        if len(refused):
            self._finish(group, refused, Overloaded(reason))
        if group.num_live == 0:
            return
        self.num_groups += 1
        self.num_requests += group.num_live
        group.is_queued = True  # its tokens count against the cap until they are answered or freed
        self._queued_tokens += group.num_queued_tokens
        if group.priority == Priority.BULK:
            self._queued_bulk_tokens += group.num_queued_tokens
        self._queue.push(group, group.admitted_at)
        self._deadlines.watch(group)
        self._wake.set()

    def _refused(self, group: RequestGroup) -> tuple[np.ndarray, str]:
        """The live requests the queue has no room for, and why: from the first that would pass the
        cap (for bulk, its share of it) on, in order."""
        is_bulk = group.priority == Priority.BULK and self.policy.is_enabled and self._queued_tokens > 0
        cap = (
            int(self.max_queued_tokens * self.policy.bulk_queue_share) if is_bulk else self.max_queued_tokens
        )
        if self._queued_tokens + group.num_queued_tokens <= cap:
            return _NONE, ""  # all of it fits: nearly every group
        live = ~group.is_settled
        tokens = np.where(live, group.tokens_per_request, 0)
        over = np.flatnonzero(live & (self._queued_tokens + np.cumsum(tokens) > cap))
        if len(over) == 0:
            return over, ""
        first = int(over[0])
        limit = (
            f"{cap} ({self.policy.bulk_queue_share:g} of max_queued_tokens, the rest kept for interactive "
            "requests)"
            if is_bulk
            else f"max_queued_tokens={cap}"
        )
        return np.flatnonzero(live[first:]) + first, (
            f"queue full{' for bulk work' if is_bulk else ''}: {self._queued_tokens} tokens queued, "
            f"{int(tokens[first:].sum())} more would pass {limit}"
        )

    def cancel(self, group: RequestGroup, requests: np.ndarray) -> None:
        """Drop requests (the caller left or gave up): their waiting sequences leave the queue and
        their tokens go back to the cap; no answer is sent."""
        cancelled, released = group.finish(requests)
        self._release(group, released)
        if len(cancelled):
            self._hooks.request_finished(
                time.perf_counter() - group.admitted_at, group.priority.label, len(cancelled)
            )

    def _finish(self, group: RequestGroup, requests: np.ndarray, error: BaseException) -> None:
        """Fail requests of `group` with `error` (those not settled yet), telling its sink."""
        failed, released = group.finish(requests)
        self._release(group, released)
        if len(failed):
            group.sink.failed(group, failed, error)
            self._hooks.request_finished(
                time.perf_counter() - group.admitted_at, group.priority.label, len(failed)
            )

    def _release(self, group: RequestGroup, num_tokens: int) -> None:
        if group.is_queued:
            self._queued_tokens -= num_tokens
            if group.priority == Priority.BULK:
                self._queued_bulk_tokens -= num_tokens

    # --- the loop ---

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            self._launch_what_fits()

    def _launch_what_fits(self) -> None:
        """Give every path with room its next batch, until none has room or work for it."""
        now = time.perf_counter()
        for path in (self.main, self.lane):
            while path is not None and path.has_room:
                batch = self._take(path, now)
                if not batch:
                    break
                has_bulk = any(seg.group.priority == Priority.BULK for seg in batch)
                path.num_inflight += 1
                path.num_bulk_inflight += has_bulk
                path.num_batches += 1
                task = asyncio.create_task(self._execute(batch, path, has_bulk))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    def _main_has_bulk(self) -> bool:
        return self.main.num_bulk_inflight > 0 or bool(self._queue.bulk)

    def _take(self, path: DevicePath, now: float) -> list[Segment]:
        queue = self._queue
        if path is self.lane:  # queries beside bulk work only (module docstring)
            return queue.take_lane(path.max_tokens, path.max_sequences) if self._main_has_bulk() else []
        if queue.is_holding_bulk(path.num_inflight, now):
            return []
        with_interactive = self.lane is None or not self._main_has_bulk()
        return queue.take(path.max_tokens, path.max_sequences, now, with_interactive=with_interactive)

    async def _execute(self, batch: list[Segment], path: DevicePath, has_bulk: bool) -> None:
        started = time.perf_counter()
        for seg in batch:
            if len(seg.started):
                group = seg.group
                self._hooks.queue_waited(started - group.admitted_at, group.priority.label, len(seg.started))
        num_seqs, num_tokens = batch_size(batch)
        try:
            packed = path.runner.pack(*pack_arguments(batch))
            packed_at = time.perf_counter()
            step, is_ok = self.steps.started(num_tokens), False
            try:
                rows, launched_at, ready_at = await path.run(packed, num_seqs)
                is_ok = True
            finally:
                self.steps.finished(step, num_tokens if path is self.main else 0, is_ok=is_ok)
            finished = time.perf_counter()
            num_bulk = sum(seg.num_tokens for seg in batch if seg.group.priority == Priority.BULK)
            self._hooks.batch_launched(num_seqs, num_tokens, num_bulk)
            self._hooks.batch_finished(finished - started)
            self._hooks.batch_stages(
                packed_at - started, launched_at - packed_at, ready_at - launched_at, finished - ready_at
            )
        except Exception as exc:  # a failed batch fails its requests, never the loop
            log.exception("batch of %d sequences failed", num_seqs)
            for seg in batch:
                group = seg.group
                owners = (
                    seg.seqs if group.request_of_seq is None else np.unique(group.request_of_seq[seg.seqs])
                )
                self._finish(group, owners, exc)
        else:
            self._deliver(batch, rows)
        finally:
            path.num_inflight -= 1
            path.num_bulk_inflight -= has_bulk
            self._wake.set()  # room on the path, and a step held back for this one may go now

    def _deliver(self, batch: list[Segment], rows: np.ndarray) -> None:
        now = time.perf_counter()
        at = 0
        for seg in batch:
            group = seg.group
            num_rows = group.num_rows_of(seg.seqs)
            answered, released = group.deliver(seg.seqs, rows[at : at + num_rows])
            at += num_rows
            self._release(group, released)
            if len(answered):
                group.sink.answered(group, answered)
                self._hooks.request_finished(now - group.admitted_at, group.priority.label, len(answered))
        assert at == len(rows), "the engine answers one row per span and per other sequence"

    def _is_idle(self) -> bool:
        return not self._queue and not self._tasks
