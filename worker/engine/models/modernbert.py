"""ModernBERT encoders (gte-modernbert, modernbert-embed, granite-embedding r2, mmBERT, Ettin) and the
ModernBERT reranker head (`ModernBertForSequenceClassification`: gte-reranker-modernbert), over
packed ragged batches.

Our own code, against transformers' `ModernBertModel` in the tests. Pre-norm layers (the first
layer's attention norm is the identity) with rotary positions, whose base differs between the global
layers and the local ones; every `global_attn_every_n_layers`-th layer (or as `layer_types` says) is
global, the others attend within a symmetric sliding window: `local_attention` tokens wide, so a
query sees the `local_attention // 2` keys either side of it (transformers' bidirectional sliding
mask: distance <= half the width). The MLP is a GeGLU of one fused up-projection (`Wi`). LayerNorms
and linears have biases only where `norm_bias`, `attention_bias`, `mlp_bias` say.
"""

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from kembed.worker.engine.layers.attention import Attention, AttentionMetadata
from kembed.worker.engine.layers.mlp import ACTIVATIONS, GatedMLP
from kembed.worker.engine.layers.pooling import pool
from kembed.worker.engine.layers.rope import RotaryEmbedding, rotate
from kembed.worker.engine.models.local_global import layer_types, rope_thetas
from kembed.worker.engine.models.model_dir import ModelDir, load_weights
from kembed.worker.engine.models.served import ModelFacts, PooledEmbedder, ServedModel
from kembed.worker.errors import InvalidInput

MODERNBERT_FAMILY = ("modernbert",)
CROSS_ENCODER_ARCHITECTURE = "ModernBertForSequenceClassification"


@dataclass(frozen=True)
class ModernBertShape:
    """The config.json fields that shape the network."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    activation: str
    max_position_embeddings: int
    norm_eps: float
    norm_bias: bool
    attention_bias: bool
    mlp_bias: bool
    window: int  # keys either side a local layer's query sees
    is_local: tuple[bool, ...]  # per layer
    global_theta: float
    local_theta: float

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "ModernBertShape":
        model_type = config.get("model_type", "")
        if model_type not in MODERNBERT_FAMILY:
            raise InvalidInput(f"model_type {model_type!r} is not ModernBERT {MODERNBERT_FAMILY}")
        activation = config.get("hidden_activation", "gelu")
        if activation not in ACTIVATIONS:
            raise InvalidInput(
                f"unsupported hidden_activation {activation!r} (supported: {', '.join(ACTIVATIONS)})"
            )
        if config["hidden_size"] % config["num_attention_heads"]:
            raise InvalidInput("hidden_size is not a multiple of num_attention_heads")
        global_theta, local_theta = rope_thetas(
            config, (160_000.0, 10_000.0), "local_rope_theta", "global_rope_theta"
        )
        return cls(
            vocab_size=config["vocab_size"],
            hidden_size=config["hidden_size"],
            num_layers=config["num_hidden_layers"],
            num_heads=config["num_attention_heads"],
            intermediate_size=config["intermediate_size"],
            activation=activation,
            max_position_embeddings=config.get("max_position_embeddings", 8192),
            norm_eps=config.get("norm_eps", 1e-5),
            norm_bias=bool(config.get("norm_bias", False)),
            attention_bias=bool(config.get("attention_bias", False)),
            mlp_bias=bool(config.get("mlp_bias", False)),
            window=int(config.get("local_attention", 128)) // 2,
            is_local=layer_types(config, "global_attn_every_n_layers", 3, global_last=False),
            global_theta=global_theta,
            local_theta=local_theta,
        )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def max_sequence_length(self) -> int:
        return self.max_position_embeddings

    def describe_attention(self) -> str:
        num_local = sum(self.is_local)
        return (
            f"bidirectional; {num_local} of {self.num_layers} layers local (a sliding window of "
            f"{self.window} tokens either side), the rest global"
        )


class ModernBertLayer(nn.Module):
    def __init__(self, shape: ModernBertShape, attend: Attention, index: int) -> None:
        super().__init__()
        hidden = shape.hidden_size
        # the first layer's attention norm is the identity (the embeddings end in a norm)
        self.attn_norm = (
            nn.LayerNorm(hidden, eps=shape.norm_eps, bias=shape.norm_bias) if index else nn.Identity()
        )
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=shape.attention_bias)
        self.attn_out = nn.Linear(hidden, hidden, bias=shape.attention_bias)
        self.mlp_norm = nn.LayerNorm(hidden, eps=shape.norm_eps, bias=shape.norm_bias)
        self.mlp = GatedMLP(
            hidden, shape.intermediate_size, shape.activation,
            gate_up_bias=shape.mlp_bias, down_bias=shape.mlp_bias,
        )  # fmt: skip
        self.num_heads = shape.num_heads
        self.window = shape.window if shape.is_local[index] else None
        self.attend = attend

    def forward(
        self,
        x: torch.Tensor,  # [num_tokens, hidden]
        cos: torch.Tensor,  # [num_tokens, 1, head_dim/2], this layer's (global or local) base
        sin: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        q, k, v = self.qkv(self.attn_norm(x)).view(num_tokens, 3, self.num_heads, -1).unbind(1)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        attn = self.attend(q, k, v, meta, False, self.window)
        x = x + self.attn_out(attn.reshape(num_tokens, -1))
        out: torch.Tensor = x + self.mlp(self.mlp_norm(x))
        return out


class ModernBertEncoder(nn.Module):
    """Embeddings (and their norm), layers, final norm: the last hidden state of every packed token."""

    def __init__(self, shape: ModernBertShape, attend: Attention) -> None:
        super().__init__()
        self.shape = shape
        hidden = shape.hidden_size
        self.embeddings = nn.Embedding(shape.vocab_size, hidden)
        self.embed_norm = nn.LayerNorm(hidden, eps=shape.norm_eps, bias=shape.norm_bias)
        positions = shape.max_position_embeddings
        self.global_rope = RotaryEmbedding(shape.head_dim, positions, shape.global_theta)
        self.local_rope = RotaryEmbedding(shape.head_dim, positions, shape.local_theta)
        self.layers = nn.ModuleList(ModernBertLayer(shape, attend, i) for i in range(shape.num_layers))
        self.final_norm = nn.LayerNorm(hidden, eps=shape.norm_eps, bias=shape.norm_bias)

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        x = self.embed_norm(self.embeddings(input_ids))
        tables = {False: self.global_rope(position_ids), True: self.local_rope(position_ids)}
        for layer, is_local in zip(self.layers, self.shape.is_local, strict=True):
            x = layer(x, *tables[is_local], meta)
        out: torch.Tensor = self.final_norm(x)
        return out  # [num_tokens, hidden]

    def load_hf_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Load a transformers ModernBertModel state dict (task-head prefix stripped)."""
        shape = self.shape
        state = {"embeddings.weight": weights["embeddings.tok_embeddings.weight"]}
        norms = {"embed_norm": "embeddings.norm", "final_norm": "final_norm"}
        linears: dict[str, tuple[str, bool]] = {}
        for i in range(shape.num_layers):
            if i:
                norms[f"layers.{i}.attn_norm"] = f"layers.{i}.attn_norm"
            norms[f"layers.{i}.mlp_norm"] = f"layers.{i}.mlp_norm"
            linears[f"layers.{i}.qkv"] = (f"layers.{i}.attn.Wqkv", shape.attention_bias)
            linears[f"layers.{i}.attn_out"] = (f"layers.{i}.attn.Wo", shape.attention_bias)
            linears[f"layers.{i}.mlp.gate_up"] = (f"layers.{i}.mlp.Wi", shape.mlp_bias)
            linears[f"layers.{i}.mlp.down"] = (f"layers.{i}.mlp.Wo", shape.mlp_bias)
        for ours, (hf, has_bias) in {
            **{k: (v, shape.norm_bias) for k, v in norms.items()},
            **linears,
        }.items():
            state[f"{ours}.weight"] = weights[f"{hf}.weight"]
            if has_bias:
                state[f"{ours}.bias"] = weights[f"{hf}.bias"]
        self.load_state_dict(state, strict=True)


class ModernBertEmbedder(PooledEmbedder):
    """ModernBERT encoder + sentence-transformers pooling."""

    def __init__(self, shape: ModernBertShape, attend: Attention, pooling: str) -> None:
        super().__init__(pooling, shape.hidden_size, shape.max_sequence_length, shape.vocab_size)
        self.encoder = ModernBertEncoder(shape, attend)

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        hidden: torch.Tensor = self.encoder(input_ids, position_ids, meta)  # ModernBERT has no token types
        return hidden


class ModernBertCrossEncoder(ServedModel):
    """`ModernBertForSequenceClassification`: the encoder, its pooling (`classifier_pooling`: the first
    token or the mean), the head (dense, activation, norm) and the classifier: raw logits."""

    def __init__(
        self, shape: ModernBertShape, attend: Attention, config: dict[str, Any], num_labels: int
    ) -> None:
        super().__init__()
        hidden = shape.hidden_size
        self.pooling = str(config.get("classifier_pooling", "cls"))
        if self.pooling not in ("cls", "mean"):
            raise InvalidInput(f"classifier_pooling {self.pooling!r} is not cls or mean")
        activation = str(config.get("classifier_activation", "gelu"))
        if activation not in ACTIVATIONS:
            raise InvalidInput(f"unsupported classifier_activation {activation!r}")
        self.activation = ACTIVATIONS[activation]
        self.encoder = ModernBertEncoder(shape, attend)
        self.dense = nn.Linear(hidden, hidden, bias=bool(config.get("classifier_bias", False)))
        self.norm = nn.LayerNorm(hidden, eps=shape.norm_eps, bias=shape.norm_bias)
        self.classifier = nn.Linear(hidden, num_labels)
        self.facts = ModelFacts("score", num_labels, shape.max_sequence_length, shape.vocab_size)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        hidden = self.encoder(input_ids, position_ids, meta)
        pooled = pool(hidden, meta, self.pooling).to(hidden.dtype)  # [num_seqs, hidden]
        logits: torch.Tensor = self.classifier(self.norm(self.activation(self.dense(pooled))))
        return logits.float()  # [num_seqs, num_labels]

    @classmethod
    def load(cls, model_dir: ModelDir, attend: Attention) -> "ModernBertCrossEncoder":
        weights = load_weights(model_dir.path)  # "model." stripped; the head keeps its names
        if "classifier.weight" not in weights or "head.dense.weight" not in weights:
            raise InvalidInput(f"{model_dir.path} is a {CROSS_ENCODER_ARCHITECTURE} without its head weights")
        shape = ModernBertShape.from_config(model_dir.config)
        model = cls(shape, attend, model_dir.config, weights["classifier.weight"].shape[0])
        model.encoder.load_hf_weights(weights)
        for ours, hf in (
            (model.dense, "head.dense"),
            (model.norm, "head.norm"),
            (model.classifier, "classifier"),
        ):
            state = {
                kind: weights[f"{hf}.{kind}"] for kind in ("weight", "bias") if f"{hf}.{kind}" in weights
            }
            try:
                ours.load_state_dict(state, strict=True)
            except RuntimeError as error:  # a bias the config does not expect, or the other way round
                raise InvalidInput(f"{model_dir.path}: {hf} does not fit config.json: {error}") from None
        return model


def build_modernbert(model_dir: ModelDir, attend: Attention, pooling: str) -> ModernBertEmbedder:
    model = ModernBertEmbedder(ModernBertShape.from_config(model_dir.config), attend, pooling)
    model.encoder.load_hf_weights(load_weights(model_dir.path))
    return model


def is_cross_encoder(config: dict[str, Any]) -> bool:
    return CROSS_ENCODER_ARCHITECTURE in (config.get("architectures") or ())
