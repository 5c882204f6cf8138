"""Whether the worker is stalled, and the rate its device serves: what its health tells the gateway.

`StepWatch` times every device step the scheduler runs. A step still running after `multiple`
times what steps of its size have taken (an average over the recent ones, at least `min_s`), or
after `unseen_s` for a size not seen yet (a first step may compile kernels or capture a graph), is
*stalled*: a hung kernel, a wedged driver, a GPU fallen off the bus, never a step that is merely
slow. Two things make a step slow without its device being stuck, and neither counts:
- the whole process not running (SIGSTOP, a frozen cgroup, a host that did not schedule it): steps
  are timed on a clock that advances only while the worker's loop turns, each gap between the
  watch's looks counting `max_gap_s` at most (a step in flight across a 1.5 s stop read as run
  1.5 s against a 1 s limit, and the lone worker behind a gateway answered 503 for the rest of
  each cycle);
- a CPU device short of CPU (a loaded host): with `progress` (the process's CPU time, on a CPU
  engine) a step past its limit is stalled only if the process has done less than
  `min_progress_share` of a core's work since it began; a step that computes, however slowly, is
  computing. A deadlocked CPU step is found this way, one stuck in a loop that burns CPU is not.

The worker then answers its health checks NOT_SERVING with the reason, so gateways stop sending to
it and move what it holds (a gateway with no other replica keeps it: gateway/pool/workers.py), the
pod leaves its Service, and the liveness probe restarts it if it stays so
(readiness.py `Readiness`). A worker whose event loop stops turning cannot answer at all; the
gateway's probe then times out, which it treats the same way (gateway/pool/attempts.py), and
`LoopWatch`, a thread, logs where the loop is stuck.

It also measures the device's rate: tokens per second over the recent batches of at least a
quarter of the budget, each timed from its launch or the previous batch's end, whichever is later
(so two batches in flight are not counted twice). Before any, a start-up step sets it
(`__main__`). Plain Python; the scheduler calls it from the event loop.
"""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

RATE_WEIGHT = 0.2  # weight of the newest batch in the rate's moving average
STEP_WEIGHT = 0.2  # likewise for the expected time of a step of one size


def size_key(num_tokens: int) -> int:
    """Steps of about one size share an expectation: tokens rounded up to a multiple of 64 up to
    1024, of 256 above (the CUDA engine's token buckets)."""
    step = 64 if num_tokens <= 1024 else 256
    return -(-num_tokens // step) * step


@dataclass
class StepWatch:
    """See the module docstring. `min_batch_tokens`: the smallest batch the rate counts;
    `max_gap_s`: the most one gap between calls of `stall` (the watch's looks) adds to the clock
    steps are timed on (inf: the wall clock); `progress`: the process's CPU seconds (CPU engines),
    None where the device's own progress cannot be seen (a GPU's kernels)."""

    multiple: float = 10.0
    min_s: float = 1.0
    unseen_s: float = 30.0
    min_batch_tokens: int = 0
    clock: Callable[[], float] = time.perf_counter
    max_gap_s: float = math.inf
    progress: Callable[[], float] | None = None
    min_progress_share: float = 0.1
    tokens_per_s: float = 0.0  # 0: not measured yet
    _expected: dict[int, float] = field(default_factory=dict)  # size key -> seconds
    # step -> (size key, started on the live clock, progress then)
    _running: dict[int, tuple[int, float, float]] = field(default_factory=dict)
    _next: int = 0
    _last_finished: float = 0.0
    _live: float = 0.0  # the live clock at the last look
    _looked_at: float = math.nan  # clock() at the last look

    def live(self) -> float:
        """Seconds the worker has run: the wall clock, but a gap between looks counts `max_gap_s`
        at most (the process was stopped, or not scheduled: no step of it ran either)."""
        now = self.clock()
        if math.isnan(self._looked_at):
            self._looked_at = now
        return self._live + min(now - self._looked_at, self.max_gap_s)

    def _look(self) -> float:
        self._live = self.live()
        self._looked_at = self.clock()
        return self._live

    def started(self, num_tokens: int) -> int:
        """A step of `num_tokens` was launched; returns its handle for `finished`."""
        self._next += 1
        done = self.progress() if self.progress is not None else 0.0
        self._running[self._next] = (size_key(num_tokens), self.live(), done)
        return self._next

    def finished(self, step: int, num_tokens: int, *, is_ok: bool = True) -> None:
        key, started, _ = self._running.pop(step)
        now = self.live()
        if is_ok:
            took = now - started
            old = self._expected.get(key)
            self._expected[key] = took if old is None else STEP_WEIGHT * took + (1 - STEP_WEIGHT) * old
            busy = now - max(started, self._last_finished)
            if num_tokens >= self.min_batch_tokens and busy > 0:
                self.measured(num_tokens / busy)
        self._last_finished = now

    def measured(self, tokens_per_s: float) -> None:
        old = self.tokens_per_s
        self.tokens_per_s = tokens_per_s if old <= 0 else RATE_WEIGHT * tokens_per_s + (1 - RATE_WEIGHT) * old

    def stall(self) -> str | None:
        """Why the device is stalled now (the first overdue step that makes no progress), or None.
        Each call is a look: the gap since the last one moves the live clock (`live`)."""
        now = self._look()
        done = self.progress() if self.progress is not None else 0.0
        for key, started, done_then in self._running.values():
            expected = self._expected.get(key)
            limit = self.unseen_s if expected is None else max(self.min_s, self.multiple * expected)
            ran = now - started
            if ran <= limit:
                continue
            if self.progress is not None and done - done_then >= self.min_progress_share * ran:
                continue  # slow, not stuck: the process computes
            known = "none seen yet" if expected is None else f"{expected * 1000:.1f} ms expected"
            idle = "" if self.progress is None else f", {done - done_then:.2f} s of CPU since"
            return (
                f"stalled: a device step of ~{key} tokens has run {ran:.1f} s "
                f"({known}; limit {limit:.1f} s{idle})"
            )
        return None


class LoopWatch:
    """A thread that logs, once per stall, the event loop's stack when it has not turned for `limit_s`
    (a call that blocks the loop: it answers nothing meanwhile, health checks included)."""

    def __init__(self, limit_s: float = 2.0, beat_s: float = 0.1) -> None:
        self.limit_s, self.beat_s = limit_s, beat_s
        self.last_beat = time.monotonic()
        self._loop_thread = threading.get_ident()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="kembed-loop-watch", daemon=True)

    def beat(self) -> None:
        """Called on the loop every `beat_s`."""
        self.last_beat = time.monotonic()

    def start(self) -> None:
        self._loop_thread = threading.get_ident()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        is_reported = False
        period = self.limit_s / 4
        looked_at = time.monotonic()
        while not self._stop.wait(period):
            now = time.monotonic()
            # this thread overslept as much as the loop: the process was stopped, not the loop stuck
            was_stopped, looked_at = now - looked_at > period + self.limit_s / 2, now
            stuck_for = now - self.last_beat
            if was_stopped:
                self.last_beat = max(self.last_beat, now - period)
            elif stuck_for < self.limit_s:
                is_reported = False
            elif not is_reported:
                is_reported = True
                frame = sys._current_frames().get(self._loop_thread)
                where = "".join(traceback.format_stack(frame)) if frame is not None else "(no stack)"
                log.error("the event loop has not turned for %.1f s; it is at:\n%s", stuck_for, where)
