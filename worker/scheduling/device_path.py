"""A device path: one way batches reach the device, and everything that belongs to it.

An engine (`runner`), the most batches in flight on it at once, the budget of its batches (tokens,
sequences), a launcher thread that keeps its device work in launch order, and a waiter thread, so
that waiting for batch N never delays the launch of N+1 and the event loop never blocks on the
device. The scheduler has a main path and, on a CUDA engine with an interactive lane (a second
stream whose steps run beside the main one's), a lane path: two instances of this class.

A batch whose step only replays a captured graph (`can_launch_inline`) is launched from the event
loop while the launcher thread is idle (`is_inline`), saving the hand-off to that thread (a thread
wake-up, on the path of every query); other batches, and every call that captures or runs eagerly, go
through the launcher thread. The rows of one such batch at a time are polled for on the loop
(`ResultHandle.is_ready`, a CUDA event query that never blocks), saving the waiter thread's
wake-up of the loop as well; a second batch in flight is waited for on the waiter thread (the CUDA
engine makes its event a blocking one, so a busy worker does not spin a core on it).
Torch-free and proto-free: the engine is reached only through `BatchRunner`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np

from kembed.worker.results import ResultHandle

log = logging.getLogger(__name__)

IDLE_CAPTURE_SLICE_S = 0.01  # captures started per call: in effect one at a time
# A batch of at most this many sequences alone on the device is polled for on the loop: a few queries
# on a worker that is otherwise idle, whose every tenth of a millisecond shows. A larger batch, or one
# behind another, is waited for on the waiter thread, asleep: polling spins the loop for the whole
# step, and a busy worker would spend a core on it.
POLL_MAX_SEQUENCES = 16
Launched = tuple[np.ndarray, float, float]
"""A batch's rows, when its step returned and when its rows were on the host (perf_counter)."""


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


class DevicePath:
    """See the module docstring. `is_inline`: whether this path may launch replays from the loop."""

    def __init__(
        self,
        name: str,
        runner: BatchRunner,
        max_tokens: int,
        max_sequences: int,
        max_inflight: int,
        *,
        is_inline: bool = True,
    ) -> None:
        self.name = name
        self.runner = runner
        self.max_tokens = max_tokens
        self.max_sequences = max_sequences
        self.max_inflight = max_inflight
        self.num_inflight = 0  # batches taken for this path and not yet finished
        self.num_bulk_inflight = 0  # of which holding bulk work
        self.num_batches = 0  # batches run since start
        self.num_threaded = 0  # launcher-thread jobs (batches until their rows are back, device calls)
        self._is_inline = is_inline
        self._num_polled = 0  # batches whose completion the loop is polling for now (0 or 1)
        self._num_launched = 0  # batches handed to the device (or its launcher) and not yet back
        prefix = "kembed" if name == "main" else f"kembed-{name}"  # kembed-launch, kembed-lane-launch
        self._launcher = ThreadPoolExecutor(1, thread_name_prefix=f"{prefix}-launch")
        self._waiter = ThreadPoolExecutor(1, thread_name_prefix=f"{prefix}-wait")

    @property
    def has_room(self) -> bool:
        return self.num_inflight < self.max_inflight

    def close(self) -> None:
        for executor in (self._launcher, self._waiter):
            executor.shutdown(wait=True)

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` on the launcher thread, in order with the batches (prewarm, smoke tests,
        captures): the engine is never driven from two threads, and the loop never blocks on it."""
        self.num_threaded += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._launcher, fn, *args)
        finally:
            self.num_threaded -= 1

    async def capture_when_idle(self, is_idle: Callable[[], bool], check_s: float) -> None:
        """Captures what the engine deferred (`capture_deferred`), one short slice at a time and only
        while the worker `is_idle`, so a request that arrives meanwhile waits for at most one capture
        (~20 ms for a BGE-M3-sized model). Asks again only after new batches, which may have found a
        bucket uncovered. Runs until cancelled."""
        batches_seen = -1
        while True:
            await asyncio.sleep(check_s)
            idle = is_idle() and self.num_threaded == 0
            if not idle or batches_seen == self.num_batches:
                continue
            batches_seen = self.num_batches
            try:
                while idle and await self.call(self.runner.capture_deferred, IDLE_CAPTURE_SLICE_S):
                    idle = is_idle()
            except RuntimeError:  # the launcher is shut down: closing
                return
            except Exception:
                log.exception("capturing deferred buckets failed")

    async def run(self, packed: Any, num_seqs: int) -> Launched:
        """Launch a packed batch of `num_seqs` sequences and wait for its rows."""
        self._num_launched += 1
        try:
            if self._is_inline and self.num_threaded == 0 and self.runner.can_launch_inline(packed):
                return await self._inline(packed, is_small=num_seqs <= POLL_MAX_SEQUENCES)
            return await self._threaded(packed)
        finally:
            self._num_launched -= 1

    async def _inline(self, packed: Any, *, is_small: bool) -> Launched:
        """Launched from the loop: the launcher thread is idle, so the engine is still driven by one
        thread at a time. A small batch alone is polled for on the loop; any other is waited for on
        the waiter thread (POLL_MAX_SEQUENCES)."""
        pending = self.runner.step(packed)
        launched_at = time.perf_counter()
        # Polled only when alone on the device: a busy worker, whose every batch is launched behind
        # another, would otherwise spin its loop at every turn for as long as the device is busy;
        # those batches are waited for on the waiter thread, their events blocking (cuda_engine.py).
        if is_small and self._num_polled == 0 and self._num_launched == 1:
            self._num_polled += 1
            try:
                await _poll(pending.is_ready)
            finally:
                self._num_polled -= 1
            ready_at = time.perf_counter()
            return pending.wait(), launched_at, ready_at

        def wait() -> tuple[np.ndarray, float]:  # on the waiter thread: ready_at before the hand-off
            rows = pending.wait()
            return rows, time.perf_counter()

        rows, ready_at = await asyncio.get_running_loop().run_in_executor(self._waiter, wait)
        return rows, launched_at, ready_at

    def _threaded(self, packed: Any) -> asyncio.Future[Launched]:
        """Launched on the launcher thread, which hands the pending result straight to the waiter
        thread, so the loop is woken once per batch (when its rows are on the host), not once for
        the launch and once for the rows."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Launched] = loop.create_future()
        self.num_threaded += 1

        def settle(result: Launched | None, error: BaseException | None) -> None:  # on the loop
            self.num_threaded -= 1
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                assert result is not None
                future.set_result(result)

        def settle_threadsafe(result: Launched | None, error: BaseException | None) -> None:
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
                pending = self.runner.step(packed)
                self._waiter.submit(wait, pending, time.perf_counter())
            except BaseException as error:
                settle_threadsafe(None, error)

        self._launcher.submit(launch)
        return future


def _poll(is_ready: Callable[[], bool]) -> asyncio.Future[None]:
    """Resolves once `is_ready()`; asks once per turn of the loop, so the loop keeps reading sockets
    and running other callbacks meanwhile (a turn with callbacks pending polls its sockets without
    sleeping). Against the waiter thread it saves that thread's wake-up of the loop and its hand-over
    of the GIL (docs/benchmarks-history.md). On a CPU engine there is nothing to poll (it never
    launches inline)."""
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
