"""`BaseEngine`: what every engine is to the scheduler, the server and `serve`, and what the eager
engine (engine.py) and the CUDA engine (cuda_engine.py) share. Each writes only what differs: how a
batch is packed and launched, what a capture is, the smoke test's pair of runs."""

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Generic, TypeVar

import numpy as np
import torch

from kembed.worker.buckets import Bucket, BucketTable
from kembed.worker.engine.graphs import CapturePolicy, PrewarmReport
from kembed.worker.engine.models.served import ServedModel
from kembed.worker.engine.smoke import SmokeResult, smoke_test
from kembed.worker.info import EngineStats, ModelInfo
from kembed.worker.results import ResultHandle

BatchT = TypeVar("BatchT")  # what `pack` builds and `step` takes: each engine's own layout


class BaseEngine(ABC, Generic[BatchT]):
    """Runs one model on one device behind two calls: `pack` (host work, on the event loop) and `step`
    (launches, returns a `ResultHandle` at once). One launcher thread drives it (steps, prewarm,
    captures, smoke tests); `stats` is read from the metrics thread.

    `policy` counts every step's bucket hit and why it ran eagerly (graphs.py); an engine without
    CUDA graphs keeps one that is off, so its hits still feed the operator's hot list. `lane` is an
    engine of its own for small interactive batches beside this one's (the CUDA engine's), or None.
    `buckets` is the table batches are bucketed by and the server checks admin calls against.

    It is the scheduler's `BatchRunner` and the server's `EngineOps` (mypy checks both where `serve`
    takes it); `can_launch_inline` and `capture_deferred` answer as an engine without CUDA graphs."""

    def __init__(
        self,
        model: ServedModel,
        info: ModelInfo,
        device: torch.device,
        buckets: BucketTable,
        policy: CapturePolicy,
    ) -> None:
        self.model = model
        self.info = info
        self.device = device
        self.buckets = buckets
        self.policy = policy
        self.lane: BaseEngine[BatchT] | None = None

    @abstractmethod
    def pack(
        self,
        token_ids: np.ndarray,
        lengths: np.ndarray,
        token_type_ids: np.ndarray | None = None,
        spans: Sequence[np.ndarray | None] | None = None,
        outputs: np.ndarray | None = None,
    ) -> BatchT:
        """A ragged batch laid out for `step`: `token_ids` [num_tokens] int32, `lengths` [num_seqs];
        `spans`: per sequence, None or its span boundaries (spans.py); `outputs`: per sequence its
        Output bitmask (several outputs from one pass, payload.py; never with spans), None: dense
        rows alone. Host work only."""

    @abstractmethod
    def step(self, batch: BatchT) -> ResultHandle:
        """Launch `batch`; its rows [num_rows, dimensions] come through the handle."""

    def can_launch_inline(self, batch: BatchT) -> bool:
        """Whether `step(batch)` is only cheap host work (a captured graph's replay), so the scheduler
        may call it from the event loop. Here never: every step is a whole eager forward."""
        return False

    @abstractmethod
    def captured_buckets(self) -> list[Bucket]:
        """The buckets a smoke test of "every captured bucket" runs, sorted."""

    @abstractmethod
    def prewarm(self, buckets: list[Bucket]) -> list[Bucket]:
        """Capture `buckets` now (the operator's prewarm Job); returns those captured."""

    @abstractmethod
    def prewarm_at_start(
        self, prewarm: str | Sequence[Bucket], hot: Sequence[Bucket], max_seconds: float
    ) -> PrewarmReport | None:
        """Before the server opens: `hot`, then `prewarm` (`"all"`, `"none"` or buckets), within
        `max_seconds`."""

    def capture_deferred(self, max_seconds: float) -> int:
        """Capture what could not be captured before serving; how many were. Here nothing ever is."""
        return 0

    @abstractmethod
    def compare(self, token_ids: np.ndarray, lengths: np.ndarray) -> tuple[Bucket, np.ndarray, np.ndarray]:
        """(bucket, reference rows, candidate rows) of one batch: the smoke test's pair."""

    def smoke_test(self, buckets: list[Bucket], min_cosine: float, seed: int) -> list[SmokeResult]:
        return smoke_test(self, buckets, min_cosine, seed)

    def bucket_stats(self) -> list[tuple[Bucket, int, bool]]:
        """(bucket, hits, is_captured) for every bucket hit or captured."""
        states = self.policy.states
        captured = set(self.captured_buckets())
        buckets = sorted(set(states) | captured)
        return [(b, states[b].hits if b in states else 0, b in captured) for b in buckets]

    def stats(self) -> EngineStats:
        """Counters and memory now. Called from the metrics thread: it only reads (the allocator's
        counters are thread-safe; the policy's readers are written for it). The fields an engine
        without graphs has; the CUDA engine adds its ring's and graphs'."""
        gpu_bytes = torch.cuda.memory_reserved(self.device) if self.device.type == "cuda" else 0
        return EngineStats(
            gpu_memory_bytes=gpu_bytes,
            eager_steps=self.policy.eager_counts(),
            bucket_hits=self.policy.hit_counts(),
        )

    def named_buckets(self, prewarm: str | Sequence[Bucket], hot: Sequence[Bucket]) -> list[Bucket]:
        """`hot`, then a listed `prewarm`'s buckets (none for `"all"` or `"none"`), each once, in
        order, those this engine's table can form."""
        listed: Sequence[Bucket] = () if isinstance(prewarm, str) else prewarm
        return [b for b in dict.fromkeys([*hot, *listed]) if self.buckets.fits(b)]
