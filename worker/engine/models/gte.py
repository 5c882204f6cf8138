"""GTE encoders (gte-multilingual-base, gte-base-en-v1.5, snowflake-arctic-embed-m-v2.0) on the
shared rotary encoder (rotary_bert.py).

transformers' `GteModel`, Alibaba's "new" architecture (`NewModel`, model_type `new` in the published
configs, `gte` in transformers 5's): post-norm layers, rotary positions, a fused qkv_proj and o_proj
with biases, a GeGLU MLP (up_gate_proj = [up; gate] without a bias, down_proj with one), token types
only where type_vocab_size > 0 (gte-base-en-v1.5 has none), CLS pooling in the published pipelines.
Rotary scaling: NewModel's fixed NTK (`rope_scaling: {type: ntk, factor}`: the same frequencies at
every position), transformers' linear and dynamic (read_rope). NewModel's unpadding and its
memory-efficient attention are implementation choices with the same result: kembed packs anyway.
Refused, naming each: absolute positions, RMSNorm (layer_norm_type rms_norm), log-n attention
scaling, separate q/k/v projections (pack_qkv false), mixed NTK.
"""

from typing import Any

import torch

from kembed.worker.engine.layers.attention import Attention
from kembed.worker.engine.models.model_dir import ModelDir
from kembed.worker.engine.models.rotary_bert import (
    RotaryEmbedder,
    RotaryEncoderShape,
    linear_state,
    read_rope,
    take,
)
from kembed.worker.errors import InvalidInput

GTE_FAMILY = ("gte", "new")


def gte_shape(config: dict[str, Any]) -> RotaryEncoderShape:
    """The rotary encoder of a GTE config.json (`gte` or `new`); InvalidInput for what is not served."""
    for option, served in (
        ("position_embedding_type", "rope"),
        ("layer_norm_type", "layer_norm"),
        ("logn_attention_scale", False),
        ("pack_qkv", True),
    ):
        if config.get(option, served) != served:
            raise InvalidInput(
                f"GTE with {option}={config[option]!r} is not served (kembed serves {served!r})"
            )
    hidden, num_heads = config["hidden_size"], config["num_attention_heads"]
    # transformers' GteConfig defaults theta to 160000; Alibaba's NewConfig to 10000
    theta, divisor = read_rope(
        config, hidden // num_heads, 160000.0 if config["model_type"] == "gte" else 10000.0
    )
    return RotaryEncoderShape(
        vocab_size=config["vocab_size"],
        hidden_size=hidden,
        num_layers=config["num_hidden_layers"],
        num_heads=num_heads,
        intermediate_size=config["intermediate_size"],
        activation=config.get("hidden_act", "gelu"),
        type_vocab_size=config.get("type_vocab_size", 1),
        layer_norm_eps=config.get("layer_norm_eps", 1e-12),
        max_positions=config.get("max_position_embeddings", 8192),
        rope_theta=theta,
        rope_divisor=divisor,
        attention_bias=True,
        is_gated=True,
        gate_up_bias=False,
        down_bias=True,
    ).check()


def gte_state(weights: dict[str, torch.Tensor], shape: RotaryEncoderShape) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under RotaryEncoder's names; up_gate_proj's halves swapped to
    [gate; up]."""
    weights = {key.removeprefix("new."): tensor for key, tensor in weights.items()}  # NewFor* heads
    state = {
        "word_embeddings.weight": take(weights, "embeddings.word_embeddings.weight"),
        "embed_norm.weight": take(weights, "embeddings.LayerNorm.weight"),
        "embed_norm.bias": take(weights, "embeddings.LayerNorm.bias"),
    }
    if shape.type_vocab_size:
        state["token_type_embeddings.weight"] = take(weights, "embeddings.token_type_embeddings.weight")
    for i in range(shape.num_layers):
        hf, ours = f"encoder.layer.{i}.", f"layers.{i}."
        state |= linear_state(weights, ours + "qkv", hf + "attention.qkv_proj", True)
        state |= linear_state(weights, ours + "attn_out", hf + "attention.o_proj", True)
        up, gate = take(weights, hf + "mlp.up_gate_proj.weight").chunk(2)
        state[ours + "mlp.gate_up.weight"] = torch.cat([gate, up])
        state |= linear_state(weights, ours + "mlp.down", hf + "mlp.down_proj", True)
        state |= linear_state(weights, ours + "attn_norm", hf + "attn_ln", True)
        state |= linear_state(weights, ours + "mlp_norm", hf + "mlp_ln", True)
    return state


def build_gte(
    model_dir: ModelDir, weights: dict[str, torch.Tensor], attend: Attention, pooling: str
) -> RotaryEmbedder:
    """A GTE embedder, weights loaded, on the CPU."""
    shape = gte_shape(model_dir.config)
    model = RotaryEmbedder(shape, attend, pooling)
    model.encoder.load(gte_state(weights, shape))
    return model
