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
A sliding window (attention.py) limits each program to the key blocks its rows' bands reach, every one
masked by distance; a row whose band misses a whole block adds nothing for it (a guarded exponent: the
running maximum stays -inf until a key is seen).
"""

import math

import torch

from kembed.worker.engine.layers.attention import Attention, AttentionMetadata

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

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        meta: AttentionMetadata,
        causal: bool,
        window: int | None = None,
    ) -> torch.Tensor:
        return varlen_attention(q, k, v, meta.cu_seqlens, causal, window=window)

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
) -> torch.Tensor:
    """Attention of packed q [tokens, heads, dim] and k, v [tokens, kv heads, dim] within the
    sequences `cu_seqlens` (int32, on the device) delimits; `tile`: `tiles`' choice overridden;
    `window`: keys at most that far from the query (before it, and after it unless causal)."""
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
    _varlen_attention_kernel[grid](
        q, k, v, out, cu_seqlens, 1.0 / math.sqrt(head_dim), 0 if window is None else window,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1),
        NUM_SLOTS=num_slots, SLOTS_P2=triton.next_power_of_2(num_slots),
        GROUP=num_heads // num_kv_heads, CAUSAL=causal, WINDOWED=window is not None, HEAD_DIM=head_dim,
        BLOCK_M=block_m, BLOCK_N=block_n, SPLIT_MASKS=split, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out


def triton_attention_backend() -> TritonAttention | None:
    """The backend, or None where Triton is not installed."""
    return None if triton is None else TritonAttention()


# Triton kernels: their parameters are device pointers and tl.constexpr values, which Triton's
# JIT reads from the annotations it knows; nothing here types them for mypy (triton has no stubs).
if triton is not None:

    @triton.jit  # type: ignore[untyped-decorator]
    def _attend(  # type: ignore[no-untyped-def]
        q, acc, m_i, l_i, K, V, start, seqlen, n0, offs_m, kv_head, scale, window,
        stride_kt, stride_kh, stride_vt, stride_vh,
        MASK: tl.constexpr, CAUSAL: tl.constexpr, WINDOWED: tl.constexpr,
        HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
    ):  # fmt: skip
        """One key block of the online softmax; MASK: the block crosses the sequence's end or,
        causal, the diagonal, or (WINDOWED, every block masked) a band's edge."""
        keys = n0 + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, HEAD_DIM)
        k_ptrs = K + (start + keys)[None, :] * stride_kt + kv_head * stride_kh + offs_d[:, None]
        v_ptrs = V + (start + keys)[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :]
        if MASK:
            valid = keys < seqlen
            s = tl.dot(q, tl.load(k_ptrs, mask=valid[None, :], other=0.0)) * scale
            seen = valid[None, :]
            if CAUSAL:
                seen = seen & (offs_m[:, None] >= keys[None, :])
            if WINDOWED:
                distance = offs_m[:, None] - keys[None, :]
                seen = seen & (distance <= window) & (-distance <= window)
            s = tl.where(seen, s, float("-inf"))
        else:
            s = tl.dot(q, tl.load(k_ptrs)) * scale
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
        Q, K, V, Out, CU, sm_scale, window,
        stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
        NUM_SLOTS: tl.constexpr, SLOTS_P2: tl.constexpr,
        GROUP: tl.constexpr, CAUSAL: tl.constexpr, WINDOWED: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_MASKS: tl.constexpr,
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
                q, acc, m_i, l_i, K, V, start, seqlen, n0, offs_m, kv_head, scale, window,
                stride_kt, stride_kh, stride_vt, stride_vh,
                MASK=False, CAUSAL=CAUSAL, WINDOWED=False, HEAD_DIM=HEAD_DIM, BLOCK_N=BLOCK_N,
            )  # fmt: skip
        for n0 in range(full_end, end, BLOCK_N):
            acc, m_i, l_i = _attend(
                q, acc, m_i, l_i, K, V, start, seqlen, n0, offs_m, kv_head, scale, window,
                stride_kt, stride_kh, stride_vt, stride_vh,
                MASK=True, CAUSAL=CAUSAL, WINDOWED=WINDOWED, HEAD_DIM=HEAD_DIM, BLOCK_N=BLOCK_N,
            )  # fmt: skip
        acc = acc / l_i[:, None]
        tl.store(
            Out + (start + offs_m)[:, None] * stride_ot + head * stride_oh + offs_d[None, :],
            acc.to(Out.dtype.element_ty),
            mask=rows[:, None],
        )
