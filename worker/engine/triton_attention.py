"""`triton`: a varlen attention kernel for short sequences, the batches a query or a few sentences make.

At 128 tokens a BGE-M3 layer's attention is a few MFLOP, yet torch's varlen flash kernel and
FlashAttention 4 take 6-7 µs of a CUDA graph for it (docs/benchmarks.md), where a small kernel costs
~2 µs. This kernel does the textbook flash-attention forward in one program per (query block of 64,
head, sequence): the sequence's keys in blocks of 64, an online softmax in float32 registers,
grouped-query heads read from their shared key/value head, causal or not. It schedules from
`cu_seqlens` on the device (no host sync, CUDA-graph capturable); the grid spans `max_seqlen` query
blocks per sequence slot, which is cheap for small buckets and wasteful for large ones (programs
past their sequence's end return at once). So `auto` (attention_choice.py) times it against the
other backends per range of bucket sizes and routes to it only where it wins.
"""

import math

import torch

from kembed.worker.engine.attention import Attention, AttentionMetadata

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only torch builds ship without Triton
    triton = None

BLOCK_M = 64  # query rows per program
BLOCK_N = 64  # keys per step of the inner loop
HEAD_DIMS = (32, 64, 128)  # what tl.dot tiles and the register budget of one program take


class TritonShortAttention(Attention):
    """The kernel above behind the `Attention` call; packed [tokens, heads, head_dim] in and out."""

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata, causal: bool
    ) -> torch.Tensor:
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
        num_seqs = meta.cu_seqlens.shape[0] - 1  # static per bucket: its sequence slots
        grid = (triton.cdiv(max(meta.max_seqlen, 1), BLOCK_M), num_heads, num_seqs)
        _short_attention_kernel[grid](
            q, k, v, out, meta.cu_seqlens, 1.0 / math.sqrt(head_dim),
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            out.stride(0), out.stride(1),
            GROUP=num_heads // num_kv_heads, CAUSAL=causal, HEAD_DIM=head_dim,
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, num_warps=4 if head_dim <= 64 else 8,
        )  # fmt: skip
        return out


def triton_short_attention() -> TritonShortAttention | None:
    """The backend, or None where Triton is not installed."""
    return None if triton is None else TritonShortAttention()


# Triton kernels: their parameters are device pointers and tl.constexpr values, which Triton's
# JIT reads from the annotations it knows; nothing here types them for mypy (triton has no stubs).
if triton is not None:

    @triton.jit  # type: ignore[untyped-decorator]
    def _short_attention_kernel(  # type: ignore[no-untyped-def]
        Q, K, V, Out, CU, sm_scale,
        stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
        GROUP: tl.constexpr, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ):  # fmt: skip
        m_block = tl.program_id(0)
        head = tl.program_id(1)
        seq = tl.program_id(2)
        start = tl.load(CU + seq).to(tl.int64)
        seqlen = tl.load(CU + seq + 1).to(tl.int64) - start
        if m_block * BLOCK_M >= seqlen:  # past the sequence's end (or an empty sequence slot)
            return
        kv_head = head // GROUP
        offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
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
        end = seqlen
        if CAUSAL:
            end = tl.minimum(seqlen, (m_block + 1) * BLOCK_M)
        for n0 in range(0, end, BLOCK_N):
            keys = n0 + offs_n
            valid = keys < seqlen
            k = tl.load(
                K + (start + keys)[None, :] * stride_kt + kv_head * stride_kh + offs_d[:, None],
                mask=valid[None, :],
                other=0.0,
            )
            s = tl.dot(q, k) * scale
            if CAUSAL:
                valid = valid[None, :] & (offs_m[:, None] >= keys[None, :])
                s = tl.where(valid, s, float("-inf"))
            else:
                s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.math.exp2(m_i - m_new)
            p = tl.math.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(
                V + (start + keys)[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :],
                mask=(keys < seqlen)[:, None],
                other=0.0,
            )
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
            m_i = m_new
        acc = acc / l_i[:, None]
        tl.store(
            Out + (start + offs_m)[:, None] * stride_ot + head * stride_oh + offs_d[None, :],
            acc.to(Out.dtype.element_ty),
            mask=rows[:, None],
        )
