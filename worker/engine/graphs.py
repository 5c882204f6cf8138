"""Whole-model CUDA graphs per bucket: captured at start (prewarm) or lazily, replayed per batch; all
graphs share one memory pool and one static input block.

Two policies, one state machine. Lazy (no start-up prewarm): eager on a bucket's first hit, captured
on its second, replayed from then on. Prewarmed (after `finish_prewarm`): the serving path never
captures; a batch pads up to the smallest captured bucket that holds it (`PadUpTable`), and one that
no captured bucket holds runs eagerly (reason `uncovered`) and is remembered for `capture_deferred`,
which the scheduler calls when the worker is idle.

`CapturePolicy` and `capture_in_order` are plain Python (tested on the CPU); `GraphCache` applies
them with torch.cuda.CUDAGraph. Per-bucket hit counts are what the operator reads to prewarm hot
buckets.
"""

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from kembed.worker.buckets import Bucket, BucketTable, PadUpTable
from kembed.worker.info import COLD, DISABLED, EAGER_REASONS, FULL, UNCAPTURABLE, UNCOVERED

log = logging.getLogger(__name__)

REPLAY, CAPTURE = "replay", "capture"


@dataclass
class BucketState:
    hits: int = 0
    is_captured: bool = False


class CapturePolicy:
    """Decides, per hit, whether a bucket replays, is captured now, or runs eagerly (and why), and
    which captured bucket a batch pads up to once prewarm has run.

    Mutated on the launcher thread only (steps, captures); `pad_up` is read on the event loop by
    `pack`: it is replaced whole on each capture, never edited in place, and captures are never
    dropped, so a batch packed against an older table still finds its bucket captured."""

    def __init__(
        self,
        max_graphs: int,
        is_enabled: bool = True,
        capture_after: int = 1,
        table: BucketTable | None = None,
    ) -> None:
        self.max_graphs = max_graphs
        self.is_enabled = is_enabled
        self.capture_after = capture_after  # eager hits before a lazy capture: 1 = capture on the second
        self.table = table or BucketTable(max_tokens=64, max_seqs=1)
        self.states: dict[Bucket, BucketState] = {}
        self.eager_reasons: Counter[str] = Counter()
        self.num_captured = 0
        # After finish_prewarm: no capture on the serving path, pad-up instead.
        self.is_prewarmed = False
        self.pad_up = PadUpTable(self.table)
        # Buckets that ran uncovered after prewarm, in first-hit order: capture_deferred takes them first.
        self.deferred: dict[Bucket, None] = {}
        self.num_serving_captures = 0  # captures made inside a step; stays 0 once prewarm has run
        self.backlog: list[Bucket] = []  # what a budget-cut prewarm left, in its order

    def decide(self, bucket: Bucket | None, run: Bucket | None = None) -> str:
        """`bucket` is the batch's own bucket (its hit is counted there), `run` the bucket it was
        padded to (its own unless pad-up chose a larger captured one)."""
        if bucket is None:
            self.eager_reasons[UNCAPTURABLE] += 1
            return UNCAPTURABLE
        state = self.states.setdefault(bucket, BucketState())
        state.hits += 1
        if self.is_captured(run or bucket):
            return REPLAY
        if not self.is_enabled:
            reason = DISABLED
        elif self.is_prewarmed:
            # Never a capture while traffic waits: run it eagerly now, capture it when idle.
            reason = FULL if self.num_captured >= self.max_graphs else UNCOVERED
            if reason == UNCOVERED:
                self.deferred.setdefault(bucket)
        elif state.hits <= self.capture_after:
            reason = COLD
        elif self.num_captured >= self.max_graphs:
            reason = FULL
        else:
            self.num_serving_captures += 1
            return CAPTURE
        self.eager_reasons[reason] += 1
        return reason

    def is_captured(self, bucket: Bucket) -> bool:
        state = self.states.get(bucket)
        return state is not None and state.is_captured

    def serving_bucket(self, bucket: Bucket | None, num_seqs: int, num_tokens: int) -> Bucket | None:
        """The bucket a batch runs in: once prewarmed, the smallest captured one that holds it (its
        own if captured), else its own."""
        if not self.is_prewarmed or bucket is None:
            return bucket
        return self.pad_up.lookup(num_seqs, num_tokens) or bucket

    def is_full(self) -> bool:
        return not self.is_enabled or self.num_captured >= self.max_graphs

    def eager_counts(self) -> dict[str, int]:
        """Eager steps by reason, every reason present. Safe from another thread: it reads the known
        keys one by one (a Counter's missing key reads 0 without being inserted), never iterates."""
        return {reason: self.eager_reasons[reason] for reason in EAGER_REASONS}

    def hit_counts(self) -> dict[str, int]:
        """Hits per bucket (`"8x512"`), for buckets hit at least once. Safe from another thread: the
        launcher thread adds keys to `states`, but `dict.copy` runs in C without calling back into
        Python (the keys' hashes are stored), so no step can insert mid-copy; the hits are ints."""
        return {str(bucket): state.hits for bucket, state in self.states.copy().items() if state.hits}

    def captured(self, bucket: Bucket) -> None:
        state = self.states.setdefault(bucket, BucketState())
        if not state.is_captured:
            state.is_captured = True
            self.num_captured += 1
            self.deferred.pop(bucket, None)
            self.pad_up = PadUpTable(self.table, (b for b, s in self.states.items() if s.is_captured))

    def prewarm(
        self,
        order: Iterable[Bucket],
        capture: Callable[[Bucket], None],
        max_seconds: float,
        clock: Callable[[], float] = time.perf_counter,
    ) -> "PrewarmReport":
        """Capture `order` within `max_seconds` (`capture(bucket)` must end in `captured`), keep
        what is left for `capture_deferred`, and switch to the prewarmed policy: from now on a step
        never captures, it pads up, or runs eagerly and defers the capture."""
        order = list(order)
        report = capture_in_order(order, capture, self, max_seconds, clock)
        self.backlog = [b for b in order if not self.is_captured(b)]
        self.is_prewarmed = True
        return report

    def capture_deferred(
        self,
        capture: Callable[[Bucket], None],
        max_seconds: float,
        clock: Callable[[], float] = time.perf_counter,
    ) -> "PrewarmReport":
        """Capture, within `max_seconds`, the buckets serving ran uncovered (first-hit order), then
        what prewarm left."""
        wanted = list(dict.fromkeys([*self.deferred, *self.backlog]))
        report = capture_in_order(wanted, capture, self, max_seconds, clock)
        self.backlog = [b for b in self.backlog if not self.is_captured(b)]
        return report


@dataclass(frozen=True)
class PrewarmReport:
    """What a budgeted capture run did (logged at start-up; `capture_deferred` returns its count)."""

    num_planned: int  # buckets it set out to capture (already captured ones included)
    num_captured: int  # captured by this run
    num_already: int  # found captured
    seconds: float
    stopped_by: str  # "" (all done), "budget" or "max_graphs"

    @property
    def is_cut_short(self) -> bool:
        return bool(self.stopped_by)


def capture_in_order(
    buckets: Iterable[Bucket],
    capture: Callable[[Bucket], None],
    policy: CapturePolicy,
    max_seconds: float,
    clock: Callable[[], float] = time.perf_counter,
) -> PrewarmReport:
    """Capture `buckets` in order until done, out of time or at the graph cap. No capture starts
    once `max_seconds` have passed (the one in progress finishes: a capture is ~20 ms, a first use
    of a JIT-compiled kernel seconds)."""
    started = clock()
    planned = list(buckets)
    num_captured = num_already = 0
    stopped_by = ""
    for bucket in planned:
        if policy.is_captured(bucket):
            num_already += 1
            continue
        if policy.is_full():
            stopped_by = "max_graphs"
            break
        if clock() - started >= max_seconds:
            stopped_by = "budget"
            break
        capture(bucket)
        num_captured += 1
    return PrewarmReport(len(planned), num_captured, num_already, clock() - started, stopped_by)


class GraphCache:
    """Captured graphs keyed by bucket. `forward(bucket)` runs the model on the static input block
    laid out for the bucket and returns its output tensor; captured, that tensor is the graph's
    static output, overwritten by each replay (the engine copies it out on the same stream first)."""

    def __init__(
        self,
        forward: Callable[[Bucket], torch.Tensor],
        policy: CapturePolicy,
        capture_stream: torch.cuda.Stream | None = None,
    ) -> None:
        self._forward = forward
        self.policy = policy
        self._graphs: dict[Bucket, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool = torch.cuda.graph_pool_handle()
        # Every graph of this cache is captured on this one stream. cuBLAS keeps a workspace per
        # stream and a graph bakes in the one of the stream it was captured on; its split-K kernels
        # synchronise their blocks through it. Two caches whose graphs run at the same time (the
        # interactive lane's beside the bulk steps') must capture on different streams: on H200
        # two such graphs sharing torch's default capture stream hung the GPU.
        self._capture_stream = capture_stream or torch.cuda.Stream()
        self.num_replays = 0
        self.capture_seconds: list[float] = []

    def run(self, bucket: Bucket | None, run: Bucket | None = None) -> torch.Tensor:
        """Replay, capture or run eagerly the batch whose own bucket is `bucket`, padded to `run`."""
        run = run or bucket
        assert run is not None, "a batch runs in its own bucket or a larger one"
        decision = self.policy.decide(bucket, run)
        if decision == CAPTURE:
            self.capture(run)
        if decision in (REPLAY, CAPTURE):
            graph, output = self._graphs[run]
            graph.replay()
            self.num_replays += 1
            return output
        return self._forward(run)

    def capture(self, bucket: Bucket) -> None:
        """Capture `bucket` now (prewarm, idle time, or a lazy second hit). Runs on the calling
        (launcher) thread."""
        if bucket in self._graphs:
            return
        started = time.perf_counter()
        stream = self._capture_stream
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up outside capture: lazy inits, workspace allocation
            self._forward(bucket)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # relaxed: the waiter thread may synchronise on events while this thread captures, another
        # thread may launch the interactive lane's graphs, and a JIT-compiled kernel (flash-attn-4's
        # CuTe DSL) may load its module on the capturing thread.
        with torch.cuda.graph(graph, pool=self._pool, stream=stream, capture_error_mode="relaxed"):
            output = self._forward(bucket)
        self._graphs[bucket] = (graph, output)
        self.policy.captured(bucket)
        seconds = time.perf_counter() - started
        self.capture_seconds.append(seconds)
        free, total = torch.cuda.mem_get_info()
        log.info(
            "captured bucket %s in %.0f ms (%d graphs, %.1f GiB of %.1f GiB free)",
            bucket,
            seconds * 1e3,
            len(self._graphs),
            free / 2**30,
            total / 2**30,
        )

    def replay(self, bucket: Bucket) -> torch.Tensor:
        """Capture if needed, replay, return the static output (smoke tests; bypasses the policy)."""
        self.capture(bucket)
        graph, output = self._graphs[bucket]
        graph.replay()
        return output

    @property
    def num_resident(self) -> int:
        """Captured graphs held now (a len, safe to read from the metrics thread)."""
        return len(self._graphs)

    def is_captured(self, bucket: Bucket) -> bool:
        return bucket in self._graphs

    def captured_buckets(self) -> list[Bucket]:
        return sorted(self._graphs)
