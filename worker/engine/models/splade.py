"""SPLADE-style sparse encoders: a BERT-family masked-LM served as sentence-transformers'
SparseEncoder computes it (MLMTransformer, then SpladePooling).

The masked-LM head (transform Linear, the encoder's activation, LayerNorm, then the decoder: the
word embeddings transposed plus a bias, or the checkpoint's own decoder weight when it has one)
gives every token a logit per vocabulary id; log(1 + ReLU(logit)) (`log1p_relu`: that once more)
is pooled over each sequence's tokens by max (or sum), giving one vocabulary-wide row per
sequence. It is the model's `forward`, so the engine runs it as any pooled output: inside the
captured graph, into the graph's one static output block. The rows stay on the worker: its edges
send each row's nonzero (id, weight) pairs alone (kembed.proto.outputs.vocabulary_words).
"""

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from kembed.proto.outputs import SPARSE
from kembed.worker.engine.layers.attention import Attention, AttentionMetadata
from kembed.worker.engine.models.bert import HIDDEN_ACTIVATIONS, BertEncoder, BertShape
from kembed.worker.engine.models.served import ModelFacts, ServedModel
from kembed.worker.errors import InvalidInput

MAX_VOCABULARY = 1 << 24
"""Vocabulary ids travel as float32 words (exact integers up to 2**24)."""


@dataclass(frozen=True)
class SpladeSpec:
    """A SpladePooling module's settings (its config.json)."""

    pooling: str  # "max" | "sum" over the sequence's tokens
    activation: str  # "relu": log1p(relu(x)); "log1p_relu": log1p(log1p(relu(x)))


def read_splade(pooling_dir: Path) -> SpladeSpec:
    """The SpladePooling module at `pooling_dir`; InvalidInput for a setting kembed does not apply."""
    file = pooling_dir / "config.json"
    config = json.loads(file.read_text()) if file.is_file() else {}
    spec = SpladeSpec(
        str(config.get("pooling_strategy", "max")), str(config.get("activation_function", "relu"))
    )
    if spec.pooling not in ("max", "sum") or spec.activation not in ("relu", "log1p_relu"):
        raise InvalidInput(
            f"{file}: SPLADE pooling {spec} is not one kembed applies (max/sum, relu/log1p_relu)"
        )
    if config.get("embedding_dimension") not in (None, 0):
        raise InvalidInput(f"{file}: embedding_dimension is set; kembed serves the whole vocabulary")
    return spec


class MlmHead(nn.Module):
    """BertForMaskedLM's `cls.predictions`: transform, activation, LayerNorm, decoder plus bias."""

    def __init__(self, shape: BertShape) -> None:
        super().__init__()
        self.transform = nn.Linear(shape.hidden_size, shape.hidden_size)
        self.activation = HIDDEN_ACTIVATIONS[shape.activation]
        self.norm = nn.LayerNorm(shape.hidden_size, eps=shape.layer_norm_eps)
        self.decoder = nn.Linear(shape.hidden_size, shape.vocab_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [num_tokens, vocab], the model's dtype
        logits: torch.Tensor = self.decoder(self.norm(self.activation(self.transform(hidden))))
        return logits

    def load_hf_weights(self, weights: dict[str, torch.Tensor], word_embeddings: torch.Tensor) -> None:
        """From a BertForMaskedLM state dict (prefix-stripped: `cls.predictions.*`); a decoder tied to
        the word embeddings (not stored) takes them."""
        head = "cls.predictions."
        try:
            state = {
                "transform.weight": weights[head + "transform.dense.weight"],
                "transform.bias": weights[head + "transform.dense.bias"],
                "norm.weight": weights[head + "transform.LayerNorm.weight"],
                "norm.bias": weights[head + "transform.LayerNorm.bias"],
                "decoder.weight": weights.get(head + "decoder.weight", word_embeddings),
                "decoder.bias": weights.get(head + "decoder.bias", weights[head + "bias"]),
            }
        except KeyError as missing:
            raise InvalidInput(
                f"a SPLADE model needs its masked-LM head's weights: {missing} is missing"
            ) from None
        self.load_state_dict(state, strict=True)


class SpladeEmbedder(ServedModel):
    """A BERT-family encoder with its masked-LM head and SPLADE pooling: one vocabulary-wide row per
    sequence, SPARSE its one output (`forward`; no dense vector, no multi-output forward)."""

    def __init__(self, shape: BertShape, attend: Attention, spec: SpladeSpec) -> None:
        super().__init__()
        if shape.vocab_size > MAX_VOCABULARY:
            raise InvalidInput(f"a vocabulary of {shape.vocab_size} ids is past the {MAX_VOCABULARY} served")
        self.spec = spec
        self.encoder = BertEncoder(shape, attend)
        self.head = MlmHead(shape)
        self.facts = ModelFacts(
            "embed",
            shape.vocab_size,
            shape.max_sequence_length,
            shape.vocab_size,
            "splade",
            SPARSE,
            sparse_vocabulary=True,
        )

    def load_hf_weights(self, weights: dict[str, torch.Tensor]) -> None:
        self.encoder.load_hf_weights(weights)
        self.head.load_hf_weights(weights, self.encoder.word_embeddings.weight.detach())

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        hidden: torch.Tensor = self.encoder(input_ids, position_ids, token_type_ids, meta)
        return hidden

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [num_seqs, vocab] float32
        hidden = self.hidden_states(input_ids, position_ids, token_type_ids, meta)
        # [num_tokens, vocab] float32, the largest activation of the step: made once, then in place
        weights: torch.Tensor = self.head(hidden).float().relu_().log1p_()
        if self.spec.activation == "log1p_relu":
            weights.log1p_()
        # Pooled per sequence by its tokens' seq_ids: a graph bucket's padding tokens belong to its
        # padding slot, whose row is dropped, so no real row sees them. Every weight is >= 0, so a
        # max over zeros is the max over the sequence's own tokens.
        pooled = weights.new_zeros(meta.num_seqs, weights.shape[1])  # [num_seqs, vocab]
        if self.spec.pooling == "max":
            rows = meta.seq_ids.unsqueeze(1).expand_as(weights)  # a view: each weight's row
            pooled.scatter_reduce_(0, rows, weights, "amax", include_self=True)
        else:
            pooled.index_add_(0, meta.seq_ids, weights)
        return pooled
