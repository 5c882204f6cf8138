"""Fused GPU steps of the encoder layers, each with the plain eager form on the CPU.

The FFN's GELU as a separate kernel is one more launch and one more pass over the intermediate
activations (4x the hidden width), and the residual add before each LayerNorm one more pass over
the activations (docs/benchmarks-history.md). On CUDA:
- `linear_activation` runs the up-projection with bias and GELU in one cuBLASLt call
  (`torch._addmm_activation`, GELU epilogue). That epilogue is the tanh approximation of GELU; for
  models trained with the exact (erf) GELU the difference stays far inside cosine 0.999 of the
  reference (the GPU tests check each family against transformers in fp32).
- `add_layer_norm` adds the residual and normalises in one Triton kernel, in float32 registers
  (one row per program), so the sum is not rounded to bfloat16 before the statistics.
  `add_layer_norm_fp8` also writes the row quantised to e4m3 with its scale, for the next fp8
  GEMM (fp8.py), from the same registers.
Where Triton is not installed (the CPU build of torch), the eager form runs.
"""

from collections.abc import Callable

import torch
from torch import nn

from kembed.worker.engine.kernels.fp8 import FP8_DTYPE, Fp8Rows, quantize_rows_reference

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only torch builds ship without Triton
    triton = None

GELU_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh")


def linear_activation(
    x: torch.Tensor, linear: nn.Linear, activation: str, eager: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """activation(x @ W.T + b) on [num_tokens, in]: one cuBLASLt call on CUDA for the GELUs."""
    # a subclass of nn.Linear (layers/lora.py) has a forward of its own: computed as it says
    if x.is_cuda and activation in GELU_ACTIVATIONS and type(linear) is nn.Linear:
        return torch._addmm_activation(linear.bias, x, linear.weight.t(), use_gelu=True)
    return eager(linear(x))


def add_layer_norm(x: torch.Tensor, residual: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
    """LayerNorm(x + residual) over the last dimension of [num_tokens, hidden] tensors."""
    if triton is None or not x.is_cuda:
        normed: torch.Tensor = norm(x + residual)
        return normed
    num_rows, hidden = x.shape
    out = torch.empty_like(x)
    block = triton.next_power_of_2(hidden)
    _add_layer_norm_kernel[(num_rows,)](
        x, residual, norm.weight, norm.bias, out, out, out,
        x.stride(0), residual.stride(0), out.stride(0), hidden, norm.eps,
        QUANT=False, BLOCK=block, num_warps=4 if block <= 1024 else 8,
    )  # fmt: skip
    return out


def add_layer_norm_fp8(
    x: torch.Tensor, residual: torch.Tensor, norm: nn.LayerNorm
) -> tuple[torch.Tensor, Fp8Rows]:
    """(LayerNorm(x + residual), the same rows quantised per row to e4m3): one kernel on CUDA."""
    if triton is None or not x.is_cuda:
        normed: torch.Tensor = norm(x + residual)
        return normed, quantize_rows_reference(normed)
    num_rows, hidden = x.shape
    out = torch.empty_like(x)
    data = torch.empty(num_rows, hidden, dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty(num_rows, 1, dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(hidden)
    _add_layer_norm_kernel[(num_rows,)](
        x, residual, norm.weight, norm.bias, out, data, scale,
        x.stride(0), residual.stride(0), out.stride(0), hidden, norm.eps,
        QUANT=True, BLOCK=block, num_warps=4 if block <= 1024 else 8,
    )  # fmt: skip
    return out, Fp8Rows(data, scale)


# Triton kernels: their parameters are device pointers and tl.constexpr values, which Triton's
# JIT reads from the annotations it knows; nothing here types them for mypy (triton has no stubs).
if triton is not None:

    @triton.jit  # type: ignore[untyped-decorator]
    def _add_layer_norm_kernel(  # type: ignore[no-untyped-def]
        X, R, W, B, Y, Q, S, stride_x, stride_r, stride_y, hidden, eps,
        QUANT: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < hidden
        x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        r = tl.load(R + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        h = x + r
        mean = tl.sum(h, axis=0) / hidden
        centered = tl.where(mask, h - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(centered * centered, axis=0) / hidden + eps)
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
        y = centered * rstd * w + b
        tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)
        if QUANT:  # e4m3 per row (fp8.py): 448 is e4m3's largest value, 1e-12 the smallest amax
            scale = tl.maximum(tl.max(tl.where(mask, tl.abs(y), 0.0), axis=0), 1e-12) / 448.0
            q = tl.minimum(tl.maximum(y / scale, -448.0), 448.0)
            tl.store(Q + row * hidden + cols, q.to(Q.dtype.element_ty), mask=mask)
            tl.store(S + row, scale)
