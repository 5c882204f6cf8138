"""Attention biases by relative position, added to the attention scores before the softmax.

Two kinds, each a family's way of telling attention where a key sits from its query:
- `DistanceBias` (MPNet, T5): a learnt value per head and bucket of the distance key - query, the same
  for every token; the buckets are T5's (exact below half of them, logarithmic up to `max_distance`,
  constant beyond), so the bias is a table of `2 * max_distance + 1` values a head, indexed by the
  clamped distance: small enough to read inside a kernel (triton_attention.py).
- `DisentangledBias` (DeBERTa-v2/v3): content-to-position (the query against the key's relative
  position embedding) and position-to-content (the key against the query's) terms: per token and head,
  one score for each of the `2 * span` relative positions, gathered by the log-bucketed distance
  query - key. It depends on the layer's q and k: the Triton kernel gathers it per score tile from
  the per-token tables; torch's, FlashAttention's and flashinfer's kernels take no such bias.

A backend asks a bias for what it needs: `sequence(start, end)` for one packed sequence [heads, L, L]
(the CPU loop), `padded(...)` for the padded block [num_seqs or 1, heads, max_seqlen, max_seqlen]
(`sdpa-padded`). `scale` is the factor of q·k the bias goes with (None: 1/sqrt(head_dim)): T5 does
not scale its scores, DeBERTa divides by sqrt(head_dim * (1 + number of position terms)).
"""

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import nn

DISTANCE = "distance"  # AttentionShape.bias of a DistanceBias model
DISENTANGLED = "disentangled"  # of a DisentangledBias model


class AttentionBias(ABC):
    """An additive bias of one batch's attention scores; the backends say which kinds they take."""

    kind: str
    scale: float | None  # the softmax scale of q·k it goes with; None: 1/sqrt(head_dim)

    @abstractmethod
    def sequence(self, start: int, end: int) -> torch.Tensor:
        """[heads, L, L] for the packed sequence of tokens [start, end)."""

    @abstractmethod
    def padded(self, pad_index: torch.Tensor | None, num_seqs: int, max_seqlen: int) -> torch.Tensor:
        """[num_seqs or 1, heads, max_seqlen, max_seqlen] for the batch padded as `SdpaPaddedAttention`
        pads it (`pad_index` into the packed tokens plus a zero row; None: already dense)."""


def t5_buckets(relative_position: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """T5's bidirectional bucket of each distance key - query (transformers' `_relative_position_bucket`,
    which MPNet's `relative_position_bucket` computes alike), in the same float32 operations."""
    half = num_buckets // 2
    buckets = (relative_position > 0).to(torch.long) * half
    distance = torch.abs(relative_position)
    max_exact = half // 2
    is_small = distance < max_exact
    if_large = max_exact + (
        torch.log(distance.float() / max_exact) / math.log(max_distance / max_exact) * (half - max_exact)
    ).to(torch.long)
    if_large = torch.min(if_large, torch.full_like(if_large, half - 1))
    return buckets + torch.where(is_small, distance, if_large)


@dataclass(frozen=True)
class DistanceBias(AttentionBias):
    """bias[h, i, j] = table[h, clamp(j - i, -max_distance, max_distance) + max_distance]."""

    table: torch.Tensor  # [heads, 2 * max_distance + 1], the model's dtype
    max_distance: int
    scale: float | None = None
    kind: str = DISTANCE

    def _block(self, length: int) -> torch.Tensor:  # [heads, length, length]
        positions = torch.arange(length, device=self.table.device)
        distance = (positions[None, :] - positions[:, None]).clamp(-self.max_distance, self.max_distance)
        return self.table[:, distance + self.max_distance]

    def sequence(self, start: int, end: int) -> torch.Tensor:
        return self._block(end - start)

    def padded(self, pad_index: torch.Tensor | None, num_seqs: int, max_seqlen: int) -> torch.Tensor:
        return self._block(max_seqlen).unsqueeze(0)  # every padded sequence starts at position 0


class RelativePositionBias(nn.Module):
    """MPNet's and T5's learnt bias (`relative_attention_bias`, an embedding [num_buckets, heads]) as
    the `DistanceBias` every layer shares. Bucketed once here, on the CPU, as transformers' CPU
    reference buckets: the table of one forward is then a gather of `2 * max_distance + 1` rows."""

    distance_buckets: torch.Tensor  # buffer [2 * max_distance + 1] int64

    def __init__(self, num_embeddings: int, num_heads: int, num_buckets: int, max_distance: int) -> None:
        super().__init__()
        self.relative_attention_bias = nn.Embedding(num_embeddings, num_heads)
        self.max_distance = max_distance
        distances = torch.arange(-max_distance, max_distance + 1)
        # past max_distance every distance falls in its direction's last bucket: clamping is exact
        buckets = t5_buckets(distances, num_buckets, max_distance)
        self.register_buffer("distance_buckets", buckets, persistent=False)

    def forward(self, scale: float | None = None) -> DistanceBias:
        table = self.relative_attention_bias.weight[self.distance_buckets].t().contiguous()
        return DistanceBias(table, self.max_distance, scale)


def log_bucket_positions(relative: torch.Tensor, bucket_size: int, max_position: int) -> torch.Tensor:
    """DeBERTa-v2's `make_log_bucket_position` of distances query - key, in the same operations."""
    sign = torch.sign(relative)
    mid = bucket_size // 2
    abs_pos = torch.where(
        (relative < mid) & (relative > -mid), torch.tensor(mid - 1).type_as(relative), torch.abs(relative)
    )
    log_pos = (
        torch.ceil(torch.log(abs_pos / mid) / torch.log(torch.tensor((max_position - 1) / mid)) * (mid - 1))
        + mid
    )
    return torch.where(abs_pos <= mid, relative.type_as(log_pos), log_pos * sign).to(torch.long)


@dataclass(frozen=True)
class DisentangledBias(AttentionBias):
    """bias[h, i, j] = c2p[i, h, b] + p2c[j, h, b] with b = `positions[i - j + max_position - 1]`:
    each token's scores against the relative position embeddings, already divided by the scale."""

    c2p: torch.Tensor | None  # [num_tokens, heads, 2 * span]: query i against position b's key
    p2c: torch.Tensor | None  # [num_tokens, heads, 2 * span]: key j against position b's query
    positions: torch.Tensor  # [2 * max_position - 1] int64: clamp(bucket(query - key) + span)
    max_position: int
    scale: float | None = None
    kind: str = DISENTANGLED

    def _gathered(self, c2p: torch.Tensor | None, p2c: torch.Tensor | None, length: int) -> torch.Tensor:
        """c2p, p2c [batch, heads, length, 2 * span] -> bias [batch, heads, length, length]."""
        positions = torch.arange(length, device=self.positions.device)
        index = self.positions[positions[:, None] - positions[None, :] + self.max_position - 1]
        bias: torch.Tensor | int = 0
        if c2p is not None:  # [b, h, q, k] = c2p[b, h, q, index[q, k]]
            bias = bias + torch.gather(c2p, 3, index.expand(*c2p.shape[:2], length, length))
        if p2c is not None:  # [b, h, k, q] = p2c[b, h, k, index[q, k]], then to [b, h, q, k]
            by_key = torch.gather(p2c, 3, index.t().expand(*p2c.shape[:2], length, length))
            bias = bias + by_key.transpose(2, 3)
        assert isinstance(bias, torch.Tensor), "a disentangled bias has at least one term"
        return bias

    def sequence(self, start: int, end: int) -> torch.Tensor:
        def one(table: torch.Tensor | None) -> torch.Tensor | None:
            return None if table is None else table[start:end].transpose(0, 1).unsqueeze(0)

        return self._gathered(one(self.c2p), one(self.p2c), end - start)[0]

    def padded(self, pad_index: torch.Tensor | None, num_seqs: int, max_seqlen: int) -> torch.Tensor:
        def padded(table: torch.Tensor | None) -> torch.Tensor | None:
            if table is None:
                return None
            if pad_index is not None:
                table = torch.cat([table, table.new_zeros(1, *table.shape[1:])])[pad_index]
            return table.view(num_seqs, max_seqlen, *table.shape[1:]).transpose(1, 2)

        return self._gathered(padded(self.c2p), padded(self.p2c), max_seqlen)
