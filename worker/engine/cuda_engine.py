"""The CUDA engine: ragged batches padded to buckets, replayed as whole-model CUDA graphs, results
handed back as LazyTensors while the next batch is prepared.

Stream order carries every dependency, so `step` never waits on the device: it stages the padded
batch in a pinned slot, copies it asynchronously into the static input block, replays (or captures,
or runs eagerly) the bucket's graph, copies the output rows into the same pinned slot, records an
event and returns. The next `step` may overwrite the static block at once: its copy is ordered
after this batch's kernels on the one stream.
"""

from collections.abc import Callable

import numpy as np
import torch

from kembed.worker.buckets import Bucket, BucketTable
from kembed.worker.engine.attention import AttentionMetadata
from kembed.worker.engine.graphs import CapturePolicy, GraphCache
from kembed.worker.engine.lazy import LazyTensor
from kembed.worker.engine.served import ServedModel
from kembed.worker.engine.smoke import SmokeResult, smoke_test
from kembed.worker.engine.staging import PaddedBatch, PinnedRing, Slot, pad_batch
from kembed.worker.info import EngineStats, ModelInfo


class CudaLazyTensor:
    """A launched batch: its rows land in a pinned slot when `event` fires. `wait` copies them out
    and gives the slot back to the ring (call it from a waiter thread, never the event loop)."""

    def __init__(self, ring: PinnedRing, slot: Slot, event: torch.cuda.Event, num_rows: int) -> None:
        self._ring, self._slot, self._event, self._num_rows = ring, slot, event, num_rows

    def wait(self) -> np.ndarray:
        self._event.synchronize()
        rows = self._slot.output[: self._num_rows].numpy().copy()
        self._ring.release(self._slot)
        return rows


class StaticInputs:
    """The one static input block every graph reads, on the device, sized for the largest bucket."""

    def __init__(self, max_tokens: int, max_seqs: int, device: torch.device) -> None:
        def zeros(n: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(n, dtype=dtype, device=device)

        self.input_ids = zeros(max_tokens, torch.int64)  # [max_tokens]
        self.position_ids = zeros(max_tokens, torch.int64)  # [max_tokens]
        self.token_type_ids = zeros(max_tokens, torch.int64)  # [max_tokens]
        self.seq_ids = zeros(max_tokens, torch.int64)  # [max_tokens]
        self.cu_seqlens = zeros(max_seqs + 2, torch.int32)  # [max_seqs + 2]

    def fill_neutral(self, bucket: Bucket) -> None:
        """A valid batch of the bucket's shape (one all-padding sequence, ids and positions 0), for
        captures with no real batch at hand: capture's warm-up runs the model on whatever the block
        holds, and a stale larger batch there would index past this bucket's rows."""
        tokens = bucket.num_tokens
        for tensor in (self.input_ids, self.position_ids, self.token_type_ids, self.seq_ids):
            tensor[:tokens].zero_()
        self.cu_seqlens[: bucket.num_seqs + 2].copy_(self.neutral_cu_seqlens(bucket))

    @staticmethod
    def neutral_cu_seqlens(bucket: Bucket) -> torch.Tensor:
        """The neutral batch's offsets on the host: [0, tokens, tokens, ...] (num_seqs + 2 values)."""
        offsets = torch.full((bucket.num_seqs + 2,), bucket.num_tokens, dtype=torch.int32)
        offsets[0] = 0
        return offsets

    def load(self, slot: Slot, bucket: Bucket) -> None:
        """Asynchronous host-to-device copies of the bucket's prefix of every input."""
        tokens, seqs = bucket.num_tokens, bucket.num_seqs + 2
        for name in ("input_ids", "position_ids", "token_type_ids", "seq_ids"):
            getattr(self, name)[:tokens].copy_(getattr(slot, name)[:tokens], non_blocking=True)
        self.cu_seqlens[:seqs].copy_(slot.cu_seqlens[:seqs], non_blocking=True)


class CudaEngine:
    """Runs one model on one GPU with lazily captured graphs. One launcher thread calls `step`."""

    def __init__(
        self,
        model: ServedModel,
        info: ModelInfo,
        device: torch.device,
        *,
        max_batch_tokens: int,
        max_batch_seqs: int,
        max_graphs: int,
        use_graphs: bool,
        inflight: int,
        max_pinned_bytes: int,
        attention: Callable | None = None,
    ) -> None:
        self.model = model
        # a backend that plans each batch on the host (flashinfer) gets the offsets before the forward
        self._plan_attention = getattr(attention, "plan_batch", None)
        self.info = info
        self.device = device
        self.buckets = BucketTable(max_batch_tokens, max_batch_seqs)
        self.static = StaticInputs(self.buckets.max_tokens, self.buckets.max_seqs, device)
        self.ring = PinnedRing(
            inflight,
            self.buckets.max_tokens,
            self.buckets.max_seqs,
            model.facts.output_size,
            max_pinned_bytes,
        )
        self.graphs = GraphCache(self._forward_static, CapturePolicy(max_graphs, use_graphs))

    def pack(
        self, token_ids: np.ndarray, lengths: np.ndarray, token_type_ids: np.ndarray | None = None
    ) -> PaddedBatch:
        """The batch laid out in its bucket (host arrays only; called on the event loop)."""
        bucket = self.buckets.lookup(len(lengths), int(lengths.sum()))
        return pad_batch(token_ids, lengths, token_type_ids, bucket)

    @torch.inference_mode()
    def step(self, batch: PaddedBatch) -> "CudaLazyTensor | LazyTensor":
        """Launch `batch`; return its rows lazily. No host synchronisation on this path."""
        if not batch.is_bucketed:
            return self._step_unbucketed(batch)
        slot = self.ring.acquire()
        slot.stage(batch)
        self.static.load(slot, batch.bucket)
        self._plan(slot.cu_seqlens[: batch.bucket.num_seqs + 2], slot)
        output = self.graphs.run(batch.bucket)
        slot.output[: batch.num_seqs].copy_(output[: batch.num_seqs], non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return CudaLazyTensor(self.ring, slot, event, batch.num_seqs)

    def _plan(self, host_cu_seqlens: torch.Tensor, scratch: object | None) -> None:
        if self._plan_attention is not None:
            self._plan_attention(host_cu_seqlens, scratch)

    def _meta(self, cu_seqlens: torch.Tensor, seq_ids: torch.Tensor, bucket: Bucket) -> AttentionMetadata:
        # max_seqlen is the bucket's token count: a bound every sequence (and the padding slot)
        # respects, and a value fixed by the key, so a captured graph never bakes in a stale one.
        return AttentionMetadata(
            cu_seqlens=cu_seqlens,
            max_seqlen=bucket.num_tokens,
            seq_ids=seq_ids,
            pad_index=None,
            unpad_index=None,
            key_mask=None,
            host_cu_seqlens=(),
        )

    def _forward_static(self, bucket: Bucket) -> torch.Tensor:
        tokens, s = bucket.num_tokens, self.static
        meta = self._meta(s.cu_seqlens[: bucket.num_seqs + 2], s.seq_ids[:tokens], bucket)
        return self.model(s.input_ids[:tokens], s.position_ids[:tokens], s.token_type_ids[:tokens], meta)

    def _step_unbucketed(self, batch: PaddedBatch) -> LazyTensor:
        """A batch larger than every bucket (the scheduler never forms one; direct callers may):
        eager, on inputs and an output buffer of its own rather than the ring's fixed slots."""
        self.graphs.policy.decide(None)  # counted as an uncapturable eager step

        def device(array: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(array).pin_memory().to(self.device, non_blocking=True)

        if self._plan_attention is not None:
            self._plan_attention(torch.from_numpy(batch.cu_seqlens).pin_memory(), None)
        meta = self._meta(device(batch.cu_seqlens), device(batch.seq_ids), batch.bucket)
        output = self.model(
            device(batch.input_ids), device(batch.position_ids), device(batch.token_type_ids), meta
        )[: batch.num_seqs]
        host = torch.empty(output.shape, dtype=torch.float32, pin_memory=True)
        host.copy_(output, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return LazyTensor(host, event, keepalive=(output,))

    @torch.inference_mode()
    def prewarm(self, buckets: list[Bucket]) -> list[Bucket]:
        """Capture each bucket now; returns those captured (new or already)."""
        for bucket in buckets:
            if not self.graphs.is_captured(bucket):
                self.static.fill_neutral(bucket)
                self._plan(self.static.neutral_cu_seqlens(bucket), None)
                self.graphs.capture(bucket)
        return [b for b in buckets if self.graphs.is_captured(b)]

    def bucket_stats(self) -> list[tuple[Bucket, int, bool]]:
        """(bucket, hits, is_captured) for every bucket hit or captured."""
        states = self.graphs.policy.states
        buckets = sorted(set(states) | set(self.graphs.captured_buckets()))
        return [(b, states[b].hits if b in states else 0, self.graphs.is_captured(b)) for b in buckets]

    def captured_buckets(self) -> list[Bucket]:
        return self.graphs.captured_buckets()

    def stats(self) -> EngineStats:
        """Counters and memory now. Called from the metrics thread: it only reads (the ring's lock
        guards its free list; the allocator's counters are thread-safe)."""
        graphs = self.graphs
        return EngineStats(
            pinned_in_use_bytes=self.ring.in_use_bytes,
            pinned_reserved_bytes=self.ring.reserved_bytes,
            gpu_memory_bytes=torch.cuda.memory_reserved(self.device),
            num_captures=len(graphs.capture_seconds),
            capture_seconds=tuple(graphs.capture_seconds),
            num_replays=graphs.num_replays,
            num_graphs_resident=graphs.num_resident,
            eager_steps=graphs.policy.eager_counts(),
        )

    def smoke_test(self, buckets: list[Bucket], min_cosine: float, seed: int) -> list[SmokeResult]:
        return smoke_test(self, buckets, min_cosine, seed)

    def compare(self, token_ids: np.ndarray, lengths: np.ndarray) -> tuple[Bucket, np.ndarray, np.ndarray]:
        """(bucket, eager rows, replayed rows) of one batch: the smoke test's pair."""
        batch = self.pack(token_ids, lengths)
        if not batch.is_bucketed:
            raise ValueError(f"a batch of {batch.bucket} fits no bucket")
        return (batch.bucket, *self.run_both(batch))

    @torch.inference_mode()
    def run_both(self, batch: PaddedBatch) -> tuple[np.ndarray, np.ndarray]:
        """(eager rows, replayed rows) of one bucketed batch, for the smoke test. Synchronous."""
        slot = self.ring.acquire()
        try:
            slot.stage(batch)
            self.static.load(slot, batch.bucket)
            self._plan(slot.cu_seqlens[: batch.bucket.num_seqs + 2], slot)
            eager = self._forward_static(batch.bucket)[: batch.num_seqs].float().cpu().numpy()
            replayed = self.graphs.replay(batch.bucket)[: batch.num_seqs].float().cpu().numpy()
        finally:
            self.ring.release(slot)
        return eager, replayed
