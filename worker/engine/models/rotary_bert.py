"""BERT-style encoders with rotary positions over packed ragged batches: the network NomicBERT, GTE
and jina-embeddings-v3 share, each family a config reading and a weight-name mapping (nomic_bert.py,
gte.py, jina_v3.py) onto it.

transformers writes all three on one skeleton (`JinaEmbeddingsV3Model`, which `NomicBertModel` and
`GteModel` subclass): embeddings (word, plus token types where the model has them, LayerNorm, no
absolute positions), then per layer, post-norm as BERT,
    x = LayerNorm(x + o_proj(attention(rope(q), rope(k), v)))
    x = LayerNorm(x + mlp(x))
with full bidirectional attention. They differ in the MLP (jina: up, GELU, down with biases; nomic:
SwiGLU without biases; GTE: GeGLU, down with a bias), in attention biases and in the rotary (theta,
scaling). Q, K and V are fused into one matmul at load, and so are the gated MLP's gate and up.
On CUDA the residual adds and LayerNorms run fused in float32 (`add_layer_norm`, kernels/fused.py).
There is no fp8 path: `--linear-dtype fp8` refuses these models (they name no FP8_LINEARS).
"""

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from kembed.worker.engine.kernels.fused import add_layer_norm
from kembed.worker.engine.layers.attention import Attention, AttentionMetadata
from kembed.worker.engine.layers.mlp import DenseMLP, GatedMLP
from kembed.worker.engine.layers.rope import RotaryEmbedding, ntk_scaling, rotate
from kembed.worker.engine.models.served import PooledEmbedder
from kembed.worker.errors import InvalidInput


@dataclass(frozen=True)
class RotaryEncoderShape:
    """What shapes a rotary encoder, read from config.json by its family's module."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    activation: str  # transformers' hidden_act name (layers/mlp.py)
    type_vocab_size: int  # 0: no token-type embeddings (gte-base-en-v1.5)
    layer_norm_eps: float
    max_positions: int  # the longest sequence served (the rotary tables' length)
    rope_theta: float
    rope_divisor: float = 1.0  # the inverse frequencies' divisor: linear and fixed-NTK scalings
    rotary_dim: int = 0  # dimensions of a head that rotate; 0: all of them
    rotary_interleaved: bool = False  # pairs (2i, 2i + 1) rather than (i, i + rotary_dim/2)
    attention_bias: bool = True  # on the fused qkv and the output projection
    is_gated: bool = False  # GLU MLP (gate_up, down) rather than (up, down)
    gate_up_bias: bool = False
    down_bias: bool = True

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def max_sequence_length(self) -> int:
        return self.max_positions

    def describe(self) -> str:
        """The network in a line (check-model)."""
        rotary_dim = self.rotary_dim or self.head_dim
        scaled = "" if self.rope_divisor == 1.0 else f", frequencies / {self.rope_divisor:.6g}"
        pairs = "interleaved" if self.rotary_interleaved else "rotate-half"
        mlp = f"gated {self.activation} MLP" if self.is_gated else f"{self.activation} MLP"
        return (
            f"{self.num_layers} post-norm layers of {self.hidden_size} ({self.num_heads} heads), rotary "
            f"theta {self.rope_theta:g} over {rotary_dim} of {self.head_dim} dims ({pairs}{scaled}), {mlp}, "
            f"bidirectional attention"
        )

    def check(self) -> "RotaryEncoderShape":
        """Itself, after the checks every family needs; InvalidInput naming what does not fit."""
        rotary_dim = self.rotary_dim or self.head_dim
        if self.hidden_size % self.num_heads or rotary_dim % 2 or rotary_dim > self.head_dim:
            raise InvalidInput(
                f"bad attention shape: hidden {self.hidden_size}, {self.num_heads} heads, "
                f"rotary over {rotary_dim} of each head's dimensions"
            )
        return self


class RotaryEncoderLayer(nn.Module):
    def __init__(self, shape: RotaryEncoderShape, attend: Attention) -> None:
        super().__init__()
        hidden, eps = shape.hidden_size, shape.layer_norm_eps
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=shape.attention_bias)
        self.attn_out = nn.Linear(hidden, hidden, bias=shape.attention_bias)
        self.attn_norm = nn.LayerNorm(hidden, eps=eps)
        self.mlp: GatedMLP | DenseMLP
        if shape.is_gated:
            bias = {"gate_up_bias": shape.gate_up_bias, "down_bias": shape.down_bias}
            self.mlp = GatedMLP(hidden, shape.intermediate_size, shape.activation, **bias)
        else:
            self.mlp = DenseMLP(hidden, shape.intermediate_size, shape.activation)
        self.mlp_norm = nn.LayerNorm(hidden, eps=eps)
        self.num_heads, self.interleaved = shape.num_heads, shape.rotary_interleaved
        self.attend = attend

    def forward(
        self,
        x: torch.Tensor,  # [num_tokens, hidden]
        cos: torch.Tensor,  # [num_tokens, 1, rotary_dim/2]
        sin: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [num_tokens, hidden]
        num_tokens = x.shape[0]
        q, k, v = self.qkv(x).view(num_tokens, 3, self.num_heads, -1).unbind(1)
        q, k = rotate(q, cos, sin, self.interleaved), rotate(k, cos, sin, self.interleaved)
        attn = self.attend(q, k, v, meta, False).reshape(num_tokens, -1)
        x = add_layer_norm(self.attn_out(attn), x, self.attn_norm)
        return add_layer_norm(self.mlp(x), x, self.mlp_norm)


class RotaryEncoder(nn.Module):
    """Embeddings + rotary encoder layers; returns the last hidden state of every packed token."""

    def __init__(self, shape: RotaryEncoderShape, attend: Attention) -> None:
        super().__init__()
        self.shape = shape
        hidden = shape.hidden_size
        self.word_embeddings = nn.Embedding(shape.vocab_size, hidden)
        self.token_type_embeddings = (
            nn.Embedding(shape.type_vocab_size, hidden) if shape.type_vocab_size else None
        )
        self.embed_norm = nn.LayerNorm(hidden, eps=shape.layer_norm_eps)
        self.rope = RotaryEmbedding(
            shape.rotary_dim or shape.head_dim, shape.max_positions, shape.rope_theta, shape.rope_divisor
        )
        self.layers = nn.ModuleList(RotaryEncoderLayer(shape, attend) for _ in range(shape.num_layers))

    def forward(
        self,
        input_ids: torch.Tensor,  # [num_tokens]
        position_ids: torch.Tensor,  # [num_tokens], 0-based within each sequence
        token_type_ids: torch.Tensor,  # [num_tokens]
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        x: torch.Tensor = self.word_embeddings(input_ids)
        if self.token_type_embeddings is not None:
            # one type (jina, gte-multilingual): whatever the wire carries reads row 0, never past it
            types = token_type_ids if self.shape.type_vocab_size > 1 else torch.zeros_like(token_type_ids)
            x = x + self.token_type_embeddings(types)
        x = self.embed_norm(x)
        cos, sin = self.rope(position_ids)
        for layer in self.layers:
            x = layer(x, cos, sin, meta)
        return x  # [num_tokens, hidden]

    def load(self, state: dict[str, torch.Tensor]) -> None:
        """Load a state dict in this module's names (the family's mapping of its checkpoint's)."""
        try:
            self.load_state_dict(state, strict=True)
        except RuntimeError as error:  # missing, unexpected or misshapen tensors
            raise InvalidInput(f"the checkpoint's weights do not fit its config.json: {error}") from None


def take(weights: dict[str, torch.Tensor], key: str) -> torch.Tensor:
    """weights[key]; InvalidInput naming the key where the checkpoint lacks it."""
    if key not in weights:
        raise InvalidInput(f"the checkpoint has no {key} (its config.json asks for it)")
    return weights[key]


def linear_state(
    weights: dict[str, torch.Tensor], ours: str, theirs: str, has_bias: bool
) -> dict[str, torch.Tensor]:
    """{ours.weight, ours.bias} from the checkpoint's linear `theirs` (the bias only if `has_bias`)."""
    state = {f"{ours}.weight": take(weights, f"{theirs}.weight")}
    if has_bias:
        state[f"{ours}.bias"] = take(weights, f"{theirs}.bias")
    return state


def read_rope(config: dict[str, Any], rotary_dim: int, default_theta: float) -> tuple[float, float]:
    """(theta, inverse-frequency divisor) from config.json's `rope_parameters` (transformers 5) or
    `rope_scaling` and `rope_theta` (older configs, Alibaba's NewModel). Served scalings are those
    that are the same at every position: none, `linear`, GTE's fixed `ntk`; and `dynamic` (NTK),
    which transformers applies only past max_position_embeddings, which kembed never serves (the
    family caps its sequences there). Any other, or GTE's mixed NTK (`mixed_b`): InvalidInput."""
    rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    theta = float(rope.get("rope_theta", config.get("rope_theta", default_theta)))
    rope_type = rope.get("rope_type", rope.get("type")) or "default"
    if rope_type in ("default", "dynamic"):
        return theta, 1.0
    if rope_type == "linear":
        return theta, float(rope["factor"])
    if rope_type == "ntk" and rope.get("mixed_b") is None:
        return ntk_scaling(theta, float(rope["factor"]), rotary_dim)
    raise InvalidInput(
        f"rope scaling {rope} is not served (served: none, linear, dynamic within max_position_embeddings, "
        "GTE's fixed ntk)"
    )


class RotaryEmbedder(PooledEmbedder):
    """A rotary encoder + sentence-transformers pooling."""

    def __init__(self, shape: RotaryEncoderShape, attend: Attention, pooling: str) -> None:
        super().__init__(pooling, shape.hidden_size, shape.max_positions, shape.vocab_size)
        self.encoder = RotaryEncoder(shape, attend)

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        hidden: torch.Tensor = self.encoder(input_ids, position_ids, token_type_ids, meta)
        return hidden
