"""jina-embeddings-v3 encoders (transformers' `JinaEmbeddingsV3Model`) on the shared rotary encoder
(rotary_bert.py).

XLM-RoBERTa with rotary positions (theta 20000) in place of absolute ones: post-norm layers, a fused
Wqkv and out_proj with biases, a plain GELU MLP (fc1, fc2) with biases, one token type, mean pooling
in the published pipeline. Checkpoints keep the flash implementation's weight names (emb_ln,
encoder.layers.N.mixer.Wqkv, mixer.out_proj, mlp.fc1/fc2, norm1/norm2), as transformers writes them.

What is served is the encoder as transformers 5.24's class computes it: without task adapters.
The original checkpoint (`XLMRobertaLoRA`: model_type xlm-roberta with rotary positions and
`lora_adaptations`) carries five task LoRA adapters, which kembed does not apply yet: it is refused,
naming them, rather than served with none of them.
"""

from typing import Any

import torch

from kembed.worker.engine.layers.attention import Attention
from kembed.worker.engine.models.rotary_bert import (
    RotaryEmbedder,
    RotaryEncoderShape,
    linear_state,
    read_rope,
    take,
)
from kembed.worker.errors import InvalidInput

JINA_V3_FAMILY = ("jina_embeddings_v3",)


def is_jina_lora_checkpoint(config: dict[str, Any]) -> bool:
    """Whether config.json is the original jina-embeddings-v3's (XLM-R with rotary positions and
    task LoRA adapters, run by its own remote code)."""
    return config.get("model_type") == "xlm-roberta" and (
        config.get("position_embedding_type") == "rotary" or "lora_adaptations" in config
    )


def refuse_jina_lora_checkpoint(config: dict[str, Any]) -> InvalidInput:
    """Why the original jina-embeddings-v3 checkpoint is refused."""
    tasks = ", ".join(config.get("lora_adaptations") or ())
    return InvalidInput(
        "this is jina-embeddings-v3's original checkpoint (XLMRobertaLoRA: XLM-RoBERTa with rotary "
        f"positions and task LoRA adapters{': ' + tasks if tasks else ''}); kembed does not apply its "
        "adapters yet and refuses it rather than serve vectors of none of its tasks. It serves "
        "transformers' JinaEmbeddingsV3Model format (model_type jina_embeddings_v3), without adapters"
    )


def jina_v3_shape(config: dict[str, Any]) -> RotaryEncoderShape:
    """The rotary encoder of a JinaEmbeddingsV3 config.json."""
    hidden, num_heads = config.get("hidden_size", 1024), config.get("num_attention_heads", 16)
    theta, divisor = read_rope(config, hidden // num_heads, 20000.0)  # transformers' default_theta
    return RotaryEncoderShape(
        vocab_size=config.get("vocab_size", 250002),
        hidden_size=hidden,
        num_layers=config.get("num_hidden_layers", 24),
        num_heads=num_heads,
        intermediate_size=config.get("intermediate_size", 4096),
        activation=config.get("hidden_act", "gelu"),
        type_vocab_size=config.get("type_vocab_size", 1),
        layer_norm_eps=config.get("layer_norm_eps", 1e-5),
        max_positions=config.get("max_position_embeddings", 8194),
        rope_theta=theta,
        rope_divisor=divisor,
        attention_bias=True,
        is_gated=False,
    ).check()


def jina_v3_state(weights: dict[str, torch.Tensor], shape: RotaryEncoderShape) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under RotaryEncoder's names; InvalidInput for a checkpoint that
    carries adapter weights (they would be left out silently)."""
    adapters = sorted(key for key in weights if "lora" in key or "parametrizations" in key)
    if adapters:
        raise InvalidInput(
            f"the checkpoint carries adapter weights ({adapters[0]}, ... {len(adapters)} tensors), which "
            "kembed does not apply yet: refused rather than served without them"
        )
    state = {
        "word_embeddings.weight": take(weights, "embeddings.word_embeddings.weight"),
        "embed_norm.weight": take(weights, "emb_ln.weight"),
        "embed_norm.bias": take(weights, "emb_ln.bias"),
    }
    if shape.type_vocab_size:
        state["token_type_embeddings.weight"] = take(weights, "embeddings.token_type_embeddings.weight")
    for i in range(shape.num_layers):
        hf, ours = f"encoder.layers.{i}.", f"layers.{i}."
        state |= linear_state(weights, ours + "qkv", hf + "mixer.Wqkv", True)
        state |= linear_state(weights, ours + "attn_out", hf + "mixer.out_proj", True)
        state |= linear_state(weights, ours + "mlp.up", hf + "mlp.fc1", True)
        state |= linear_state(weights, ours + "mlp.down", hf + "mlp.fc2", True)
        state |= linear_state(weights, ours + "attn_norm", hf + "norm1", True)
        state |= linear_state(weights, ours + "mlp_norm", hf + "norm2", True)
    return state


def build_jina_v3(
    config: dict[str, Any], weights: dict[str, torch.Tensor], attend: Attention, pooling: str
) -> RotaryEmbedder:
    """A jina-embeddings-v3 embedder (no adapter), weights loaded, on the CPU."""
    shape = jina_v3_shape(config)
    model = RotaryEmbedder(shape, attend, pooling)
    model.encoder.load(jina_v3_state(weights, shape))
    return model
