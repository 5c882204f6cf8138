"""Rotary position embeddings (RoPE) for packed tokens: cos/sin tables built once, gathered per token.

Positions restart at 0 in every packed sequence (`position_ids`), so the rotation of a token depends
on its place in its own sequence only. The tables are buffers computed when the model is built and
indexed by `position_ids` on the device: no host work and no data-dependent shape in the forward
pass, so it is CUDA-graph capturable. Numerics follow transformers' default RoPE exactly: the angles
are computed in float32, then the tables take the model's dtype (`Module.to` casts buffers), which
is what transformers does by casting cos/sin to the activations' dtype.
"""

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    """Unscaled RoPE in the rotate-half layout (Llama, Qwen): dimension i pairs with i + head_dim/2."""

    cos: torch.Tensor  # buffer, registered in __init__
    sin: torch.Tensor

    def __init__(self, head_dim: int, max_positions: int, theta: float) -> None:
        super().__init__()
        assert head_dim % 2 == 0, head_dim
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        angles = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq  # [max_pos, D/2]
        # Half-width tables: the two halves of transformers' duplicated [max_pos, D] table are equal.
        # Not persistent: derived from the config, never part of a checkpoint.
        self.register_buffer("cos", angles.cos(), persistent=False)  # [max_positions, head_dim/2]
        self.register_buffer("sin", angles.sin(), persistent=False)  # [max_positions, head_dim/2]

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin for each token, [num_tokens, 1, head_dim/2], broadcast over heads by `rotate`.

        Gathered once per forward pass and shared by every layer."""
        return self.cos[position_ids].unsqueeze(1), self.sin[position_ids].unsqueeze(1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply RoPE to x [num_tokens, heads, head_dim] with cos/sin [num_tokens, 1, head_dim/2]."""
    x1, x2 = x.chunk(2, dim=-1)
    # Same products and sums, in the same dtype, as transformers' `x * cos + rotate_half(x) * sin`.
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
