"""Norms beyond torch's LayerNorm: Gemma's RMSNorm, whose weight is an offset from one.

(LayerNorm without bias, ModernBERT's where `norm_bias` is false, is `nn.LayerNorm(bias=False)`;
Qwen3's RMSNorm, a plain scale, is in qwen3.py.)
"""

import torch
from torch import nn


class OffsetRMSNorm(nn.Module):
    """Gemma's RMSNorm: `x / rms(x) * (1 + weight)`, all in float32, rounded to the input's dtype once
    at the end (transformers' Gemma3RMSNorm; Llama's rounds before the scale)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.float())).to(x.dtype)
