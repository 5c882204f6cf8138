"""Fused Triton kernels for Llama-style decoder layers (RMSNorm, per-head q/k norm + RoPE, SiLU gate).

Unfused, a Qwen3 layer runs ~50 small kernels (float32 casts, powers, means, rsqrt, the halves of RoPE,
concatenations), each a launch and a pass over the activations, which made a small decoder's layer
several times slower than BGE-M3's (docs/benchmarks-history.md). Here each of those stretches is one
kernel, computing in float32 registers and rounding once on the way out; the GEMMs and attention stay as
they are. Every function has a plain-torch twin in models/decoder.py (the CPU path and the reference the GPU
tests compare against).
With fp8 linears (fp8.py), `rms_norm_fp8` also writes the normalised rows quantised to e4m3 for the
next GEMM, and the SiLU gate is `activation_quantize(gate_up, "silu_mul")`.
"""

import torch

from kembed.worker.engine.kernels.fp8 import FP8_DTYPE, Fp8Rows

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only torch builds ship without Triton
    triton = None


def can_fuse(x: torch.Tensor, head_dim: int) -> bool:
    """Whether the fused kernels serve this tensor: CUDA, Triton present, half head a power of two."""
    half = head_dim // 2
    return can_run(x) and half & (half - 1) == 0


def can_run(x: torch.Tensor) -> bool:
    """Whether the kernels here run on `x` at all: on CUDA, with Triton installed."""
    return triton is not None and x.is_cuda


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(x + residual) * weight, x + residual) over the last dimension of [num_tokens, hidden];
    without a residual the second value is x itself."""
    assert x.is_contiguous() and (residual is None or residual.is_contiguous())
    num_rows, hidden = x.shape
    out = torch.empty_like(x)
    total = x if residual is None else torch.empty_like(x)
    block = triton.next_power_of_2(hidden)
    _rms_norm_kernel[(num_rows,)](
        x, x if residual is None else residual, weight, out, total, out, out, hidden, eps,
        HAS_RESIDUAL=residual is not None, QUANT=False, BLOCK=block, num_warps=4 if block <= 1024 else 8,
    )  # fmt: skip
    return out, total


def rms_norm_fp8(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[Fp8Rows, torch.Tensor]:
    """`rms_norm` whose normalised rows come quantised per row to e4m3 (fp8.py) instead of in the
    model's dtype; the second value is x + residual as there."""
    assert x.is_contiguous() and (residual is None or residual.is_contiguous())
    num_rows, hidden = x.shape
    total = x if residual is None else torch.empty_like(x)
    data = torch.empty(num_rows, hidden, dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty(num_rows, 1, dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(hidden)
    _rms_norm_kernel[(num_rows,)](
        x, x if residual is None else residual, weight, data, total, data, scale, hidden, eps,
        HAS_RESIDUAL=residual is not None, QUANT=True, BLOCK=block, num_warps=4 if block <= 1024 else 8,
    )  # fmt: skip
    return Fp8Rows(data, scale), total


def qk_norm_rope(
    qkv: torch.Tensor,  # [num_tokens, (num_heads + 2 * num_kv_heads) * head_dim], contiguous
    q_weight: torch.Tensor | None,  # [head_dim]; None (with k_weight): no q/k norm, RoPE alone
    k_weight: torch.Tensor | None,  # [head_dim]
    eps: float,
    cos: torch.Tensor,  # [num_tokens, 1, head_dim/2]
    sin: torch.Tensor,  # [num_tokens, 1, head_dim/2]
    num_heads: int,
    num_kv_heads: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k ([num_tokens, heads, head_dim]) normalised per head (Qwen3; not without weights: Qwen2,
    EuroBERT), then rotated (rotate-half RoPE)."""
    num_tokens = qkv.shape[0]
    half = cos.shape[-1]
    q = qkv.new_empty(num_tokens, num_heads, 2 * half)
    k = qkv.new_empty(num_tokens, num_kv_heads, 2 * half)
    has_norm = q_weight is not None
    assert has_norm == (k_weight is not None), "both q and k are normalised, or neither"
    _qk_norm_rope_kernel[(num_tokens, 2)](
        qkv, qkv if q_weight is None else q_weight, qkv if k_weight is None else k_weight,
        cos, sin, q, k, qkv.stride(0), eps,
        HQ=num_heads, HKV=num_kv_heads, HALF=half,
        BLOCK_HQ=triton.next_power_of_2(num_heads), BLOCK_HKV=triton.next_power_of_2(num_kv_heads),
        NORM=has_norm,
    )  # fmt: skip
    return q, k


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up for gate_up = [gate | up] ([num_tokens, 2 * inter] -> [num_tokens, inter])."""
    num_rows, width = gate_up.shape
    inter = width // 2
    out = gate_up.new_empty(num_rows, inter)
    block = min(triton.next_power_of_2(inter), 2048)
    grid = (num_rows, triton.cdiv(inter, block))
    _silu_mul_kernel[grid](gate_up, out, width, inter, BLOCK=block, num_warps=4)
    return out


# Triton kernels: their parameters are device pointers and tl.constexpr values, which Triton's
# JIT reads from the annotations it knows; nothing here types them for mypy (triton has no stubs).
if triton is not None:

    @triton.jit  # type: ignore[untyped-decorator]
    def _rms_norm_kernel(  # type: ignore[no-untyped-def]
        X, R, W, Y, S, Q, QS, hidden, eps,
        HAS_RESIDUAL: tl.constexpr, QUANT: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < hidden
        x = tl.load(X + row * hidden + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            x += tl.load(R + row * hidden + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(S + row * hidden + cols, x.to(S.dtype.element_ty), mask=mask)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / hidden + eps)
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        y = x * rstd * w
        if QUANT:  # e4m3 per row (fp8.py): 448 is e4m3's largest value, 1e-12 the smallest amax
            scale = tl.maximum(tl.max(tl.where(mask, tl.abs(y), 0.0), axis=0), 1e-12) / 448.0
            q = tl.minimum(tl.maximum(y / scale, -448.0), 448.0)
            tl.store(Q + row * hidden + cols, q.to(Q.dtype.element_ty), mask=mask)
            tl.store(QS + row, scale)
        else:
            tl.store(Y + row * hidden + cols, y.to(Y.dtype.element_ty), mask=mask)

    @triton.jit  # type: ignore[untyped-decorator]
    def _norm_rope_heads(  # type: ignore[no-untyped-def]
        SRC, W, OUT, c, s, eps, H: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr, NORM: tl.constexpr
    ):  # fmt: skip
        heads = tl.arange(0, BLOCK_H)[:, None]
        dims = tl.arange(0, HALF)[None, :]
        mask = heads < H
        first = SRC + heads * (2 * HALF) + dims
        n1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
        n2 = tl.load(first + HALF, mask=mask, other=0.0).to(tl.float32)
        if NORM:  # a compile-time branch: without it, the heads are rotated as they are
            mean_square = (tl.sum(n1 * n1, axis=1) + tl.sum(n2 * n2, axis=1)) / (2 * HALF)
            rstd = (1.0 / tl.sqrt(mean_square + eps))[:, None]
            n1 = n1 * rstd * tl.load(W + dims).to(tl.float32)
            n2 = n2 * rstd * tl.load(W + HALF + dims).to(tl.float32)
        out = OUT + heads * (2 * HALF) + dims
        tl.store(out, (n1 * c - n2 * s).to(OUT.dtype.element_ty), mask=mask)
        tl.store(out + HALF, (n2 * c + n1 * s).to(OUT.dtype.element_ty), mask=mask)

    @triton.jit  # type: ignore[untyped-decorator]
    def _qk_norm_rope_kernel(  # type: ignore[no-untyped-def]
        QKV, QW, KW, COS, SIN, Q, K, stride_qkv, eps,
        HQ: tl.constexpr, HKV: tl.constexpr, HALF: tl.constexpr,
        BLOCK_HQ: tl.constexpr, BLOCK_HKV: tl.constexpr, NORM: tl.constexpr,
    ):  # fmt: skip
        token = tl.program_id(0).to(tl.int64)
        dims = tl.arange(0, HALF)[None, :]
        c = tl.load(COS + token * HALF + dims).to(tl.float32)
        s = tl.load(SIN + token * HALF + dims).to(tl.float32)
        row = QKV + token * stride_qkv
        if tl.program_id(1) == 0:
            _norm_rope_heads(row, QW, Q + token * (HQ * 2 * HALF), c, s, eps, HQ, HALF, BLOCK_HQ, NORM)
        else:
            _norm_rope_heads(
                row + HQ * 2 * HALF, KW, K + token * (HKV * 2 * HALF), c, s, eps, HKV, HALF, BLOCK_HKV, NORM
            )

    @triton.jit  # type: ignore[untyped-decorator]
    def _silu_mul_kernel(GU, Y, width, inter, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < inter
        gate = tl.load(GU + row * width + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(GU + row * width + inter + cols, mask=mask, other=0.0).to(tl.float32)
        y = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(Y + row * inter + cols, y.to(Y.dtype.element_ty), mask=mask)
