"""A real worker process (gRPC server, scheduler, metrics) around a stand-in engine, for benchmarking
the request path alone: `python -P tests/bench/standin_worker.py [--step-ms MS] [--step-us-per-token US]
[--lane-slowdown X] [--dimensions N] [worker flags...]`.

The stand-in packs nothing and computes nothing; it answers each batch after `--step-ms` plus
`--step-us-per-token` times the batch's tokens of "device" time (both 0 by default: at once). Like a
GPU it runs one batch at a time, off the CPU: `wait()` sleeps (releasing the GIL) until the batch's
turn on the device has passed, so a 1.5 ms step emulates the H200's BGE-M3 step without costing this
machine's cores anything; 1.0 ms + 1.1 µs/token resembles its step against its token count (~10 ms
at 8192 tokens, docs/benchmarks.md, saturation), so a bulk step is long and a query's short. No torch
is imported.

Like the CUDA engine it has an interactive lane (`lane`, used by the scheduler when the worker's
classes and `interactive_lane` are on): a second stand-in with a device timeline of its own, so its
steps run beside the main one's instead of queueing behind them, as a second stream's kernels run
beside the first's. Sharing the device costs it: while the main timeline is busy a lane step
advances `--lane-slowdown` times slower (default 4: on the H200, BGE-M3 shape, a 4 x 16-token query
step took 3.9 ms beside back-to-back 8192-token steps against 0.9 ms alone; here such a step, 1.07 ms
alone, takes 4.3 ms beside them). Only the steps already queued on the main timeline when a lane
step starts slow it (one launched later does not), and the main timeline is not slowed by the lane's.
"""

import argparse
import logging
import sys
import threading
import time
from typing import NamedTuple

import numpy as np

from kembed.worker.__main__ import parse_config, run
from kembed.worker.buckets import Bucket
from kembed.worker.info import EngineStats, ModelInfo
from kembed.worker.results import ResultHandle


class _Pending(ResultHandle):
    def __init__(self, rows: np.ndarray, done_at: float) -> None:
        self._rows = rows
        self._done_at = done_at

    def is_ready(self) -> bool:  # as a CUDA event query: never blocks
        return time.perf_counter() >= self._done_at

    def wait(self) -> np.ndarray:
        delay = self._done_at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        return self._rows


class _Packed(NamedTuple):
    num_seqs: int
    num_tokens: int


class StandinEngine:
    """The engine interface the scheduler and server use, with a step time of a fixed part plus one
    per token, and constant rows. `beside`: the engine whose timeline this one (a lane) shares the
    device with, slowed by `slowdown` while that one is busy."""

    def __init__(
        self,
        info: ModelInfo,
        step_s: float,
        is_inline: bool = True,
        step_s_per_token: float = 0.0,
        beside: "StandinEngine | None" = None,
        slowdown: float = 1.0,
    ) -> None:
        self.info = info
        self._step_s = step_s
        self._step_s_per_token = step_s_per_token
        self._is_inline = is_inline
        self._device_free_at = 0.0
        self._lock = threading.Lock()
        self._beside = beside
        self._slowdown = slowdown
        self.lane: StandinEngine | None = None
        self.buckets = None  # no bucket table: admin calls take any batch shape
        row = np.ones(info.dimensions, dtype=np.float32)
        self._row = row / np.linalg.norm(row)

    def add_lane(self, slowdown: float) -> None:
        """An interactive lane: same step times, its own timeline, `slowdown` times slower while
        this engine's timeline is busy."""
        self.lane = StandinEngine(
            self.info, self._step_s, self._is_inline, self._step_s_per_token, beside=self, slowdown=slowdown
        )

    def _duration(self, start: float, step_s: float) -> float:
        """Seconds a step of `step_s` alone takes from `start`: on a lane, `slowdown` times longer for
        as long as the main timeline is busy (up to its free time as known now)."""
        if self._beside is None:
            return step_s
        busy_s = self._beside._device_free_at - start
        if busy_s <= 0:
            return step_s
        if step_s * self._slowdown <= busy_s:
            return step_s * self._slowdown
        return busy_s + (step_s - busy_s / self._slowdown)

    def pack(self, token_ids: np.ndarray, lengths: np.ndarray, token_type_ids: np.ndarray | None = None):
        return _Packed(len(lengths), len(token_ids))

    def can_launch_inline(self, packed: _Packed) -> bool:
        return self._is_inline  # like a GPU engine whose every bucket is captured: a step is a replay

    def capture_deferred(self, max_seconds: float) -> int:
        return 0  # every bucket "captured" before serving: nothing deferred

    def step(self, packed: _Packed) -> _Pending:
        step_s = self._step_s + self._step_s_per_token * packed.num_tokens
        with self._lock:  # batches queue on the device one after another
            start = max(time.perf_counter(), self._device_free_at)
            self._device_free_at = start + self._duration(start, step_s)
            done_at = self._device_free_at
        rows = np.broadcast_to(self._row, (packed.num_seqs, self.info.dimensions))
        return _Pending(rows, done_at)

    def stats(self) -> EngineStats:
        return EngineStats()

    def captured_buckets(self) -> list[Bucket]:
        return []

    def bucket_stats(self) -> list[tuple[Bucket, int, bool]]:
        return []

    def prewarm(self, buckets: list[Bucket]) -> list[Bucket]:
        return list(buckets)

    def prewarm_at_start(self, prewarm, hot, max_seconds: float) -> None:
        pass  # nothing to capture

    def smoke_test(self, buckets: list[Bucket], min_cosine: float, seed: int) -> list:
        return []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--step-ms", type=float, default=0.0, help="emulated device time per batch")
    parser.add_argument(
        "--step-us-per-token", type=float, default=0.0, help="emulated device time per token of a batch"
    )
    parser.add_argument(
        "--lane-slowdown",
        type=float,
        default=4.0,
        help="how many times slower an interactive lane step runs while the main timeline is busy "
        "(H200: 3.9 ms beside bulk against 0.9 alone); the lane exists when the worker's classes and "
        "--interactive-lane are on, as on a GPU",
    )
    parser.add_argument("--dimensions", type=int, default=1024, help="vector size (BGE-M3: 1024)")
    parser.add_argument(
        "--no-inline", action="store_true", help="launch every batch on the launcher thread (the busy path)"
    )
    own, rest = parser.parse_known_args()
    config = parse_config(rest)
    logging.basicConfig(level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    info = ModelInfo(
        model_name="standin",
        model_type="bert",
        task="embed",
        dimensions=own.dimensions,
        max_sequence_length=8192,
        vocab_size=250002,  # XLM-R's: any tokenizer's ids fit
        pooling="cls",
        normalize=True,
        dtype="float32",
        device="standin",
        attention_backend="none",
    )
    if own.lane_slowdown < 1:
        parser.error("--lane-slowdown must be at least 1")
    engine = StandinEngine(
        info, own.step_ms / 1e3, is_inline=not own.no_inline, step_s_per_token=own.step_us_per_token / 1e6
    )
    if config.interactive_lane and config.priority_classes:  # as the CUDA engine gets one
        engine.add_lane(own.lane_slowdown)
    run(config, engine)


if __name__ == "__main__":
    sys.exit(main())
