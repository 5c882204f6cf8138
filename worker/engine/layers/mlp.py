"""Gated MLPs (GeGLU, SwiGLU): `down(act(first half) * second half)` of one fused up-projection.

ModernBERT stores the two halves as one matrix (`Wi`, the activated half first); Gemma 3 as
`gate_proj` (activated) and `up_proj`, concatenated at load so either is one GEMM. Activations are
looked up by the names configs use (`hidden_act`, `hidden_activation`).
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}


class GatedMLP(nn.Module):
    """[num_tokens, hidden] -> [num_tokens, hidden]: `down(act(x W1) * (x W2))`, W1 and W2 one matrix."""

    def __init__(self, hidden: int, intermediate: int, activation: str, bias: bool) -> None:
        super().__init__()
        self.up = nn.Linear(hidden, 2 * intermediate, bias=bias)  # [activated | linear] halves
        self.down = nn.Linear(intermediate, hidden, bias=bias)
        self.activation = ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.up(x).chunk(2, dim=-1)
        out: torch.Tensor = self.down(self.activation(gate) * up)
        return out
