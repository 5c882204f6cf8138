"""Which network a model directory builds, and the one forward signature every family implements.

A served model maps a packed ragged batch to one float32 row per sequence: pooled vectors for
embedders, logits for cross-encoders. The engine (eager or CUDA-graph replay) calls nothing else,
so a new family is a module here plus one line in `build_model`.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from kembed.worker.engine.attention import AttentionMetadata
from kembed.worker.engine.bert import BERT_FAMILY, BertEncoder, BertShape
from kembed.worker.engine.model_dir import ModelDir, load_weights
from kembed.worker.engine.pooling import pool
from kembed.worker.errors import InvalidInput


@dataclass(frozen=True)
class ModelFacts:
    """What the rest of the worker needs to know about a built model."""

    task: str  # "embed" (pooled vectors) or "score" (cross-encoder logits)
    output_size: int  # columns of each output row: hidden size, or number of labels
    max_sequence_length: int  # tokens the position table allows
    vocab_size: int


class ServedModel(nn.Module):
    """Base of the served families. `forward` must be CUDA-graph capturable: no host syncs, no
    data-dependent shapes beyond what `AttentionMetadata` carries."""

    facts: ModelFacts

    def forward(
        self,
        input_ids: torch.Tensor,  # [num_tokens] int64
        position_ids: torch.Tensor,  # [num_tokens] int64, 0-based within each sequence
        token_type_ids: torch.Tensor,  # [num_tokens] int64
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [num_seqs, output_size] float32
        raise NotImplementedError


class BertEmbedder(ServedModel):
    """BERT-family encoder + sentence-transformers pooling."""

    def __init__(self, shape: BertShape, attend: Callable, pooling: str) -> None:
        super().__init__()
        self.encoder = BertEncoder(shape, attend)
        self.pooling = pooling
        self.facts = ModelFacts("embed", shape.hidden_size, shape.max_sequence_length, shape.vocab_size)

    def forward(self, input_ids, position_ids, token_type_ids, meta):
        hidden = self.encoder(input_ids, position_ids, token_type_ids, meta)
        return pool(hidden, meta, self.pooling).float()


def build_model(model_dir: ModelDir, attend: Callable) -> ServedModel:
    """The served network for `model_dir`, weights loaded, on the CPU in the checkpoint's dtype."""
    config = model_dir.config
    model_type = model_dir.model_type
    if model_type in BERT_FAMILY:
        model = BertEmbedder(BertShape.from_config(config), attend, model_dir.pooling)
        model.encoder.load_hf_weights(load_weights(model_dir.path))
        return model
    raise InvalidInput(f"model_type {model_type!r} is not supported (supported: {', '.join(BERT_FAMILY)})")
