"""Normalisations the decoder families share (nn.LayerNorm serves the BERT family as it is)."""

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
