"""DistilBERT encoders (msmarco-distilbert, multi-qa-distilbert) served on bert.py's encoder.

transformers' `DistilBertModel` is BERT's post-norm encoder under other names, without token types
and without a pooler: embeddings (word + position, LayerNorm), then per layer
LayerNorm(x + out_lin(attention(q_lin, k_lin, v_lin))) and LayerNorm(x + lin2(act(lin1(x)))), every
LayerNorm with eps 1e-12. So the family is a config reading and a weight-name mapping onto
`BertEncoder`, whose layers (and fused CUDA kernels) it runs unchanged. `sinusoidal_pos_embds`
checkpoints carry the table they were trained with; where one lacks it, the table is computed as
transformers initialises it.
"""

from typing import Any

import numpy as np
import torch

from kembed.worker.engine.layers.attention import Attention
from kembed.worker.engine.models.bert import HIDDEN_ACTIVATIONS, BertEmbedder, BertShape
from kembed.worker.engine.models.model_dir import ModelDir
from kembed.worker.errors import InvalidInput

DISTILBERT_FAMILY = ("distilbert",)
_LAYER_NAMES = {  # DistilBERT's per-layer module names -> BERT's
    "attention.q_lin": "attention.self.query",
    "attention.k_lin": "attention.self.key",
    "attention.v_lin": "attention.self.value",
    "attention.out_lin": "attention.output.dense",
    "sa_layer_norm": "attention.output.LayerNorm",
    "ffn.lin1": "intermediate.dense",
    "ffn.lin2": "output.dense",
    "output_layer_norm": "output.LayerNorm",
}


def distilbert_shape(config: dict[str, Any]) -> BertShape:
    """The BERT shape of a DistilBERT config.json (its own field names: dim, n_layers, n_heads,
    hidden_dim, activation); InvalidInput for what it does not serve."""
    activation = config.get("activation", "gelu")
    if activation not in HIDDEN_ACTIVATIONS:
        raise InvalidInput(
            f"unsupported DistilBERT activation {activation!r} (served: {', '.join(HIDDEN_ACTIVATIONS)})"
        )
    if config["dim"] % config["n_heads"]:
        raise InvalidInput(f"DistilBERT dim {config['dim']} is not a multiple of n_heads {config['n_heads']}")
    return BertShape(
        vocab_size=config["vocab_size"],
        hidden_size=config["dim"],
        num_layers=config["n_layers"],
        num_heads=config["n_heads"],
        intermediate_size=config["hidden_dim"],
        activation=activation,
        max_position_embeddings=config.get("max_position_embeddings", 512),
        type_vocab_size=0,
        layer_norm_eps=1e-12,  # fixed in transformers' DistilBERT, not read from the config
        position_offset=0,
    )


def bert_weights(weights: dict[str, torch.Tensor], config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """A DistilBertModel state dict under BertModel's names (`BertEncoder.load_hf_weights`)."""
    renamed: dict[str, torch.Tensor] = {}
    for key, tensor in weights.items():
        key = key.removeprefix("distilbert.")
        if key.startswith("transformer.layer."):
            index, name = key.removeprefix("transformer.layer.").split(".", 1)
            module, kind = name.rsplit(".", 1)
            if module not in _LAYER_NAMES:
                raise InvalidInput(f"unexpected DistilBERT weight {key}")
            key = f"encoder.layer.{index}.{_LAYER_NAMES[module]}.{kind}"
        renamed[key] = tensor
    table = "embeddings.position_embeddings.weight"
    if table not in renamed and config.get("sinusoidal_pos_embds"):
        renamed[table] = sinusoidal_table(config.get("max_position_embeddings", 512), config["dim"])
    return renamed


def sinusoidal_table(num_positions: int, dim: int) -> torch.Tensor:
    """transformers' `create_sinusoidal_embeddings`: sin on even columns, cos on odd, in float64
    then float32."""
    position = np.arange(num_positions)[:, None] / np.power(10000, 2 * (np.arange(dim) // 2) / dim)[None, :]
    table = torch.empty(num_positions, dim)
    table[:, 0::2] = torch.FloatTensor(np.sin(position[:, 0::2]))
    table[:, 1::2] = torch.FloatTensor(np.cos(position[:, 1::2]))
    return table


def build_distilbert(
    model_dir: ModelDir, weights: dict[str, torch.Tensor], attend: Attention, pooling: str
) -> BertEmbedder:
    """A DistilBERT embedder on bert.py's encoder, weights loaded, on the CPU."""
    model = BertEmbedder(distilbert_shape(model_dir.config), attend, pooling)
    model.encoder.load_hf_weights(bert_weights(weights, model_dir.config))
    return model
