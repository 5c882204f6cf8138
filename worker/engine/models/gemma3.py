"""Gemma 3 text encoders (EmbeddingGemma: `Gemma3TextModel` with `use_bidirectional_attention`) over
packed ragged batches.

Our own code, against transformers' `Gemma3TextModel` in the tests. Embeddings scaled by
sqrt(hidden) (rounded to the model's dtype, as transformers rounds it); each layer: RMSNorm with
`1 + weight`, attention with per-head q/k norms and rotary positions (the local base for sliding
layers), softmax scale `query_pre_attn_scalar ** -0.5`, a norm after attention, and a GeGLU MLP
(gelu tanh) between a pre- and a post-feedforward norm; a final norm.

Sliding layers (`layer_types`, or five of every six) see a window of keys. Bidirectional, it is
symmetric: transformers keeps keys at distance < `sliding_window // 2 + 1` (it halves the config's
window for this), so `sliding_window // 2` either side. Causal, the last `sliding_window` tokens: the
query and `sliding_window - 1` before it. There is no LM head: embedders pool the final hidden states.
"""

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from kembed.worker.engine.layers.attention import Attention, AttentionMetadata
from kembed.worker.engine.layers.mlp import ACTIVATIONS, GatedMLP
from kembed.worker.engine.layers.norms import OffsetRMSNorm
from kembed.worker.engine.layers.rope import RotaryEmbedding, rotate
from kembed.worker.engine.models.decoder import is_bidirectional
from kembed.worker.engine.models.local_global import layer_types, rope_thetas
from kembed.worker.engine.models.model_dir import ModelDir, load_weights
from kembed.worker.engine.models.served import PooledEmbedder
from kembed.worker.errors import InvalidInput

GEMMA3_FAMILY = ("gemma3_text",)


@dataclass(frozen=True)
class Gemma3Shape:
    """The config.json fields that shape the network."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    activation: str
    max_position_embeddings: int
    rms_norm_eps: float
    attention_bias: bool
    query_pre_attn_scalar: float
    is_causal: bool
    window: int  # keys a sliding layer's query sees before it (and after it, bidirectional)
    is_local: tuple[bool, ...]  # per layer: a sliding one
    global_theta: float
    local_theta: float

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "Gemma3Shape":
        model_type = config.get("model_type", "")
        if model_type not in GEMMA3_FAMILY:
            raise InvalidInput(f"model_type {model_type!r} is not a Gemma 3 text model {GEMMA3_FAMILY}")
        if config.get("attn_logit_softcapping") is not None:
            raise InvalidInput(
                "attn_logit_softcapping is not supported (Gemma 3 and EmbeddingGemma have none)"
            )
        activation = config.get("hidden_activation") or config.get("hidden_act") or "gelu_pytorch_tanh"
        if activation not in ACTIVATIONS:
            raise InvalidInput(
                f"unsupported hidden_activation {activation!r} (supported: {', '.join(ACTIVATIONS)})"
            )
        num_heads = config["num_attention_heads"]
        num_kv_heads = config.get("num_key_value_heads") or num_heads
        head_dim = config.get("head_dim") or config["hidden_size"] // num_heads
        if num_heads % num_kv_heads or head_dim % 2:
            raise InvalidInput(
                f"bad attention shape: {num_heads} heads, {num_kv_heads} kv heads, {head_dim=}"
            )
        is_causal = not is_bidirectional(config)
        sliding_window = int(config.get("sliding_window") or 4096)
        global_theta, local_theta = rope_thetas(
            config, (1_000_000.0, 10_000.0), "rope_local_base_freq", "rope_theta"
        )
        return cls(
            vocab_size=config["vocab_size"],
            hidden_size=config["hidden_size"],
            num_layers=config["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            intermediate_size=config["intermediate_size"],
            activation=activation,
            max_position_embeddings=config.get("max_position_embeddings", 131_072),
            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            attention_bias=bool(config.get("attention_bias", False)),
            query_pre_attn_scalar=float(config.get("query_pre_attn_scalar", 256)),
            is_causal=is_causal,
            window=sliding_window - 1 if is_causal else sliding_window // 2,
            is_local=layer_types(config, "sliding_window_pattern", 6, global_last=True),
            global_theta=global_theta,
            local_theta=local_theta,
        )

    @property
    def max_sequence_length(self) -> int:
        return self.max_position_embeddings

    def describe_attention(self) -> str:
        side = "before each query" if self.is_causal else "either side"
        kind = "causal" if self.is_causal else "bidirectional"
        return (
            f"{kind}; {sum(self.is_local)} of {self.num_layers} layers local (a sliding window of "
            f"{self.window} tokens {side}), the rest global"
        )


class Gemma3Layer(nn.Module):
    def __init__(self, shape: Gemma3Shape, attend: Attention, index: int) -> None:
        super().__init__()
        hidden, head_dim, eps = shape.hidden_size, shape.head_dim, shape.rms_norm_eps
        q_size, kv_size = shape.num_heads * head_dim, shape.num_kv_heads * head_dim
        self.input_norm = OffsetRMSNorm(hidden, eps)
        self.qkv = nn.Linear(hidden, q_size + 2 * kv_size, bias=shape.attention_bias)
        self.q_norm = OffsetRMSNorm(head_dim, eps)
        self.k_norm = OffsetRMSNorm(head_dim, eps)
        self.o_proj = nn.Linear(q_size, hidden, bias=shape.attention_bias)
        self.post_attn_norm = OffsetRMSNorm(hidden, eps)
        self.pre_mlp_norm = OffsetRMSNorm(hidden, eps)
        self.mlp = GatedMLP(
            hidden, shape.intermediate_size, shape.activation, gate_up_bias=False, down_bias=False
        )
        self.post_mlp_norm = OffsetRMSNorm(hidden, eps)
        self.qkv_sizes = (q_size, kv_size, kv_size)
        self.num_heads, self.num_kv_heads, self.head_dim = shape.num_heads, shape.num_kv_heads, head_dim
        # The backends scale by head_dim ** -0.5; Gemma by query_pre_attn_scalar ** -0.5 (equal in
        # EmbeddingGemma): queries are scaled by the ratio first where the two differ.
        ratio = math.sqrt(head_dim / shape.query_pre_attn_scalar)
        self.query_scale = None if ratio == 1.0 else ratio
        self.is_causal = shape.is_causal
        self.window = shape.window if shape.is_local[index] else None
        self.attend = attend

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        q, k, v = self.qkv(self.input_norm(x)).split(self.qkv_sizes, dim=-1)
        q = rotate(self.q_norm(q.view(num_tokens, self.num_heads, self.head_dim)), cos, sin)
        k = rotate(self.k_norm(k.view(num_tokens, self.num_kv_heads, self.head_dim)), cos, sin)
        if self.query_scale is not None:
            q = q * self.query_scale
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        attn = self.attend(q, k, v, meta, self.is_causal, self.window)
        x = x + self.post_attn_norm(self.o_proj(attn.reshape(num_tokens, -1)))
        out: torch.Tensor = x + self.post_mlp_norm(self.mlp(self.pre_mlp_norm(x)))
        return out


class Gemma3Encoder(nn.Module):
    """Scaled token embeddings, layers, final norm: the last hidden state of every packed token."""

    embed_scale: torch.Tensor  # buffer: sqrt(hidden), cast with the model as transformers casts it

    def __init__(self, shape: Gemma3Shape, attend: Attention) -> None:
        super().__init__()
        self.shape = shape
        self.embed_tokens = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.register_buffer("embed_scale", torch.tensor(shape.hidden_size**0.5), persistent=False)
        positions = shape.max_position_embeddings
        self.global_rope = RotaryEmbedding(shape.head_dim, positions, shape.global_theta)
        self.local_rope = RotaryEmbedding(shape.head_dim, positions, shape.local_theta)
        self.layers = nn.ModuleList(Gemma3Layer(shape, attend, i) for i in range(shape.num_layers))
        self.norm = OffsetRMSNorm(shape.hidden_size, shape.rms_norm_eps)

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids) * self.embed_scale.to(self.embed_tokens.weight.dtype)
        tables = {False: self.global_rope(position_ids), True: self.local_rope(position_ids)}
        for layer, is_local in zip(self.layers, self.shape.is_local, strict=True):
            x = layer(x, *tables[is_local], meta)
        out: torch.Tensor = self.norm(x)
        return out  # [num_tokens, hidden]

    def load_hf_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Load a transformers Gemma3TextModel state dict, fusing Q/K/V and gate/up."""
        kinds = ("weight", "bias") if self.shape.attention_bias else ("weight",)
        state = {"embed_tokens.weight": weights["embed_tokens.weight"], "norm.weight": weights["norm.weight"]}
        for i in range(self.shape.num_layers):
            hf, ours = f"layers.{i}.", f"layers.{i}."
            for kind in kinds:
                state[f"{ours}qkv.{kind}"] = torch.cat(
                    [weights[f"{hf}self_attn.{name}_proj.{kind}"] for name in ("q", "k", "v")]
                )
                state[f"{ours}o_proj.{kind}"] = weights[f"{hf}self_attn.o_proj.{kind}"]
            state[f"{ours}mlp.gate_up.weight"] = torch.cat(
                [weights[f"{hf}mlp.gate_proj.weight"], weights[f"{hf}mlp.up_proj.weight"]]
            )
            state[f"{ours}mlp.down.weight"] = weights[f"{hf}mlp.down_proj.weight"]
            for ours_norm, hf_norm in (
                ("input_norm", "input_layernorm"),
                ("q_norm", "self_attn.q_norm"),
                ("k_norm", "self_attn.k_norm"),
                ("post_attn_norm", "post_attention_layernorm"),
                ("pre_mlp_norm", "pre_feedforward_layernorm"),
                ("post_mlp_norm", "post_feedforward_layernorm"),
            ):
                state[f"{ours}{ours_norm}.weight"] = weights[f"{hf}{hf_norm}.weight"]
        self.load_state_dict(state, strict=True)


class Gemma3Embedder(PooledEmbedder):
    """Gemma 3 encoder + sentence-transformers pooling (mean, then EmbeddingGemma's two Dense layers)."""

    def __init__(self, shape: Gemma3Shape, attend: Attention, pooling: str) -> None:
        super().__init__(pooling, shape.hidden_size, shape.max_sequence_length, shape.vocab_size)
        self.encoder = Gemma3Encoder(shape, attend)

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        hidden: torch.Tensor = self.encoder(input_ids, position_ids, meta)  # Gemma has no token types
        return hidden


def gemma3_pooling(model_dir: ModelDir) -> str:
    """The directory's pooling; without modules.json the mean (bidirectional) or last token (causal)."""
    if model_dir.pooling is not None:
        return model_dir.pooling
    return "last" if Gemma3Shape.from_config(model_dir.config).is_causal else "mean"


def build_gemma3(model_dir: ModelDir, attend: Attention) -> Gemma3Embedder:
    model = Gemma3Embedder(Gemma3Shape.from_config(model_dir.config), attend, gemma3_pooling(model_dir))
    model.encoder.load_hf_weights(load_weights(model_dir.path))
    return model
