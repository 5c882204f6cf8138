"""Rotary position embeddings (RoPE) for packed tokens: cos/sin tables built once, gathered per token.

Positions restart at 0 in every packed sequence (`position_ids`), so the rotation of a token depends
on its place in its own sequence only. The tables are buffers computed when the model is built and
indexed by `position_ids` on the device: no host work and no data-dependent shape in the forward
pass, so it is CUDA-graph capturable. Numerics follow transformers' default RoPE exactly: the angles
are computed in float32, then the tables take the model's dtype (`Module.to` casts buffers), which
is what transformers does by casting cos/sin to the activations' dtype.

Two layouts pair a head's dimensions: rotate-half (Llama, Qwen, GPT-NeoX: dimension i with
i + rotary_dim/2) and interleaved (GPT-J, flash-attn's `interleaved=True`: 2i with 2i + 1). A
partial rotary (`rotary_dim` < head_dim, nomic's `rotary_emb_fraction`) turns the first `rotary_dim`
dimensions of each head and passes the rest through. Position-independent scalings are a divisor of
the inverse frequencies: transformers' `linear` (its factor) and GTE's fixed NTK (factor^(2/dim),
theta multiplied by the factor: `ntk_scaling`).
"""

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    """RoPE tables over `rotary_dim` dimensions of a head (its whole head_dim unless partial)."""

    cos: torch.Tensor  # buffer, registered in __init__
    sin: torch.Tensor

    def __init__(
        self, rotary_dim: int, max_positions: int, theta: float, inv_freq_divisor: float = 1.0
    ) -> None:
        super().__init__()
        assert rotary_dim % 2 == 0, rotary_dim
        inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
        if inv_freq_divisor != 1.0:  # float32 tensor / Python float, as transformers and GTE divide
            inv_freq = inv_freq / inv_freq_divisor
        angles = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq  # [max_pos, D/2]
        # Half-width tables: the two halves of transformers' duplicated [max_pos, D] table are equal.
        # Not persistent: derived from the config, never part of a checkpoint.
        self.register_buffer("cos", angles.cos(), persistent=False)  # [max_positions, rotary_dim/2]
        self.register_buffer("sin", angles.sin(), persistent=False)  # [max_positions, rotary_dim/2]

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin for each token, [num_tokens, 1, rotary_dim/2], broadcast over heads by `rotate`.

        Gathered once per forward pass and shared by every layer."""
        return self.cos[position_ids].unsqueeze(1), self.sin[position_ids].unsqueeze(1)


def ntk_scaling(theta: float, factor: float, rotary_dim: int) -> tuple[float, float]:
    """(theta, inverse-frequency divisor) of GTE's fixed NTK scaling (`rope_scaling: {type: ntk}` in
    Alibaba's NewModel, `mixed_b` unset): inv_freq = (theta * factor)^(-2i/d) / factor^(2/d) at every
    position, since its cache is built for factor x max_position_embeddings positions at load."""
    return theta * factor, factor ** (2 / rotary_dim)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """Apply RoPE to x [num_tokens, heads, head_dim] with cos/sin [num_tokens, 1, rotary_dim/2]; the
    dimensions past rotary_dim (a partial rotary) pass through unchanged."""
    rotary_dim = 2 * cos.shape[-1]
    if rotary_dim < x.shape[-1]:
        turned = rotate(x[..., :rotary_dim], cos, sin, interleaved)
        return torch.cat((turned, x[..., rotary_dim:]), dim=-1)
    if interleaved:  # pairs (2i, 2i + 1), as GPT-J's rotate_every_two
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    x1, x2 = x.chunk(2, dim=-1)
    # Same products and sums, in the same dtype, as transformers' `x * cos + rotate_half(x) * sin`.
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
