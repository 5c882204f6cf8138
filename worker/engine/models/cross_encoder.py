"""Cross-encoders: a BERT-family encoder over a templated (query, document) pair plus its
sequence-classification head, answering raw logits [num_seqs, num_labels].

Two heads exist in the wild, both reading the first token's hidden state:
- `BertForSequenceClassification`: the BERT pooler (dense + tanh), then `classifier` (linear);
- `RobertaForSequenceClassification` / `XLMRobertaForSequenceClassification`: `classifier.dense`
  + tanh, then `classifier.out_proj`.
Dropout is the identity at inference. Activations (sigmoid, softmax) are the gateway's business:
the worker answers logits, so `raw_scores` and every API's convention can be served from one output.
"""

from typing import Any

import torch
from torch import nn

from kembed.worker.engine.layers.attention import Attention, AttentionMetadata
from kembed.worker.engine.layers.pooling import pool
from kembed.worker.engine.models.bert import BertEncoder, BertShape
from kembed.worker.engine.models.model_dir import ModelDir, load_weights
from kembed.worker.engine.models.served import ModelFacts, ServedModel
from kembed.worker.errors import InvalidInput

# config.json `architectures` served by this module, and whether each uses the BERT pooler head.
CROSS_ENCODER_ARCHITECTURES = {
    "BertForSequenceClassification": True,
    "RobertaForSequenceClassification": False,
    "XLMRobertaForSequenceClassification": False,
}


class BertCrossEncoder(ServedModel):
    """Encoder + classification head on the first token ([CLS] / <s>); capturable, no host syncs."""

    def __init__(self, shape: BertShape, attend: Attention, num_labels: int) -> None:
        super().__init__()
        hidden = shape.hidden_size
        self.encoder = BertEncoder(shape, attend)
        self.dense = nn.Linear(hidden, hidden)  # BERT's pooler, or RoBERTa's classifier.dense
        self.out_proj = nn.Linear(hidden, num_labels)  # BERT's classifier, or RoBERTa's out_proj
        # RoBERTa-family checkpoints have one token type and their tokenizers emit only zeros for
        # pairs; anything else the wire carries is ignored rather than read out of the table.
        self.has_token_types = shape.type_vocab_size > 1
        self.facts = ModelFacts("score", num_labels, shape.max_sequence_length, shape.vocab_size)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        if not self.has_token_types:
            token_type_ids = torch.zeros_like(token_type_ids)
        hidden = self.encoder(input_ids, position_ids, token_type_ids, meta)
        first = pool(hidden, meta, "cls")  # [num_seqs, hidden]; safe on a bucket's empty slots
        logits: torch.Tensor = self.out_proj(torch.tanh(self.dense(first)))  # [num_seqs, num_labels]
        return logits.float()

    @classmethod
    def load(cls, model_dir: ModelDir, attend: Attention) -> "BertCrossEncoder":
        """Build from a transformers *ForSequenceClassification directory, weights loaded."""
        config = model_dir.config
        architecture = cross_encoder_architecture(config)
        has_pooler = CROSS_ENCODER_ARCHITECTURES[architecture]
        weights = load_weights(model_dir.path)  # "bert." / "roberta." stripped; heads keep their names
        head = ("pooler.dense", "classifier") if has_pooler else ("classifier.dense", "classifier.out_proj")
        missing = [f"{name}.weight" for name in head if f"{name}.weight" not in weights]
        if missing:
            raise InvalidInput(f"{model_dir.path} is a {architecture} without {', '.join(missing)}")
        num_labels = weights[f"{head[1]}.weight"].shape[0]
        model = cls(BertShape.from_config(config), attend, num_labels)
        model.encoder.load_hf_weights(weights)
        model.dense.load_state_dict({k: weights[f"{head[0]}.{k}"] for k in ("weight", "bias")})
        model.out_proj.load_state_dict({k: weights[f"{head[1]}.{k}"] for k in ("weight", "bias")})
        return model


def cross_encoder_architecture(config: dict[str, Any]) -> str:
    """The served head among config.json `architectures`; InvalidInput if none is."""
    architectures: list[str] = config["architectures"]
    architecture = next((a for a in architectures if a in CROSS_ENCODER_ARCHITECTURES), None)
    if architecture is None:
        supported = ", ".join(CROSS_ENCODER_ARCHITECTURES)
        raise InvalidInput(f"architectures {config['architectures']} are not served (supported: {supported})")
    return architecture
