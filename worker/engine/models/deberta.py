"""DeBERTa-v2/v3 rerankers (mxbai-rerank-v1: `DebertaV2ForSequenceClassification`) over packed pairs.

A post-LayerNorm encoder (its layers are `BertLayer`s) whose attention is disentangled: besides q·k,
each score has a content-to-position term (the query against the key's relative position embedding)
and a position-to-content term (the key against the query's), the relative position query - key
log-bucketed (`position_buckets`) within `max_relative_positions`, and every term divided by
sqrt(head_dim * (1 + number of terms)). The position embeddings (`rel_embeddings`, LayerNorm'ed when
`norm_rel_ebd` says so) are weights: their projections by each layer (`key_proj`/`query_proj` with
`share_att_key`, else `pos_key_proj`/`pos_query_proj`) are made once at load, and a forward computes
per token and head its scores against every relative position (`DisentangledBias`), which attention
gathers by distance: on a GPU inside the Triton kernel (in CUDA graphs), the other varlen kernels
taking no such bias; without Triton, on `sdpa-padded` in the eager engine (logged). The base model
has no enhanced mask decoder
(`DebertaV2Model.z_steps` is 0); the head is `ContextPooler` (dense + activation on the first token)
then `classifier`. The convolution of deberta-v2-xlarge (`conv_kernel_size`) is refused.
"""

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from kembed.worker.engine.layers.attention import Attention, AttentionMetadata
from kembed.worker.engine.layers.pooling import pool
from kembed.worker.engine.layers.relative_bias import AttentionBias, DisentangledBias, log_bucket_positions
from kembed.worker.engine.models.bert import (
    HIDDEN_ACTIVATIONS,
    BertLayer,
    BertShape,
    LayerNames,
    layer_state,
    run_layers,
)
from kembed.worker.engine.models.model_dir import ModelDir, load_weights
from kembed.worker.engine.models.served import ModelFacts, ServedModel
from kembed.worker.errors import InvalidInput

DEBERTA_FAMILY = ("deberta-v2",)
DEBERTA_ARCHITECTURE = "DebertaV2ForSequenceClassification"
_LAYER_NAMES = LayerNames(
    qkv=("attention.self.query_proj", "attention.self.key_proj", "attention.self.value_proj")
)


@dataclass(frozen=True)
class DebertaShape:
    """The config.json fields that shape the network beyond its BERT-like layers."""

    layers: BertShape
    embedding_size: int
    position_biased_input: bool
    relative_attention: bool
    terms: tuple[str, ...]  # "c2p", "p2c": the position terms of every score
    share_att_key: bool
    position_buckets: int  # <= 0: relative positions not bucketed
    max_relative_positions: int
    norm_rel_ebd: bool
    pooler_activation: str

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "DebertaShape":
        if config.get("model_type") not in DEBERTA_FAMILY:
            raise InvalidInput(f"model_type {config.get('model_type')!r} is not DeBERTa-v2 {DEBERTA_FAMILY}")
        hidden, heads = config["hidden_size"], config["num_attention_heads"]
        refused = {
            "conv_kernel_size": config.get("conv_kernel_size", 0) > 0,
            "attention_head_size": config.get("attention_head_size", hidden // heads) != hidden // heads,
            "pooler_hidden_size": config.get("pooler_hidden_size", hidden) != hidden,
        }
        for name, is_refused in refused.items():
            if is_refused:
                raise InvalidInput(f"DeBERTa with {name} {config[name]} is not served")
        activations = {
            "hidden_act": str(config.get("hidden_act", "gelu")),
            "pooler_hidden_act": str(config.get("pooler_hidden_act", "gelu")),
        }
        for name, activation in activations.items():
            if activation not in HIDDEN_ACTIVATIONS:
                raise InvalidInput(f"unsupported {name} {activation!r}")
        terms = config.get("pos_att_type") or []
        if isinstance(terms, str):  # older configs: "p2c|c2p"
            terms = [term.strip() for term in terms.lower().split("|")]
        max_relative = config.get("max_relative_positions", -1)
        layers = BertShape(
            vocab_size=config["vocab_size"],
            hidden_size=hidden,
            num_layers=config["num_hidden_layers"],
            num_heads=heads,
            intermediate_size=config["intermediate_size"],
            activation=activations["hidden_act"],
            max_position_embeddings=config.get("max_position_embeddings", 512),
            type_vocab_size=config.get("type_vocab_size", 0),
            layer_norm_eps=config.get("layer_norm_eps", 1e-7),
            position_offset=0,
        )
        return cls(
            layers=layers,
            embedding_size=config.get("embedding_size") or hidden,
            position_biased_input=config.get("position_biased_input", True),
            relative_attention=config.get("relative_attention", False),
            terms=tuple(term for term in ("c2p", "p2c") if term in terms),
            share_att_key=config.get("share_att_key", False),
            position_buckets=config.get("position_buckets", -1),
            max_relative_positions=max_relative if max_relative >= 1 else layers.max_position_embeddings,
            norm_rel_ebd="layer_norm" in str(config.get("norm_rel_ebd", "none")).lower().split("|"),
            pooler_activation=activations["pooler_hidden_act"],
        )

    @property
    def hidden_size(self) -> int:
        return self.layers.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.layers.vocab_size

    @property
    def max_sequence_length(self) -> int:
        """The longest pair: the position table's (or, without one, the relative positions' table's)."""
        return self.layers.max_position_embeddings

    @property
    def span(self) -> int:
        """Relative positions each side that have an embedding (transformers' `pos_ebd_size`)."""
        return self.position_buckets if self.position_buckets > 0 else self.max_relative_positions

    @property
    def has_bias(self) -> bool:
        return self.relative_attention and bool(self.terms)

    @property
    def scale(self) -> float:
        head_dim = self.layers.hidden_size // self.layers.num_heads
        return 1.0 / math.sqrt(head_dim * (1 + len(self.terms)))


class DebertaLayer(BertLayer):
    """A `BertLayer` whose attention adds the disentangled position terms of its own q and k."""

    pos_key: torch.Tensor  # buffer [2 * span, heads, head_dim]: c2p's keys of the relative positions
    pos_query: torch.Tensor  # buffer [2 * span, heads, head_dim]: p2c's queries
    positions: torch.Tensor  # buffer [2 * max_position_embeddings - 1] int64 (DisentangledBias)

    def __init__(self, shape: DebertaShape, attend: Attention, positions: torch.Tensor) -> None:
        super().__init__(shape.layers, attend)
        heads, head_dim = shape.layers.num_heads, shape.layers.hidden_size // shape.layers.num_heads
        self.terms, self.scale, self.has_bias = shape.terms, shape.scale, shape.has_bias
        self.register_buffer("positions", positions.clone(), persistent=False)  # 8 bytes a distance
        self.register_buffer("pos_key", torch.zeros(2 * shape.span, heads, head_dim), persistent=False)
        self.register_buffer("pos_query", torch.zeros(2 * shape.span, heads, head_dim), persistent=False)

    def attention_bias(
        self, q: torch.Tensor, k: torch.Tensor, bias: AttentionBias | None
    ) -> AttentionBias | None:
        if not self.has_bias:
            return None
        # [tokens, heads, head_dim] x [positions, heads, head_dim] -> [tokens, heads, positions]
        c2p = torch.einsum("thd,phd->thp", q, self.pos_key) * self.scale if "c2p" in self.terms else None
        p2c = torch.einsum("thd,phd->thp", k, self.pos_query) * self.scale if "p2c" in self.terms else None
        return DisentangledBias(c2p, p2c, self.positions, (self.positions.shape[0] + 1) // 2, self.scale)


class DebertaCrossEncoder(ServedModel):
    """Embeddings, disentangled layers and the sequence-classification head on the first token."""

    def __init__(self, shape: DebertaShape, attend: Attention, num_labels: int) -> None:
        super().__init__()
        layers, hidden = shape.layers, shape.layers.hidden_size
        self.shape = shape
        self.word_embeddings = nn.Embedding(layers.vocab_size, shape.embedding_size)
        self.position_embeddings = (
            nn.Embedding(layers.max_position_embeddings, shape.embedding_size)
            if shape.position_biased_input
            else None
        )
        self.token_type_embeddings = (
            nn.Embedding(layers.type_vocab_size, shape.embedding_size) if layers.type_vocab_size > 0 else None
        )
        self.embed_proj = (
            nn.Linear(shape.embedding_size, hidden, bias=False) if shape.embedding_size != hidden else None
        )
        self.embed_norm = nn.LayerNorm(hidden, eps=layers.layer_norm_eps)
        limit = layers.max_position_embeddings
        relative = torch.arange(-(limit - 1), limit)  # query - key
        if shape.position_buckets > 0:
            relative = log_bucket_positions(relative, shape.position_buckets, shape.max_relative_positions)
        positions = (relative + shape.span).clamp(0, 2 * shape.span - 1)  # of query - key
        self.layers = nn.ModuleList(DebertaLayer(shape, attend, positions) for _ in range(layers.num_layers))
        self.pooler = nn.Linear(hidden, hidden)  # ContextPooler.dense
        self.pooler_activation = HIDDEN_ACTIVATIONS[shape.pooler_activation]
        self.classifier = nn.Linear(hidden, num_labels)
        self.facts = ModelFacts("score", num_labels, limit, layers.vocab_size)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        x = self.word_embeddings(input_ids)
        if self.position_embeddings is not None:
            x = x + self.position_embeddings(position_ids)
        if self.token_type_embeddings is not None:
            x = x + self.token_type_embeddings(token_type_ids)
        if self.embed_proj is not None:
            x = self.embed_proj(x)
        hidden = run_layers(self.layers, self.embed_norm(x), meta)
        first = pool(hidden, meta, "cls")  # [num_seqs, hidden]; safe on a bucket's empty slots
        logits: torch.Tensor = self.classifier(self.pooler_activation(self.pooler(first)))
        return logits.float()  # [num_seqs, num_labels]

    @classmethod
    def load(cls, model_dir: ModelDir, attend: Attention) -> "DebertaCrossEncoder":
        """Build from a DebertaV2ForSequenceClassification directory, weights loaded."""
        architectures = model_dir.config.get("architectures") or ()
        if DEBERTA_ARCHITECTURE not in architectures:
            raise InvalidInput(
                f"DeBERTa architectures {list(architectures)} are not served ({DEBERTA_ARCHITECTURE})"
            )
        shape = DebertaShape.from_config(model_dir.config)
        weights = load_weights(model_dir.path)  # "deberta." stripped; pooler and classifier keep theirs
        model = cls(shape, attend, weights["classifier.weight"].shape[0])
        model.load_hf_weights(weights)
        return model

    def load_hf_weights(self, weights: dict[str, torch.Tensor]) -> None:
        state = {
            "word_embeddings.weight": weights["embeddings.word_embeddings.weight"],
            "embed_norm.weight": weights["embeddings.LayerNorm.weight"],
            "embed_norm.bias": weights["embeddings.LayerNorm.bias"],
        }
        optional = {
            "position_embeddings.weight": "embeddings.position_embeddings.weight",
            "token_type_embeddings.weight": "embeddings.token_type_embeddings.weight",
            "embed_proj.weight": "embeddings.embed_proj.weight",
        }
        own = self.state_dict()
        state.update({ours: weights[hf] for ours, hf in optional.items() if ours in own})
        for kind in ("weight", "bias"):
            state[f"pooler.{kind}"] = weights[f"pooler.dense.{kind}"]
            state[f"classifier.{kind}"] = weights[f"classifier.{kind}"]
        for i in range(self.shape.layers.num_layers):
            state.update(layer_state(weights, i, f"layers.{i}.", _LAYER_NAMES))
        self.load_state_dict(state, strict=True)
        if self.shape.has_bias:
            self._project_positions(weights)

    @torch.no_grad()
    def _project_positions(self, weights: dict[str, torch.Tensor]) -> None:
        """Each layer's keys and queries of the relative positions, from the (normed) embeddings."""
        shape, span = self.shape, self.shape.span
        embeddings = weights["encoder.rel_embeddings.weight"][: 2 * span].float()
        if shape.norm_rel_ebd:
            norm = {k: weights[f"encoder.LayerNorm.{k}"].float() for k in ("weight", "bias")}
            embeddings = nn.functional.layer_norm(
                embeddings, embeddings.shape[-1:], norm["weight"], norm["bias"], shape.layers.layer_norm_eps
            )
        names = ("key_proj", "query_proj") if shape.share_att_key else ("pos_key_proj", "pos_query_proj")
        for i, layer in enumerate(self.layers):
            assert isinstance(layer, DebertaLayer)
            for buffer, name, term in zip(
                (layer.pos_key, layer.pos_query), names, ("c2p", "p2c"), strict=True
            ):
                if term in shape.terms:
                    prefix = f"encoder.layer.{i}.attention.self.{name}."
                    projected = nn.functional.linear(
                        embeddings, weights[prefix + "weight"].float(), weights[prefix + "bias"].float()
                    )
                    buffer.copy_(projected.view(buffer.shape))
