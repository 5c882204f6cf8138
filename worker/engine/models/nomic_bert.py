"""NomicBERT encoders (nomic-embed-text v1, v1.5) on the shared rotary encoder (rotary_bert.py).

transformers' `NomicBertModel`: post-norm layers, rotary positions (theta 1000 in v1.5), a fused Wqkv
without biases, a SwiGLU MLP (fc12 the gate, fc11 the up projection, fc2 down) without biases, mean
pooling in the sentence-transformers pipeline. Checkpoints keep nomic's own weight names (emb_ln,
encoder.layers.N.attn.Wqkv, mlp.fc11/fc12/fc2, norm1/norm2), which transformers renames on load
and writes back on save. config.json comes in two spellings: transformers 5's (hidden_size,
rope_parameters, ...) and nomic's own, which the published models ship (n_embd, n_head, n_layer,
n_inner, n_positions, rotary_emb_base, rotary_emb_fraction, rotary_emb_interleaved, qkv_proj_bias,
mlp_fc1_bias, mlp_fc2_bias, layer_norm_epsilon). Of nomic's own options kembed serves the rotary
over a fraction of each head and either pairing, and each bias; it refuses pre-norm, parallel
blocks, RMSNorm, causal attention, mixture-of-experts layers (nomic-embed-text-v2-moe), and the
sequence-length-dependent rotary scalings (rotary_scaling_factor, rotary_emb_scale_base), naming each.
The prompts ("search_query: ", "search_document: ", ...) are the gateway's: it reads them from
config_sentence_transformers.json.
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

NOMIC_FAMILY = ("nomic_bert",)
# nomic's own config options and the one value of each kembed serves (None: absent, null or 0)
_SERVED = {
    "prenorm": False,
    "parallel_block": False,
    "use_rms_norm": False,
    "causal": False,
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "rotary_scaling_factor": None,
    "rotary_emb_scale_base": None,
    "moe_every_n_layers": None,
    "num_experts": None,
}


def nomic_shape(config: dict[str, Any]) -> RotaryEncoderShape:
    """The rotary encoder of a NomicBERT config.json, in either spelling; InvalidInput naming an
    option kembed does not serve."""
    for option, served in _SERVED.items():
        value = config.get(option)
        if value is not None and value != served and not (served is None and value == 0):
            raise InvalidInput(f"NomicBERT with {option}={value!r} is not served (kembed serves {served})")
    if "n_embd" in config:  # nomic's own spelling (GPT-2's field names)
        activation = config.get("activation_function", "swiglu")
        if activation != "swiglu":
            raise InvalidInput(f"NomicBERT activation_function {activation!r} is not served (only swiglu)")
        hidden, num_heads = config["n_embd"], config["n_head"]
        fraction = float(config.get("rotary_emb_fraction", 0.0))
        if not 0.0 < fraction <= 1.0:
            raise InvalidInput(f"NomicBERT rotary_emb_fraction {fraction} is not served (0 < fraction <= 1)")
        return RotaryEncoderShape(
            vocab_size=config["vocab_size"],
            hidden_size=hidden,
            num_layers=config["n_layer"],
            num_heads=num_heads,
            intermediate_size=config["n_inner"],
            activation="silu",
            type_vocab_size=config.get("type_vocab_size", 2),
            layer_norm_eps=config.get("layer_norm_epsilon", 1e-12),
            max_positions=config.get("n_positions", 2048),
            rope_theta=float(config.get("rotary_emb_base", 10000.0)),
            rotary_dim=int(fraction * (hidden // num_heads)),
            rotary_interleaved=bool(config.get("rotary_emb_interleaved", False)),
            attention_bias=bool(config.get("qkv_proj_bias", False)),
            is_gated=True,
            gate_up_bias=bool(config.get("mlp_fc1_bias", False)),
            down_bias=bool(config.get("mlp_fc2_bias", False)),
        ).check()
    hidden, num_heads = config.get("hidden_size", 768), config.get("num_attention_heads", 12)
    if config.get("head_dim") not in (None, hidden // num_heads):
        raise InvalidInput(
            f"NomicBERT head_dim {config['head_dim']} is not hidden_size / num_attention_heads"
        )
    theta, divisor = read_rope(config, hidden // num_heads, 1000.0)  # transformers' default_theta
    return RotaryEncoderShape(  # transformers 5's spelling; its defaults are nomic-embed-text-v1.5's
        vocab_size=config.get("vocab_size", 30528),
        hidden_size=hidden,
        num_layers=config.get("num_hidden_layers", 12),
        num_heads=num_heads,
        intermediate_size=config.get("intermediate_size", 3072),
        activation=config.get("hidden_act", "silu"),
        type_vocab_size=config.get("type_vocab_size", 2),
        layer_norm_eps=config.get("layer_norm_eps", 1e-12),
        max_positions=config.get("max_position_embeddings", 2048),
        rope_theta=theta,
        rope_divisor=divisor,
        attention_bias=False,
        is_gated=True,
        gate_up_bias=False,
        down_bias=False,
    ).check()


def nomic_state(weights: dict[str, torch.Tensor], shape: RotaryEncoderShape) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under RotaryEncoder's names, Wqkv as it is, [fc12; fc11] fused."""
    state = {
        "word_embeddings.weight": take(weights, "embeddings.word_embeddings.weight"),
        "embed_norm.weight": take(weights, "emb_ln.weight"),
        "embed_norm.bias": take(weights, "emb_ln.bias"),
    }
    if shape.type_vocab_size:
        state["token_type_embeddings.weight"] = take(weights, "embeddings.token_type_embeddings.weight")
    for i in range(shape.num_layers):
        hf, ours = f"encoder.layers.{i}.", f"layers.{i}."
        state |= linear_state(weights, ours + "qkv", hf + "attn.Wqkv", shape.attention_bias)
        state |= linear_state(weights, ours + "attn_out", hf + "attn.out_proj", shape.attention_bias)
        gate = linear_state(weights, "gate", hf + "mlp.fc12", shape.gate_up_bias)
        up = linear_state(weights, "up", hf + "mlp.fc11", shape.gate_up_bias)
        for kind in ("weight", "bias") if shape.gate_up_bias else ("weight",):
            state[f"{ours}mlp.gate_up.{kind}"] = torch.cat([gate[f"gate.{kind}"], up[f"up.{kind}"]])
        state |= linear_state(weights, ours + "mlp.down", hf + "mlp.fc2", shape.down_bias)
        state |= linear_state(weights, ours + "attn_norm", hf + "norm1", True)
        state |= linear_state(weights, ours + "mlp_norm", hf + "norm2", True)
    return state


def build_nomic(
    model_dir: ModelDir, weights: dict[str, torch.Tensor], attend: Attention, pooling: str
) -> RotaryEmbedder:
    """A NomicBERT embedder, weights loaded, on the CPU."""
    shape = nomic_shape(model_dir.config)
    model = RotaryEmbedder(shape, attend, pooling)
    model.encoder.load(nomic_state(weights, shape))
    return model
