"""`triton`: a varlen attention kernel of our own, built for the short sequences embedding batches hold.

At 128 tokens a BGE-M3 layer's attention is a few MFLOP, yet torch's varlen flash kernel and
FlashAttention 4 take several times what a small kernel costs in a CUDA graph for it (docs/benchmarks-
history.md). This kernel does the flash-attention forward in one program per (query block, head): the
sequence's keys in blocks, an online softmax in float32 registers, grouped-query heads read from their
shared key/value head, causal or not. It schedules from `cu_seqlens` on the device (no host sync, CUDA-
graph capturable): the grid holds as many query blocks as any packing of the bucket can need (its tokens
/ block + its sequence slots), and each program finds its sequence and block from a prefix sum of the
sequences' block counts, so a bucket of many short sequences launches no programs for the long sequence
it could have held. Key blocks wholly inside the sequence (and, when causal, before the query block)
skip the masks; causal programs take their sequence's query blocks last first, the longest rows first.
The query block is 128 rows where the bucket's sequence slots average 256 tokens or more, 64 below.
A `DistanceBias` (MPNet, T5: relative_bias.py) is added to each score tile from its table, indexed by
the clamped distance key - query within the sequence, with the bias's own softmax scale (T5: 1): the
table is a few KiB a model, read through the cache, and a buffer of the model, so graphs replay it.
A `DisentangledBias` (DeBERTa) is gathered per tile from its per-token tables: each query row's
content-to-position scores and each key's position-to-content scores at the tile's relative
positions (a small index table of query - key): two gathers a score, from tables the layer has just
written, all in the bucket's static shapes.
A sliding window (attention.py) limits each program to the key blocks its rows' bands reach, every one
masked by distance; a row whose band misses a whole block adds nothing for it (a guarded exponent: the
running maximum stays -inf until a key is seen).
"""

import math
from dataclasses import dataclass

import torch

from kembed.worker.engine.layers.attention import Attention, AttentionMetadata
from kembed.worker.engine.layers.relative_bias import (
    DISENTANGLED,
    DISTANCE,
    AttentionBias,
    DisentangledBias,
    DistanceBias,
)

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only torch builds ship without Triton
    triton = None

HEAD_DIMS = (32, 64, 128)  # what tl.dot tiles and the register budget of one program take
LONG_SLOTS = 1024  # tokens per sequence slot from which a query block is 128 rows
Tile = tuple[int, int, int, int, bool]  # query rows, keys per step, warps, pipeline stages, split masks


def tiles(num_tokens: int, num_slots: int, head_dim: int) -> Tile:
    """The tile for a bucket's shape: the fastest found per shape by lab/bench_triton_attention.py."""
    if num_tokens >= LONG_SLOTS * max(num_slots - 1, 1):
        return 128, 64, 8, 3, True
    return (64, 64, 4, 3, True) if head_dim <= 64 else (64, 32, 4, 3, True)


def grid_blocks(num_tokens: int, num_slots: int, block_m: int) -> int:
    """Query blocks a program grid must hold for any packing of `num_tokens` tokens into `num_slots`
    sequences: each sequence wastes less than one block, so tokens / block + slots suffice."""
    return -(-num_tokens // block_m) + num_slots


class TritonAttention(Attention):
    """The kernel above behind the `Attention` call; packed [tokens, heads, head_dim] in and out."""

    bias_kinds = (DISTANCE, DISENTANGLED)

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
        self.refuse_bias(bias)
        assert bias is None or isinstance(bias, DistanceBias | DisentangledBias)
        return varlen_attention(q, k, v, meta.cu_seqlens, causal, window=window, bias=bias)

    def window_refusal(self, causal: bool) -> str | None:
        return None


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    causal: bool,
    tile: Tile | None = None,
    window: int | None = None,
    bias: DistanceBias | DisentangledBias | None = None,
) -> torch.Tensor:
    """Attention of packed q [tokens, heads, dim] and k, v [tokens, kv heads, dim] within the
    sequences `cu_seqlens` (int32, on the device) delimits; `tile`: `tiles`' choice overridden;
    `window`: keys at most that far from the query (before it, and after it unless causal); `bias`:
    added to the scores, which it scales by its own `scale`."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    if head_dim not in HEAD_DIMS or num_heads % num_kv_heads:
        raise ValueError(
            f"triton attention takes head sizes {HEAD_DIMS} and whole query groups, not "
            f"{num_heads} heads of {head_dim} over {num_kv_heads}"
        )
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("triton attention needs each head's values contiguous")
    out = torch.empty(num_tokens, num_heads, head_dim, dtype=q.dtype, device=q.device)
    num_slots = cu_seqlens.shape[0] - 1  # static per bucket: its sequence slots
    block_m, block_n, warps, stages, split = tile or tiles(num_tokens, num_slots, head_dim)
    grid = (grid_blocks(num_tokens, num_slots, block_m), num_heads)
    scale = 1.0 / math.sqrt(head_dim) if bias is None or bias.scale is None else bias.scale
    args = _bias_arguments(bias, q, num_heads)
    _varlen_attention_kernel[grid](
        q, k, v, out, cu_seqlens, *args.tensors, scale, 0 if window is None else window,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), *args.strides,
        NUM_SLOTS=num_slots, SLOTS_P2=triton.next_power_of_2(num_slots),
        GROUP=num_heads // num_kv_heads, CAUSAL=causal, WINDOWED=window is not None, HEAD_DIM=head_dim,
        BLOCK_M=block_m, BLOCK_N=block_n, SPLIT_MASKS=split,
        BIAS=args.kind, HAS_C2P=args.has_c2p, HAS_P2C=args.has_p2c, MAX_DISTANCE=args.max_distance,
        num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out


@dataclass(frozen=True)
class _BiasArguments:
    """What the kernel reads of a bias: (first table, second table, position index) and their
    (token, head) strides, the kind (0 none, 1 distance, 2 disentangled), the clamp of distances."""

    tensors: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    strides: tuple[int, int, int, int]
    kind: int = 0
    has_c2p: bool = False
    has_p2c: bool = False
    max_distance: int = 0


def _bias_arguments(
    bias: DistanceBias | DisentangledBias | None, q: torch.Tensor, num_heads: int
) -> _BiasArguments:
    """The kernel's bias arguments (`q` stands in for a table the kind has not, never read)."""
    if bias is None:
        return _BiasArguments((q, q, q), (0, 0, 0, 0))
    if isinstance(bias, DistanceBias):
        table = bias.table
        if table.shape[0] != num_heads or table.stride(1) != 1:
            raise ValueError(f"a distance bias table [{num_heads}, distances] (contiguous) is expected")
        return _BiasArguments((table, q, q), (0, table.stride(0), 0, 0), 1, max_distance=bias.max_distance)

    def terms_table(terms: torch.Tensor | None) -> torch.Tensor:  # any token, head strides; dense positions
        if terms is None:
            return q
        if terms.shape[1] != num_heads:
            raise ValueError(f"disentangled tables [tokens, {num_heads}, positions] are expected")
        return terms if terms.stride(2) == 1 else terms.contiguous()

    c2p, p2c = terms_table(bias.c2p), terms_table(bias.p2c)
    return _BiasArguments(
        (c2p, p2c, bias.positions),
        (c2p.stride(0), c2p.stride(1), p2c.stride(0), p2c.stride(1)),
        2,
        has_c2p=bias.c2p is not None,
        has_p2c=bias.p2c is not None,
        max_distance=bias.max_position - 1,
    )


def triton_attention_backend() -> TritonAttention | None:
    """The backend, or None where Triton is not installed."""
    return None if triton is None else TritonAttention()


# Triton kernels: their parameters are device pointers and tl.constexpr values, which Triton's
# JIT reads from the annotations it knows; nothing here types them for mypy (triton has no stubs).
if triton is not None:

    @triton.jit  # type: ignore[untyped-decorator]
    def _attend(  # type: ignore[no-untyped-def]
        q, acc, m_i, l_i, K, V, Bias, Bias2, Positions, start, seqlen, n0, offs_m, rows, head, kv_head,
        scale, window, stride_kt, stride_kh, stride_vt, stride_vh,
        stride_bt, stride_bh, stride_b2t, stride_b2h,
        MASK: tl.constexpr, CAUSAL: tl.constexpr, WINDOWED: tl.constexpr,
        HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
        BIAS: tl.constexpr, HAS_C2P: tl.constexpr, HAS_P2C: tl.constexpr, MAX_DISTANCE: tl.constexpr,
    ):  # fmt: skip
        """One key block of the online softmax; MASK: the block crosses the sequence's end or,
        causal, the diagonal, or (WINDOWED, every block masked) a band's edge. BIAS 1: the head's
        distance bias added; 2: the disentangled terms gathered (both in base 2, as the scores)."""
        keys = n0 + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, HEAD_DIM)
        k_ptrs = K + (start + keys)[None, :] * stride_kt + kv_head * stride_kh + offs_d[:, None]
        v_ptrs = V + (start + keys)[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :]
        if MASK:
            valid = keys < seqlen
            s = tl.dot(q, tl.load(k_ptrs, mask=valid[None, :], other=0.0)) * scale
        else:
            s = tl.dot(q, tl.load(k_ptrs)) * scale
        if BIAS == 1:  # the clamped distance key - query indexes the head's table
            distance = keys[None, :] - offs_m[:, None]
            distance = tl.minimum(tl.maximum(distance, -MAX_DISTANCE), MAX_DISTANCE) + MAX_DISTANCE
            bias = tl.load(Bias + head * stride_bh + distance).to(tl.float32)
            s += bias * 1.4426950408889634
        if BIAS == 2:  # the relative position of query - key, then each side's score at it
            relative = offs_m[:, None] - keys[None, :]
            relative = tl.minimum(tl.maximum(relative, -MAX_DISTANCE), MAX_DISTANCE) + MAX_DISTANCE
            position = tl.load(Positions + relative)
            inside = rows[:, None] & (keys < seqlen)[None, :]
            terms = tl.zeros_like(s)  # float32, as the scores
            if HAS_C2P:
                c2p = Bias + (start + offs_m)[:, None] * stride_bt + head * stride_bh + position
                terms += tl.load(c2p, mask=inside, other=0.0).to(tl.float32)
            if HAS_P2C:
                p2c = Bias2 + (start + keys)[None, :] * stride_b2t + head * stride_b2h + position
                terms += tl.load(p2c, mask=inside, other=0.0).to(tl.float32)
            s += terms * 1.4426950408889634
        if MASK:
            seen = valid[None, :]
            if CAUSAL:
                seen = seen & (offs_m[:, None] >= keys[None, :])
            if WINDOWED:
                distance = offs_m[:, None] - keys[None, :]
                seen = seen & (distance <= window) & (-distance <= window)
            s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # WINDOWED: a row that has seen no key yet takes exponents against 0, not -inf - -inf = NaN
        m_exp = tl.where(m_new == float("-inf"), 0.0, m_new) if WINDOWED else m_new
        alpha = tl.math.exp2(m_i - m_exp)
        p = tl.math.exp2(s - m_exp[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        # V after the softmax, as flash kernels order it
        v = tl.load(v_ptrs, mask=(keys < seqlen)[:, None], other=0.0) if MASK else tl.load(v_ptrs)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        return acc, m_new, l_i

    @triton.jit  # type: ignore[untyped-decorator]
    def _varlen_attention_kernel(  # type: ignore[no-untyped-def]
        Q, K, V, Out, CU, Bias, Bias2, Positions, sm_scale, window,
        stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
        stride_bt, stride_bh, stride_b2t, stride_b2h,
        NUM_SLOTS: tl.constexpr, SLOTS_P2: tl.constexpr,
        GROUP: tl.constexpr, CAUSAL: tl.constexpr, WINDOWED: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_MASKS: tl.constexpr,
        BIAS: tl.constexpr, HAS_C2P: tl.constexpr, HAS_P2C: tl.constexpr, MAX_DISTANCE: tl.constexpr,
    ):  # fmt: skip
        block = tl.program_id(0)
        head = tl.program_id(1)
        if NUM_SLOTS == 2:  # one sequence and the padding slot: two scalar loads, no scan
            first_start = tl.load(CU)
            first_end = tl.load(CU + 1)
            first_blocks = (first_end - first_start + BLOCK_M - 1) // BLOCK_M
            is_first = block < first_blocks
            start = tl.where(is_first, first_start, first_end).to(tl.int64)
            seqlen = tl.where(is_first, first_end - first_start, tl.load(CU + 2) - first_end)
            local = tl.where(is_first, block, block - first_blocks)
            num_blocks = tl.where(is_first, first_blocks, (seqlen + BLOCK_M - 1) // BLOCK_M)
            if local >= num_blocks:  # past the batch's last block
                return
        else:  # which sequence and query block: a prefix sum of the slots' block counts
            slots = tl.arange(0, SLOTS_P2)
            in_table = slots < NUM_SLOTS
            lo = tl.load(CU + slots, mask=in_table, other=0)
            lens = tl.load(CU + slots + 1, mask=in_table, other=0) - lo
            blocks = (lens + BLOCK_M - 1) // BLOCK_M
            ends = tl.cumsum(blocks, 0)
            seq = tl.sum((ends <= block).to(tl.int32), 0)
            if seq >= NUM_SLOTS:  # past the batch's last block
                return
            mine = slots == seq
            start = tl.sum(tl.where(mine, lo, 0), 0).to(tl.int64)
            seqlen = tl.sum(tl.where(mine, lens, 0), 0)
            num_blocks = tl.sum(tl.where(mine, blocks, 0), 0)
            local = block - tl.sum(tl.where(mine, ends - blocks, 0), 0)
        if CAUSAL:  # the longest rows first
            local = num_blocks - 1 - local
        kv_head = head // GROUP
        offs_m = local * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, HEAD_DIM)
        rows = offs_m < seqlen
        q = tl.load(
            Q + (start + offs_m)[:, None] * stride_qt + head * stride_qh + offs_d[None, :],
            mask=rows[:, None],
            other=0.0,
        )
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
        scale = sm_scale * 1.4426950408889634  # softmax in base 2
        first = 0
        if WINDOWED:  # the key blocks the rows' bands reach, every one masked
            first = (tl.maximum(local * BLOCK_M - window, 0) // BLOCK_N) * BLOCK_N
            full_end = first
            if CAUSAL:
                end = tl.minimum(seqlen, (local + 1) * BLOCK_M)
            else:
                end = tl.minimum(seqlen, (local + 1) * BLOCK_M + window)
        elif not SPLIT_MASKS:  # every key block masked
            full_end = 0
            end = tl.minimum(seqlen, (local + 1) * BLOCK_M) if CAUSAL else seqlen
        elif CAUSAL:  # unmasked up to the query block's first row, masked across the diagonal
            full_end = local * BLOCK_M
            end = tl.minimum(seqlen, (local + 1) * BLOCK_M)
        else:
            full_end = (seqlen // BLOCK_N) * BLOCK_N
            end = seqlen
        for n0 in range(first, full_end, BLOCK_N):
            acc, m_i, l_i = _attend(
                q, acc, m_i, l_i, K, V, Bias, Bias2, Positions, start, seqlen, n0, offs_m, rows, head,
                kv_head, scale, window, stride_kt, stride_kh, stride_vt, stride_vh,
                stride_bt, stride_bh, stride_b2t, stride_b2h,
                MASK=False, CAUSAL=CAUSAL, WINDOWED=False, HEAD_DIM=HEAD_DIM, BLOCK_N=BLOCK_N,
                BIAS=BIAS, HAS_C2P=HAS_C2P, HAS_P2C=HAS_P2C, MAX_DISTANCE=MAX_DISTANCE,
            )  # fmt: skip
        for n0 in range(full_end, end, BLOCK_N):
            acc, m_i, l_i = _attend(
                q, acc, m_i, l_i, K, V, Bias, Bias2, Positions, start, seqlen, n0, offs_m, rows, head,
                kv_head, scale, window, stride_kt, stride_kh, stride_vt, stride_vh,
                stride_bt, stride_bh, stride_b2t, stride_b2h,
                MASK=True, CAUSAL=CAUSAL, WINDOWED=WINDOWED, HEAD_DIM=HEAD_DIM, BLOCK_N=BLOCK_N,
                BIAS=BIAS, HAS_C2P=HAS_C2P, HAS_P2C=HAS_P2C, MAX_DISTANCE=MAX_DISTANCE,
            )  # fmt: skip
        acc = acc / l_i[:, None]
        tl.store(
            Out + (start + offs_m)[:, None] * stride_ot + head * stride_oh + offs_d[None, :],
            acc.to(Out.dtype.element_ty),
            mask=rows[:, None],
        )
