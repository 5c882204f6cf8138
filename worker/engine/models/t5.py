"""T5 encoders (sentence-t5, GTR: transformers' `T5EncoderModel`) over packed ragged batches.

A pre-norm encoder: each layer adds attention of its RMS-normed input, then an MLP of its RMS-normed
input (ReLU for T5, a gated GELU for T5 v1.1 and mT5: `feed_forward_proj`); a final RMSNorm ends it.
Attention scores are not scaled (T5 folds the scale into its weights) and carry a relative position
bias learnt by the first layer alone and shared by all (`block.0...relative_attention_bias`, T5's
bidirectional buckets: relative_bias.py). No linear has a bias. T5's norm is Qwen3's RMSNorm (the
variance in float32, the product in the weights' dtype). In float16, as transformers does, hidden
states are clamped below float16's largest value after every half-layer (T5's activations grow).
"""

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from kembed.worker.engine.layers.attention import Attention, AttentionMetadata
from kembed.worker.engine.layers.norms import RMSNorm
from kembed.worker.engine.layers.relative_bias import DistanceBias, RelativePositionBias
from kembed.worker.engine.models.bert import HIDDEN_ACTIVATIONS
from kembed.worker.engine.models.served import PooledEmbedder
from kembed.worker.errors import InvalidInput

T5_FAMILY = ("t5", "mt5")


@dataclass(frozen=True)
class T5Shape:
    """The config.json fields that shape the encoder."""

    vocab_size: int
    hidden_size: int  # d_model
    head_dim: int  # d_kv (need not be d_model / num_heads)
    num_heads: int
    num_layers: int
    intermediate_size: int  # d_ff
    activation: str  # dense_act_fn, as transformers' T5Config derives it
    is_gated: bool
    num_buckets: int
    max_distance: int
    layer_norm_eps: float
    max_position_embeddings: int  # none in T5: the tokenizer's limit, or 512

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "T5Shape":
        if config.get("model_type") not in T5_FAMILY:
            raise InvalidInput(f"model_type {config.get('model_type')!r} is not a T5 encoder {T5_FAMILY}")
        if config.get("is_decoder"):
            raise InvalidInput("a T5 decoder (is_decoder: true) is not an encoder kembed serves")
        default_proj = "gated-gelu" if config["model_type"] == "mt5" else "relu"
        projection = str(config.get("feed_forward_proj", default_proj))
        parts = projection.split("-")
        activation = "gelu_new" if projection == "gated-gelu" else parts[-1]
        if (
            len(parts) > 2
            or (len(parts) == 2 and parts[0] != "gated")
            or activation not in HIDDEN_ACTIVATIONS
        ):
            raise InvalidInput(
                f"feed_forward_proj {projection!r} is not served (relu, gelu or gated-gelu and the "
                f"other activations {sorted(HIDDEN_ACTIVATIONS)}, gated or not)"
            )
        return cls(
            vocab_size=config["vocab_size"],
            hidden_size=config["d_model"],
            head_dim=config.get("d_kv", 64),
            num_heads=config["num_heads"],
            num_layers=config["num_layers"],
            intermediate_size=config["d_ff"],
            activation=activation,
            is_gated=parts[0] == "gated",
            num_buckets=config.get("relative_attention_num_buckets", 32),
            max_distance=config.get("relative_attention_max_distance", 128),
            layer_norm_eps=config.get("layer_norm_epsilon", 1e-6),
            max_position_embeddings=config.get("n_positions") or 512,
        )

    @property
    def max_sequence_length(self) -> int:
        return self.max_position_embeddings


def _clamp_fp16(x: torch.Tensor) -> torch.Tensor:
    """transformers' T5Block clamp in float16 (a no-op in other dtypes): on the device, no sync."""
    if x.dtype != torch.float16:
        return x
    largest = torch.finfo(torch.float16).max
    limit = torch.where(torch.isinf(x).any(), largest - 1000, largest)
    return torch.clamp(x, min=-limit, max=limit)


class T5Layer(nn.Module):
    def __init__(self, shape: T5Shape, attend: Attention) -> None:
        super().__init__()
        hidden, inner = shape.hidden_size, shape.num_heads * shape.head_dim
        self.attn_norm = RMSNorm(hidden, shape.layer_norm_eps)
        self.qkv = nn.Linear(hidden, 3 * inner, bias=False)
        self.o = nn.Linear(inner, hidden, bias=False)
        self.ffn_norm = RMSNorm(hidden, shape.layer_norm_eps)
        self.wi = nn.Linear(hidden, (2 if shape.is_gated else 1) * shape.intermediate_size, bias=False)
        self.wo = nn.Linear(shape.intermediate_size, hidden, bias=False)
        self.activation = HIDDEN_ACTIVATIONS[shape.activation]
        self.is_gated = shape.is_gated
        self.num_heads = shape.num_heads
        self.attend = attend

    def forward(self, x: torch.Tensor, meta: AttentionMetadata, bias: DistanceBias) -> torch.Tensor:
        num_tokens = x.shape[0]
        q, k, v = self.qkv(self.attn_norm(x)).view(num_tokens, 3, self.num_heads, -1).unbind(1)
        x = _clamp_fp16(x + self.o(self.attend(q, k, v, meta, False, bias=bias).reshape(num_tokens, -1)))
        hidden = self.wi(self.ffn_norm(x))
        if self.is_gated:  # act(wi_0 x) * wi_1 x, the two fused into one matmul
            gate, up = hidden.chunk(2, dim=-1)
            hidden = self.activation(gate) * up
        else:
            hidden = self.activation(hidden)
        return _clamp_fp16(x + self.wo(hidden))


class T5Embedder(PooledEmbedder):
    """T5 encoder + sentence-transformers pooling (sentence-t5: mean, a Dense layer, Normalize)."""

    def __init__(self, shape: T5Shape, attend: Attention, pooling: str) -> None:
        super().__init__(pooling, shape.hidden_size, shape.max_sequence_length, shape.vocab_size)
        self.shape = shape
        self.embed_tokens = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.position_bias = RelativePositionBias(
            shape.num_buckets, shape.num_heads, shape.num_buckets, shape.max_distance
        )
        self.layers = nn.ModuleList(T5Layer(shape, attend) for _ in range(shape.num_layers))
        self.final_norm = RMSNorm(shape.hidden_size, shape.layer_norm_eps)

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,  # T5 has no absolute positions: the bias is by distance
        token_type_ids: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        bias = self.position_bias(scale=1.0)  # T5 does not scale its scores
        for layer in self.layers:
            x = layer(x, meta, bias)
        out: torch.Tensor = self.final_norm(x)
        return out  # [num_tokens, hidden]

    def load_hf_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Load a transformers T5EncoderModel (or whole T5 model's) state dict: the encoder's
        tensors, Q/K/V and a gated MLP's two input projections fused; any decoder's ignored."""
        embedding = weights.get("encoder.embed_tokens.weight", weights.get("shared.weight"))
        if embedding is None:
            raise InvalidInput("a T5 checkpoint without shared.weight or encoder.embed_tokens.weight")
        first = "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
        state = {
            "embed_tokens.weight": embedding,
            "position_bias.relative_attention_bias.weight": weights[first],
            "final_norm.weight": weights["encoder.final_layer_norm.weight"],
        }
        wi = ("wi_0", "wi_1") if self.shape.is_gated else ("wi",)
        for i in range(self.shape.num_layers):
            hf, ours = f"encoder.block.{i}.layer.", f"layers.{i}."
            attention = f"{hf}0.SelfAttention."
            state[ours + "attn_norm.weight"] = weights[f"{hf}0.layer_norm.weight"]
            state[ours + "qkv.weight"] = torch.cat([weights[f"{attention}{n}.weight"] for n in "qkv"])
            state[ours + "o.weight"] = weights[f"{attention}o.weight"]
            state[ours + "ffn_norm.weight"] = weights[f"{hf}1.layer_norm.weight"]
            state[ours + "wi.weight"] = torch.cat([weights[f"{hf}1.DenseReluDense.{n}.weight"] for n in wi])
            state[ours + "wo.weight"] = weights[f"{hf}1.DenseReluDense.wo.weight"]
        self.load_state_dict(state, strict=True)
