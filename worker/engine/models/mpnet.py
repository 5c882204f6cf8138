"""MPNet encoders (all-mpnet-base-v2, multi-qa-mpnet) over packed ragged batches.

transformers' `MPNetModel` is BERT's post-LayerNorm encoder (so its layers are `BertLayer`s) with two
differences: no token types, and a relative position bias added to every layer's attention scores,
one table shared by all layers (`encoder.relative_attention_bias`, T5's bidirectional buckets;
relative_bias.py). Positions are numbered from padding_idx + 1 as RoBERTa's, MPNet's padding_idx being
1 whatever config.json says (transformers hard-codes it).
"""

from typing import Any

import torch
from torch import nn

from kembed.worker.engine.layers.attention import Attention, AttentionMetadata
from kembed.worker.engine.layers.relative_bias import RelativePositionBias
from kembed.worker.engine.models.bert import (
    HIDDEN_ACTIVATIONS,
    BertLayer,
    BertShape,
    LayerNames,
    layer_state,
    run_layers,
)
from kembed.worker.engine.models.served import PooledEmbedder
from kembed.worker.errors import InvalidInput

MPNET_FAMILY = ("mpnet",)
_PADDING_IDX = 1  # MPNetEmbeddings.padding_idx
# MPNetEncoder.compute_position_bias buckets with its defaults, whatever the config's bucket count
NUM_BUCKETS, MAX_DISTANCE = 32, 128
_LAYER_NAMES = LayerNames(
    qkv=("attention.attn.q", "attention.attn.k", "attention.attn.v"),
    attn_out="attention.attn.o",
    attn_norm="attention.LayerNorm",
)


def mpnet_shape(config: dict[str, Any]) -> BertShape:
    """The config.json fields that shape an MPNet network, as the BERT shape its layers take;
    InvalidInput for a variant transformers' MPNetModel would not run as configured."""
    if config.get("model_type") not in MPNET_FAMILY:
        raise InvalidInput(f"model_type {config.get('model_type')!r} is not MPNet")
    activation = config.get("hidden_act", "gelu")
    if activation not in HIDDEN_ACTIVATIONS:
        raise InvalidInput(f"unsupported hidden_act {activation!r}")
    if config.get("relative_attention_num_buckets", NUM_BUCKETS) < NUM_BUCKETS:
        raise InvalidInput(
            f"relative_attention_num_buckets {config['relative_attention_num_buckets']} is below the "
            f"{NUM_BUCKETS} buckets MPNet's attention indexes"
        )
    return BertShape(
        vocab_size=config["vocab_size"],
        hidden_size=config["hidden_size"],
        num_layers=config["num_hidden_layers"],
        num_heads=config["num_attention_heads"],
        intermediate_size=config["intermediate_size"],
        activation=activation,
        max_position_embeddings=config["max_position_embeddings"],
        type_vocab_size=0,
        layer_norm_eps=config.get("layer_norm_eps", 1e-12),
        position_offset=_PADDING_IDX + 1,
    )


class MPNetEncoder(nn.Module):
    """Embeddings, the shared relative position bias and the encoder layers."""

    def __init__(self, shape: BertShape, attend: Attention, num_bias_buckets: int) -> None:
        super().__init__()
        self.shape = shape
        self.word_embeddings = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.position_embeddings = nn.Embedding(shape.max_position_embeddings, shape.hidden_size)
        self.embed_norm = nn.LayerNorm(shape.hidden_size, eps=shape.layer_norm_eps)
        self.position_bias = RelativePositionBias(
            num_bias_buckets, shape.num_heads, NUM_BUCKETS, MAX_DISTANCE
        )
        self.layers = nn.ModuleList(BertLayer(shape, attend) for _ in range(shape.num_layers))

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        x = self.word_embeddings(input_ids) + self.position_embeddings(
            position_ids + self.shape.position_offset
        )
        return run_layers(self.layers, self.embed_norm(x), meta, self.position_bias())

    def load_hf_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Load a transformers MPNetModel state dict (prefix-stripped), fusing Q/K/V."""
        state = {
            "word_embeddings.weight": weights["embeddings.word_embeddings.weight"],
            "position_embeddings.weight": weights["embeddings.position_embeddings.weight"],
            "embed_norm.weight": weights["embeddings.LayerNorm.weight"],
            "embed_norm.bias": weights["embeddings.LayerNorm.bias"],
            "position_bias.relative_attention_bias.weight": weights["encoder.relative_attention_bias.weight"],
        }
        for i in range(self.shape.num_layers):
            state.update(layer_state(weights, i, f"layers.{i}.", _LAYER_NAMES))
        self.load_state_dict(state, strict=True)


class MPNetEmbedder(PooledEmbedder):
    """MPNet encoder + sentence-transformers pooling (all-mpnet-base-v2: mean, then Normalize)."""

    def __init__(self, config: dict[str, Any], attend: Attention, pooling: str) -> None:
        shape = mpnet_shape(config)
        super().__init__(pooling, shape.hidden_size, shape.max_sequence_length, shape.vocab_size)
        self.encoder = MPNetEncoder(shape, attend, config.get("relative_attention_num_buckets", NUM_BUCKETS))

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        token_type_ids: torch.Tensor,  # MPNet has no token types
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        hidden: torch.Tensor = self.encoder(input_ids, position_ids, meta)
        return hidden
