"""Whole-model CUDA graphs per bucket, captured lazily: eager on a bucket's first hit, captured on its
second, replayed from then on; all graphs share one memory pool and one static input block.

`CapturePolicy` is the state machine (plain Python, tested on the CPU); `GraphCache` applies it with
torch.cuda.CUDAGraph. Per-bucket hit counts are what the operator reads to prewarm hot buckets.
"""

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kembed.worker.buckets import Bucket

log = logging.getLogger(__name__)

REPLAY, CAPTURE = "replay", "capture"
COLD, FULL, DISABLED, UNCAPTURABLE = "cold", "full", "disabled", "uncapturable"  # eager reasons
EAGER_REASONS = (COLD, UNCAPTURABLE, DISABLED, FULL)


@dataclass
class BucketState:
    hits: int = 0
    is_captured: bool = False


class CapturePolicy:
    """Decides, per hit, whether a bucket replays, is captured now, or runs eagerly (and why)."""

    def __init__(self, max_graphs: int, is_enabled: bool = True, capture_after: int = 1) -> None:
        self.max_graphs = max_graphs
        self.is_enabled = is_enabled
        self.capture_after = capture_after  # eager hits before a capture: 1 = capture on the second
        self.states: dict[Bucket, BucketState] = {}
        self.eager_reasons: Counter[str] = Counter()
        self.num_captured = 0

    def decide(self, bucket: Bucket | None) -> str:
        if bucket is None:
            self.eager_reasons[UNCAPTURABLE] += 1
            return UNCAPTURABLE
        state = self.states.setdefault(bucket, BucketState())
        state.hits += 1
        if state.is_captured:
            return REPLAY
        if not self.is_enabled:
            reason = DISABLED
        elif state.hits <= self.capture_after:
            reason = COLD
        elif self.num_captured >= self.max_graphs:
            reason = FULL
        else:
            return CAPTURE
        self.eager_reasons[reason] += 1
        return reason

    def eager_counts(self) -> dict[str, int]:
        """Eager steps by reason, every reason present. Safe from another thread: it reads the known
        keys one by one (a Counter's missing key reads 0 without being inserted), never iterates."""
        return {reason: self.eager_reasons[reason] for reason in EAGER_REASONS}

    def captured(self, bucket: Bucket) -> None:
        state = self.states.setdefault(bucket, BucketState())
        if not state.is_captured:
            state.is_captured = True
            self.num_captured += 1


class GraphCache:
    """Captured graphs keyed by bucket. `forward(bucket)` runs the model on the static input block
    sliced to the bucket and returns its output tensor; captured, that tensor is the graph's static
    output, overwritten by each replay (the engine copies it out on the same stream first)."""

    def __init__(self, forward: Callable[[Bucket], torch.Tensor], policy: CapturePolicy) -> None:
        self._forward = forward
        self.policy = policy
        self._graphs: dict[Bucket, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool = torch.cuda.graph_pool_handle()
        self.num_replays = 0
        self.capture_seconds: list[float] = []

    def run(self, bucket: Bucket | None) -> torch.Tensor:
        decision = self.policy.decide(bucket)
        if decision == CAPTURE:
            self.capture(bucket)
        if decision in (REPLAY, CAPTURE):
            graph, output = self._graphs[bucket]
            graph.replay()
            self.num_replays += 1
            return output
        return self._forward(bucket)

    def capture(self, bucket: Bucket) -> None:
        """Capture `bucket` now (prewarm, or a second hit). Runs on the calling (launcher) thread."""
        if bucket in self._graphs:
            return
        started = time.perf_counter()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up outside capture: lazy inits, workspace allocation
            self._forward(bucket)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # relaxed: the waiter thread may synchronise on events while this thread captures, and a
        # JIT-compiled kernel (flash-attn-4's CuTe DSL) may load its module on the capturing thread.
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="relaxed"):
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
