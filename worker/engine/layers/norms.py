"""Normalisations beyond torch's LayerNorm (which serves the BERT family as it is; ModernBERT's
without bias is `nn.LayerNorm(bias=False)`): Llama's RMSNorm (Qwen2, Qwen3, Mistral, EuroBERT, T5)
and Gemma's, whose weight is an offset from one.
"""

import torch
from torch import nn


class RMSNorm(nn.Module):
    """Llama's RMSNorm (Qwen2, Qwen3, EuroBERT): normalised in float32 whatever the model dtype, then
    cast back before the weight, as transformers does, because a bfloat16 mean of squares over 1024
    channels loses too many digits."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


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
