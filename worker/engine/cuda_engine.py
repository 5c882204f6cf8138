"""The CUDA engine: ragged batches padded to buckets, replayed as whole-model CUDA graphs, results
handed back as result handles (`ResultHandle`) while the next batch is prepared.

Stream order carries every dependency, so `step` never waits on the device: it copies the padded
batch's block into a pinned slot (one memcpy), copies that asynchronously into the static input block
(one copy), replays (or captures, or runs eagerly) the bucket's graph, copies the output rows into
the same pinned slot, records an event and returns. The next `step` may overwrite the static block
at once: its copy is ordered after this batch's kernels on the one stream. The slot goes back to the
ring only when the rows have been read (`CudaLazyTensor.wait`), so the next batch staged into it
cannot overwrite inputs still being copied, nor rows still being read.

At start (`prewarm_at_start`) every reachable bucket is captured within a time budget; from then on
the serving path never captures: a batch pads up to the smallest captured bucket that holds it, and
one that none holds runs eagerly and waits for `capture_deferred`, called when the worker is idle.

The interactive lane (`lane`): a second engine over the same weights, for small batches of queries,
with its own stream (of the device's highest priority), static inputs, pinned ring, graphs and their
memory pool and capture stream. Its steps run on the GPU beside the bulk steps instead of behind
them, so a query waits for the SMs the bulk step leaves it, not for the bulk steps already queued
(docs/benchmarks.md, mixed traffic).
The owner prewarms, captures and reports for both; each is driven by one thread at a time (a lock).
"""

import dataclasses
import gc
import logging
import threading
from collections.abc import Sequence

import numpy as np
import torch

from kembed.proto.outputs import COLBERT, SPARSE, TOKENS
from kembed.worker.buckets import Bucket, BucketTable
from kembed.worker.engine.base import BaseEngine
from kembed.worker.engine.graphs import CapturePolicy, GraphCache, PrewarmReport
from kembed.worker.engine.layers.attention import Attention, AttentionMetadata
from kembed.worker.engine.lazy import to_host
from kembed.worker.engine.models.served import ServedModel
from kembed.worker.engine.payload import PayloadIndex, PayloadPlan, assemble, to_device
from kembed.worker.engine.spans import SpanIndex, forward_spans
from kembed.worker.engine.staging import (
    InputLayout,
    PaddedBatch,
    PinnedRing,
    Slot,
    max_input_bytes,
    neutral_batch,
    pad_batch,
)
from kembed.worker.info import EngineStats, ModelInfo
from kembed.worker.results import ResultHandle

log = logging.getLogger(__name__)

# A batch of at most this many tokens (its bucket's) launched onto an idle device is waited for
# spinning, any other asleep (`_step`). Sleeping costs a batch the driver's wake-up and a cold core
# for the next one's host work: on the H200 a lone BGE-M3 step of 1 x 128 took 1.016 ms blocking
# against 0.921 spinning, one of 64 x 16 2.097 against 1.815 (tests/bench/bench_lone_step.py), a
# tenth to a sixth of a step this short; ~3 ms steps (2048 tokens) and longer lose less than that
# by sleeping. Spinning costs a core only while each batch finds the device free: a busy worker's
# batches queue behind one another, and those sleep.
SPIN_MAX_TOKENS = 2048


class CudaLazyTensor(ResultHandle):
    """A launched batch: its rows land in a pinned slot when `event` fires. `wait` copies them out
    and gives the slot back to the ring (call it from a waiter thread, or once `is_ready`)."""

    def __init__(self, ring: PinnedRing, slot: Slot, event: torch.cuda.Event, num_rows: int) -> None:
        self._ring, self._slot, self._event, self._num_rows = ring, slot, event, num_rows

    def is_ready(self) -> bool:
        return bool(self._event.query())

    def wait(self) -> np.ndarray:
        self._event.synchronize()
        rows = self._slot.output[: self._num_rows].numpy().copy()
        self._ring.release(self._slot)
        return rows


class SlotHandle(ResultHandle):
    """A multi-output batch's answer (`LazyTensor`, its own pinned buffer: its size is the batch's,
    not a slot's) that gives its ring slot back once read: the slot held the batch's inputs."""

    def __init__(self, ring: PinnedRing, slot: Slot, rows: ResultHandle) -> None:
        self._ring, self._slot, self._rows = ring, slot, rows

    def is_ready(self) -> bool:
        return self._rows.is_ready()

    def wait(self) -> np.ndarray:
        rows = self._rows.wait()
        self._ring.release(self._slot)
        return rows


class StaticInputs:
    """The one static input block every graph reads, on the device, sized for the largest bucket.
    Each bucket reads it through its own typed views (`InputLayout`): a graph bakes in the addresses
    of its bucket's views, and a step copies the batch's bytes to the same offsets."""

    def __init__(self, max_tokens: int, max_seqs: int, device: torch.device) -> None:
        # [32 * max_tokens + 4 * (max_seqs + 2)] uint8: four int64 [tokens] arrays, int32 [seqs + 2]
        self.block = torch.zeros(max_input_bytes(max_tokens, max_seqs), dtype=torch.uint8, device=device)
        # per bucket, made once: its typed views, and its prefix of the block (what a step copies into)
        self._views: dict[Bucket, tuple[torch.Tensor, ...]] = {}
        self._prefixes: dict[Bucket, torch.Tensor] = {}
        # per staged index's byte range (load_index): the block's prefix it is copied into, its int64 view
        self._index_views: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def views(self, bucket: Bucket) -> tuple[torch.Tensor, ...]:
        """(input_ids, position_ids, token_type_ids, seq_ids [tokens] int64, cu_seqlens [seqs + 2]
        int32) of `bucket`, made once per bucket."""
        views = self._views.get(bucket)
        if views is None:
            views = self._views[bucket] = InputLayout.of(bucket).torch_views(self.block)
        return views

    def load(self, slot: Slot, bucket: Bucket) -> None:
        """One asynchronous host-to-device copy of the bucket's prefix of the slot's staged block."""
        prefix = self._prefixes.get(bucket)
        if prefix is None:
            prefix = self._prefixes[bucket] = self.block[: InputLayout.of(bucket).num_bytes]
        prefix.copy_(slot.prefix(bucket), non_blocking=True)

    def load_index(
        self, slot: Slot, batch: PaddedBatch, index: PayloadIndex, *, late: bool = False
    ) -> torch.Tensor:
        """A multi-output batch's gather index on the device (int64), staged in the slot after the
        batch's inputs (`Slot.stage_index`), in bytes of the block no graph reads. Not `late`: the
        inputs and the index in one asynchronous copy (instead of `load`). `late` (the inputs already
        copied and the graph launched): the index alone, its copy queued after the graph. Either
        way safe to overwrite by the next batch, whose copy is ordered after this one's gathers on
        the stream. An index too large for the spare bytes goes through a pinned buffer of its own
        (`to_device`)."""
        staged = slot.stage_index(batch, index)
        if staged is None:
            if not late:
                self.load(slot, batch.bucket)
            return to_device(index, self.block.device)
        at, end = staged
        start = at if late else 0
        views = self._index_views.get((start, end))
        if views is None:  # made once per byte range (a torch slice costs microseconds on the host)
            if len(self._index_views) >= 4096:
                self._index_views.clear()
            views = self._index_views[start, end] = (
                self.block[start:end],
                self.block[at:end].view(torch.int64),
            )
        target, device_index = views
        target.copy_(slot.staged(start, end), non_blocking=True)
        return device_index

    def fill_neutral(self, bucket: Bucket) -> np.ndarray:
        """A valid batch of the bucket's shape (one all-padding sequence, ids and positions 0), for
        captures with no real batch at hand: capture's warm-up runs the model on whatever the block
        holds, and a stale larger batch there would index past this bucket's rows. Returns the
        neutral batch's host offsets. Synchronous (a pageable copy): prewarm and idle time only."""
        batch = neutral_batch(bucket)
        self.block[: batch.block.nbytes].copy_(torch.from_numpy(batch.block))
        return batch.cu_seqlens


class CudaEngine(BaseEngine[PaddedBatch]):
    """Runs one model on one GPU with CUDA graphs per bucket. One launcher thread calls `step`,
    `prewarm_at_start` and `capture_deferred`. `attention` plans each batch on the host first when
    it `plans_batches` (flashinfer)."""

    def __init__(
        self,
        model: ServedModel,
        info: ModelInfo,
        device: torch.device,
        *,
        buckets: BucketTable,
        max_graphs: int,
        use_graphs: bool,
        inflight: int,
        max_pinned_bytes: int,
        attention: Attention,
        stream: torch.cuda.Stream | None = None,
    ) -> None:
        super().__init__(model, info, device, buckets, CapturePolicy(max_graphs, use_graphs, table=buckets))
        self.attention = attention
        self.static = StaticInputs(buckets.max_tokens, buckets.max_seqs, device)
        self.ring = PinnedRing(
            inflight, buckets.max_tokens, buckets.max_seqs, model.facts.output_size, max_pinned_bytes
        )
        # None: torch's current stream. A lane's own stream, and a capture stream of the same pool
        # (never one the owner's captures use: see GraphCache).
        self.stream = stream
        capture_stream = None if stream is None else torch.cuda.Stream(priority=stream.priority)
        self.graphs = GraphCache(self._forward_static, self.policy, capture_stream)
        # Multi-output batches (payload.py) replay graphs of their own, every head inside, captured
        # lazily (on a bucket's second such batch): the dense graphs above stay as they were.
        multi_stream = None if stream is None else torch.cuda.Stream(priority=stream.priority)
        self.multi_graphs = GraphCache(
            lambda bucket: self._forward_outputs_static(bucket, self.model.facts.outputs & ~TOKENS),
            CapturePolicy(max_graphs, use_graphs, table=buckets),
            multi_stream,
        )
        # and with every token's vector too, for batches asking them (the token vectors double
        # the flat block: the graphs above leave them out)
        self.token_graphs = GraphCache(
            lambda bucket: self._forward_outputs_static(bucket, self.model.facts.outputs),
            CapturePolicy(max_graphs, use_graphs, table=buckets),
            multi_stream,
        )
        # A lane's steps run on the lane's launcher thread while its owner may capture its graphs on
        # another: one thread at a time in any of the entry points below.
        self._lock = threading.RLock()

    def add_lane(self, lane: "CudaEngine") -> None:
        """Serve small interactive batches on `lane` (module docstring); prewarmed, captured and
        counted with this engine."""
        self.lane = lane

    def pack(
        self,
        token_ids: np.ndarray,
        lengths: np.ndarray,
        token_type_ids: np.ndarray | None = None,
        spans: Sequence[np.ndarray | None] | None = None,
        outputs: np.ndarray | None = None,
    ) -> PaddedBatch:
        """The batch laid out in the bucket it runs in: its own, or once prewarmed the smallest
        captured one that holds it (host arrays only; called on the event loop). A batch with
        `spans` (span pooling, spans.py) is laid out unbucketed: it runs eagerly in its exact shape,
        as the graphs pool inside the captured forward."""
        if spans is not None:
            batch = pad_batch(token_ids, lengths, token_type_ids, None)
            return dataclasses.replace(batch, spans=SpanIndex.build(lengths, spans))
        num_seqs, num_tokens = len(lengths), int(lengths.sum())
        own = self.buckets.lookup(num_seqs, num_tokens)
        if outputs is not None:  # its own bucket, in the multi-output graphs
            facts, runs_in = self.model.facts, own or Bucket(num_seqs, num_tokens)
            # token vectors (the largest part of the flat block) only in the graphs of batches asking them
            has = facts.outputs if (outputs & TOKENS).any() else facts.outputs & ~TOKENS
            plan = PayloadPlan(
                lengths, outputs, facts.output_shape, has, runs_in.num_seqs + 1, runs_in.num_tokens
            )
            # a query alone: its index (built once per shape) rides with its inputs; a larger
            # batch's is built once its graph is launched (`_step`)
            index = plan.build() if num_seqs == 1 else plan
            return pad_batch(token_ids, lengths, token_type_ids, own, payload=index)
        bucket = self.policy.serving_bucket(own, num_seqs, num_tokens)
        return pad_batch(token_ids, lengths, token_type_ids, bucket, own)

    def can_launch_inline(self, batch: PaddedBatch) -> bool:
        """True iff `step(batch)` would only replay a captured graph, with a pinned slot free now:
        host work of a fraction of a millisecond, no capture, no eager forward, no wait for a slot.
        (A captured bucket stays captured, so the answer holds until the step.) The engine is still
        driven by one thread at a time: launch inline only while the launcher thread runs nothing
        (no step, capture, prewarm or smoke test), as those rewrite the static block and the graphs."""
        return (
            batch.is_bucketed
            and batch.payload is None
            and self.policy.is_captured(batch.bucket)
            and self.ring.has_free
        )

    @torch.inference_mode()
    def step(self, batch: PaddedBatch) -> ResultHandle:
        """Launch `batch`; return its rows lazily. No host synchronisation on this path."""
        with self._lock, torch.cuda.stream(self.stream):
            return self._step(batch)

    def _step(self, batch: PaddedBatch) -> ResultHandle:
        if not batch.is_bucketed:
            return self._step_unbucketed(batch)
        slot = self.ring.acquire()
        slot.stage(batch)  # one host-to-host memcpy into pinned memory
        payload = batch.payload
        if isinstance(payload, PayloadIndex):  # the same copy, the gather index after the inputs
            index = self.static.load_index(slot, batch, payload)
        else:
            self.static.load(slot, batch.bucket)  # one asynchronous host-to-device copy
        if self.attention.plans_batches:  # flashinfer: plan on the slot's pinned offsets
            self.attention.plan_batch(slot.cu_seqlens(batch.bucket), slot)
        if payload is not None:  # every head in the graph, each sequence's outputs gathered after
            graphs = self.token_graphs if payload.has & TOKENS else self.multi_graphs
            flat = graphs.run(batch.bucket, batch.bucket)
            if isinstance(payload, PayloadPlan):  # built while the graph runs, copied after it
                payload = payload.build()
                index = self.static.load_index(slot, batch, payload, late=True)
            return SlotHandle(self.ring, slot, to_host(assemble(flat, payload, index)))
        output = self.graphs.run(batch.own_bucket, batch.bucket)
        slot.output[: batch.num_seqs].copy_(output[: batch.num_seqs], non_blocking=True)
        # A short batch alone on the device (SPIN_MAX_TOKENS) gets CUDA's default event, whose
        # waiter spins in the driver with the GIL released: the quickest wake-up, for one short
        # step. One behind another, or a long one, gets a blocking event, whose waiter sleeps in the
        # driver, so a busy worker does not spin a core through every step (lazy.py). The event
        # loop's poll of a small batch alone (`is_ready`, a query) is as quick whatever the kind.
        is_short_alone = self.ring.num_in_use == 1 and batch.bucket.num_tokens <= SPIN_MAX_TOKENS
        event = torch.cuda.Event(blocking=not is_short_alone)
        event.record()
        return CudaLazyTensor(self.ring, slot, event, batch.num_seqs)

    def _plan(self, host_cu_seqlens: torch.Tensor, scratch: object | None) -> None:
        """A backend that plans each batch on the host (flashinfer) gets its offsets before the forward."""
        if self.attention.plans_batches:
            self.attention.plan_batch(host_cu_seqlens, scratch)

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
        input_ids, position_ids, token_type_ids, seq_ids, cu_seqlens = self.static.views(bucket)
        out: torch.Tensor = self.model(
            input_ids, position_ids, token_type_ids, self._meta(cu_seqlens, seq_ids, bucket)
        )
        return out

    def _forward_outputs_static(self, bucket: Bucket, outputs: int) -> torch.Tensor:
        input_ids, position_ids, token_type_ids, seq_ids, cu_seqlens = self.static.views(bucket)
        return self.model.forward_outputs(
            input_ids, position_ids, token_type_ids, self._meta(cu_seqlens, seq_ids, bucket), outputs
        )

    def _step_unbucketed(self, batch: PaddedBatch) -> ResultHandle:
        """A batch larger than every bucket (the scheduler never forms one; direct callers may), or
        a span batch: eager, on an input block and an output buffer of its own rather than the ring's
        fixed slots."""
        self.policy.decide(None)  # counted as an uncapturable eager step
        layout = InputLayout.of(batch.bucket)
        host = torch.from_numpy(batch.block).pin_memory()  # [num_bytes] uint8
        block = host.to(self.device, non_blocking=True)
        if self.attention.plans_batches:
            self.attention.plan_batch(layout.host_cu_seqlens(host), None)
        input_ids, position_ids, token_type_ids, seq_ids, cu_seqlens = layout.torch_views(block)
        meta = self._meta(cu_seqlens, seq_ids, batch.bucket)
        if batch.payload is not None:
            payload = batch.payload
            flat = self.model.forward_outputs(input_ids, position_ids, token_type_ids, meta, payload.has)
            output = assemble(flat, payload.build() if isinstance(payload, PayloadPlan) else payload)
        elif batch.spans is None:
            output = self.model(input_ids, position_ids, token_type_ids, meta)[: batch.num_seqs]
        else:
            output = forward_spans(self.model, input_ids, position_ids, token_type_ids, meta, batch.spans)
        return to_host(output)

    def _capture(self, bucket: Bucket) -> None:
        """Capture `bucket`'s dense graph, and for a model with heads (BGE-M3's sparse or ColBERT)
        its multi-output graph too: what prewarm, idle time and the operator's Job capture, so a
        prewarmed worker replays both kinds of batch from the first. Multi-output batches run in
        their own bucket, the one captured here. (The graphs with token vectors stay lazy: every
        embedder has that output, and they would double every model's captures.)"""
        facts = self.model.facts
        has_heads = bool(facts.outputs & (SPARSE | COLBERT)) and not facts.sparse_vocabulary
        with self._lock, torch.cuda.stream(self.stream):
            cu_seqlens = self.static.fill_neutral(bucket)
            self._plan(torch.from_numpy(cu_seqlens), None)
            self.graphs.capture(bucket)
            if has_heads:  # the same neutral inputs and plan: captured on its own stream and pool
                self.multi_graphs.capture(bucket)

    @torch.inference_mode()
    def prewarm(self, buckets: list[Bucket]) -> list[Bucket]:
        """Capture each bucket now, without a budget (the operator's prewarm Job); returns those
        captured (new or already). A bucket larger than the table's largest is not captured."""
        for bucket in buckets:
            if self.buckets.fits(bucket) and not self.graphs.is_captured(bucket):
                self._capture(bucket)
        return [b for b in buckets if self.graphs.is_captured(b)]

    @torch.inference_mode()
    def prewarm_at_start(
        self, prewarm: "str | Sequence[Bucket]", hot: Sequence[Bucket], max_seconds: float
    ) -> PrewarmReport | None:
        """Before the server opens: capture `hot`, then `prewarm`'s buckets (`"all"`: the table's
        prewarm order; a list: those) within `max_seconds`, then switch to the prewarmed policy.
        `"none"` (or graphs off) keeps the lazy policy and captures nothing."""
        policy = self.policy
        if not policy.is_enabled:
            log.info("prewarm: none (CUDA graphs are off)")
            return None
        if self.lane is not None:  # few small buckets: all of them, whatever the setting
            log.info("prewarm: the interactive lane's buckets first")
            self.lane.prewarm_at_start("all", (), max_seconds)
        if prewarm == "none":
            log.info("prewarm: none at start; a bucket runs eagerly on its first hit, captured on its second")
            return None
        order = self.buckets.prewarm_order(hot) if prewarm == "all" else self.named_buckets(prewarm, hot)
        if len(order) > policy.max_graphs:
            log.warning(
                "prewarm: max_graphs=%d is below the %d buckets to capture; the rest will run padded "
                "up or eagerly (raise --max-graphs)",
                policy.max_graphs,
                len(order),
            )
        log.info(
            "prewarm: capturing up to %d buckets (%d hot first) within %.0f s; %.1f GiB GPU memory free",
            len(order),
            len(hot),
            max_seconds,
            _free_gib(),
        )
        report = policy.prewarm(order, self._capture, max_seconds)
        log.info(
            "prewarm: captured %d of %d buckets (%d already) in %.1f s%s; %d graphs, %.1f GiB GPU "
            "memory free",
            report.num_captured,
            report.num_planned,
            report.num_already,
            report.seconds,
            f", cut short by {report.stopped_by} ({len(policy.backlog)} left for idle time)"
            if report.is_cut_short
            else "",
            self.graphs.num_resident,
            _free_gib(),
        )
        return report

    @torch.inference_mode()
    def capture_deferred(self, max_seconds: float) -> int:
        """Capture the buckets serving ran uncovered, then what prewarm left, within `max_seconds`
        (no capture starts after it; one in progress finishes). Call it on the launcher thread when
        the worker is idle. Returns how many were captured; if any, the new graphs' objects are
        frozen out of the garbage collector's full passes as prewarm's are."""
        policy = self.policy
        num_lane = 0 if self.lane is None else self.lane.capture_deferred(max_seconds)
        if not policy.deferred and not policy.backlog:
            return num_lane
        report = policy.capture_deferred(self._capture, max_seconds)
        if report.num_captured:
            log.info(
                "captured %d deferred buckets in %.2f s (%d uncovered and %d prewarm left still waiting)",
                report.num_captured,
                report.seconds,
                len(policy.deferred),
                len(policy.backlog),
            )
            gc.collect()
            gc.freeze()
        return report.num_captured + num_lane

    def captured_buckets(self) -> list[Bucket]:
        return self.graphs.captured_buckets()

    def stats(self) -> EngineStats:
        """`BaseEngine.stats` with the pinned ring's and the graphs' (the ring's lock guards its free
        list), the lane's counted in."""
        graphs = self.graphs
        own = dataclasses.replace(
            super().stats(),
            pinned_in_use_bytes=self.ring.in_use_bytes,
            pinned_reserved_bytes=self.ring.reserved_bytes,
            num_captures=len(graphs.capture_seconds),
            capture_seconds=tuple(graphs.capture_seconds),
            num_replays=graphs.num_replays,
            num_graphs_resident=graphs.num_resident,
            num_serving_captures=self.policy.num_serving_captures,
        )
        if self.lane is None:
            return own
        # the lane's ring, graphs and steps counted with this engine's; its bucket hits are not (the
        # hot list is about the main path's buckets: the lane captures all of its own at start)
        lane = self.lane.stats()
        eager = dict(own.eager_steps)
        for reason, count in lane.eager_steps.items():
            eager[reason] = eager.get(reason, 0) + count
        return dataclasses.replace(
            own,
            pinned_in_use_bytes=own.pinned_in_use_bytes + lane.pinned_in_use_bytes,
            pinned_reserved_bytes=own.pinned_reserved_bytes + lane.pinned_reserved_bytes,
            num_captures=own.num_captures + lane.num_captures,
            capture_seconds=own.capture_seconds + lane.capture_seconds,
            num_replays=own.num_replays + lane.num_replays,
            num_graphs_resident=own.num_graphs_resident + lane.num_graphs_resident,
            eager_steps=eager,
            num_serving_captures=own.num_serving_captures + lane.num_serving_captures,
        )

    def compare(self, token_ids: np.ndarray, lengths: np.ndarray) -> tuple[Bucket, np.ndarray, np.ndarray]:
        """(bucket, eager rows, replayed rows) of one batch in its own bucket (never padded up: the
        smoke test checks the bucket it asked for): the smoke test's pair."""
        own = self.buckets.lookup(len(lengths), int(lengths.sum()))
        if own is None:
            raise ValueError(f"a batch of {len(lengths)}x{int(lengths.sum())} fits no bucket")
        return (own, *self.run_both(pad_batch(token_ids, lengths, None, own)))

    @torch.inference_mode()
    def run_both(self, batch: PaddedBatch) -> tuple[np.ndarray, np.ndarray]:
        """(eager rows, replayed rows) of one bucketed batch, for the smoke test. Synchronous."""
        slot = self.ring.acquire()
        try:
            with self._lock, torch.cuda.stream(self.stream):
                slot.stage(batch)
                self.static.load(slot, batch.bucket)
                self._plan(slot.cu_seqlens(batch.bucket), slot)
                eager = self._forward_static(batch.bucket)[: batch.num_seqs].float().cpu().numpy()
                replayed = self.graphs.replay(batch.bucket)[: batch.num_seqs].float().cpu().numpy()
        finally:
            self.ring.release(slot)
        return eager, replayed


def _free_gib() -> float:
    return torch.cuda.mem_get_info()[0] / 2**30
