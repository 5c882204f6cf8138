"""`auto` attention on the GPU: time every usable varlen backend on the model's attention shape at
start, per range of bucket sizes, and route each bucket to the fastest.

No backend wins everywhere, and which wins depends on the GPU, the head shape and the batch
(docs/benchmarks-history.md): so the choice is measured on the serving GPU, not fixed.
Probes are laid out exactly as the CUDA engine lays out a bucket (padding slot, empty sequence
slots, max_seqlen = the bucket's token count) and timed as CUDA-graph replays, which is how they
run when serving. The result is a frozen, logged `AttentionPlan`; the
router it builds picks by the batch's padded token count, a Python int fixed per bucket, so each
captured graph bakes in one backend.
"""

import logging
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kembed.worker.buckets import BucketTable
from kembed.worker.engine.layers.attention import Attention, AttentionMetadata, AttentionShape
from kembed.worker.engine.layers.relative_bias import AttentionBias
from kembed.worker.engine.staging import pad_batch

log = logging.getLogger(__name__)

# (largest bucket token count of the range, probe batches as sequence lengths), ascending.
# Probes are shapes serving traffic produces: single queries, many short texts, passages, one long
# document (where a kernel's grid or tile may fall behind).
RANGES: tuple[tuple[int, tuple[tuple[int, ...], ...]], ...] = (
    (256, ((128,), (24,) * 8)),
    (2048, ((512,), (64,) * 16, (120,) * 16)),
    (sys.maxsize, ((256,) * 16, (500,) * 16, (4096,))),
)
_PROBE_SEQS = max(len(p) for _, probes in RANGES for p in probes)
_CALLS_PER_GRAPH, _REPLAYS = 5, 20


@dataclass(frozen=True)
class AttentionPlan:
    """Which backend serves which bucket sizes, and the timings that chose them."""

    routes: tuple[tuple[int, str], ...]  # (largest bucket token count, backend), ascending
    timings_us: tuple[tuple[int, str, float], ...]  # (range limit, backend, µs summed over probes)

    def backend_for(self, num_tokens: int) -> str:
        return next(name for limit, name in self.routes if num_tokens <= limit)

    def describe(self) -> str:
        """`flash-attn`, or e.g. `torch-varlen <= 256 tokens, flash-attn above`."""
        names = [name for _, name in self.routes]
        if len(set(names)) == 1:
            return names[0]
        parts = [f"{name} <= {limit} tokens" for limit, name in self.routes[:-1]]
        return ", ".join([*parts, f"{self.routes[-1][1]} above"])


class RoutedAttention(Attention):
    """An `Attention` that dispatches by the batch's padded token count, as the plan says. It plans
    batches when a backend it routes to does (flashinfer), and hands each plan to that backend."""

    def __init__(self, plan: AttentionPlan, backends: dict[str, Attention]) -> None:
        self._routes = tuple((limit, backends[name]) for limit, name in plan.routes)
        self.plans_batches = any(attention.plans_batches for _, attention in self._routes)
        kinds = [set(attention.bias_kinds) for _, attention in self._routes]
        self.bias_kinds = tuple(sorted(set.intersection(*kinds)))

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        meta: AttentionMetadata,
        causal: bool,
        window: int | None = None,
        bias: AttentionBias | None = None,
    ) -> torch.Tensor:
        # a window or a bias only where there is one: backends written to the plain call keep working
        extra: dict[str, Any] = {}
        if window is not None:
            extra["window"] = window
        if bias is not None:
            extra["bias"] = bias
        return self._route(q.shape[0])(q, k, v, meta, causal, **extra)

    def window_refusal(self, causal: bool) -> str | None:
        """The first refusal among the backends it routes to (each was chosen for the model's shape)."""
        return next((r for _, a in self._routes if (r := a.window_refusal(causal)) is not None), None)

    def plan_batch(self, cu_seqlens: torch.Tensor, scratch: object | None = None) -> None:
        """The batch's host offsets to the backend its size routes to (a no-op for most)."""
        self._route(int(cu_seqlens[-1])).plan_batch(cu_seqlens, scratch)

    def _route(self, num_tokens: int) -> Attention:
        for limit, attention in self._routes:
            if num_tokens <= limit:
                return attention
        raise AssertionError("the last route covers every size")


def choose_attention(
    backends: dict[str, Attention],
    shape: AttentionShape,
    device: torch.device,
    dtype: torch.dtype,
    max_tokens: int,
) -> AttentionPlan:
    """Time each backend on each range's probes (ranges past `max_tokens` are not probed: their
    choice is the last probed range's); a backend that fails a probe is dropped with a warning."""
    timings: list[tuple[int, str, float]] = []
    routes: list[tuple[int, str]] = []
    usable = dict(backends)
    table = BucketTable(max_tokens, _PROBE_SEQS)
    for limit, probes in RANGES:
        inputs = [
            probe_inputs(shape, p, table, device, dtype) for p in probes if table.lookup(len(p), sum(p))
        ]
        if not inputs:
            break
        totals = {}
        for name, attend in list(usable.items()):
            try:
                totals[name] = sum(
                    _time_probe(attend, *probe, shape.is_causal, shape.window) for probe in inputs
                )
            except Exception as error:  # a kernel that cannot run this shape: never route to it
                log.warning("attention backend %s failed on %s: %s; not used", name, shape, error)
                del usable[name]
                continue
            timings.append((limit, name, totals[name]))
        if not totals:
            raise RuntimeError(f"no attention backend ran the probes of {shape}")
        routes.append((limit, min(totals, key=totals.__getitem__)))
    if not routes:
        raise RuntimeError(f"max_tokens {max_tokens} is below every probe")
    routes[-1] = (sys.maxsize, routes[-1][1])  # the last probed range covers every larger bucket
    plan = AttentionPlan(_merge(routes), tuple(timings))
    log.info(
        "attention auto for %s: %s (µs per probe set: %s)",
        shape,
        plan.describe(),
        "; ".join(f"<= {_limit_text(limit)}: {name} {us:.1f}" for limit, name, us in plan.timings_us),
    )
    return plan


def _merge(routes: list[tuple[int, str]]) -> tuple[tuple[int, str], ...]:
    """Adjacent ranges with the same backend become one."""
    merged: list[tuple[int, str]] = []
    for limit, name in routes:
        if merged and merged[-1][1] == name:
            merged[-1] = (limit, name)
        else:
            merged.append((limit, name))
    return tuple(merged)


def _limit_text(limit: int) -> str:
    return "any" if limit == sys.maxsize else str(limit)


def probe_inputs(
    shape: AttentionShape,
    lengths: tuple[int, ...],
    table: BucketTable,
    device: torch.device,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata]:
    """Random q, k, v and metadata of a batch of `lengths` laid out exactly as the CUDA engine lays
    out its bucket (`pad_batch`: padding slot, empty sequence slots; max_seqlen = the bucket's tokens)."""
    batch = pad_batch(
        np.zeros(sum(lengths), np.int32), np.array(lengths), None, table.lookup(len(lengths), sum(lengths))
    )
    num_tokens = batch.bucket.num_tokens
    heads = shape.num_heads + 2 * shape.num_kv_heads
    qkv = torch.randn(num_tokens, heads, shape.head_dim, device=device, dtype=dtype)
    q, k, v = qkv.split([shape.num_heads, shape.num_kv_heads, shape.num_kv_heads], dim=1)
    meta = AttentionMetadata(
        cu_seqlens=torch.from_numpy(batch.cu_seqlens).to(device),
        max_seqlen=num_tokens,
        seq_ids=torch.from_numpy(batch.seq_ids).to(device),
        pad_index=None,
        unpad_index=None,
        key_mask=None,
        host_cu_seqlens=tuple(batch.cu_seqlens.tolist()),  # what a per-batch plan reads (flashinfer)
    )
    return q, k, v, meta


def _time_probe(
    attend: Attention,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    meta: AttentionMetadata,
    causal: bool,
    window: int | None = None,
) -> float:
    """Microseconds per call of `attend` on one probe, as a graph replay (with the model's sliding
    window where it has one: its local layers' call, the one backends differ on)."""
    with torch.inference_mode():
        attend(q, k, v, meta, causal, window)  # compile / lazy init outside the capture
        torch.cuda.synchronize(q.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(_CALLS_PER_GRAPH):
                attend(q, k, v, meta, causal, window)
        graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(_REPLAYS):
            graph.replay()
        end.record()
        end.synchronize()
    elapsed_ms: float = start.elapsed_time(end)
    return elapsed_ms * 1e3 / (_REPLAYS * _CALLS_PER_GRAPH)
