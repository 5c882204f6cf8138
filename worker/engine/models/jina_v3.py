"""jina-embeddings-v3 encoders on the shared rotary encoder (rotary_bert.py), with its task LoRA
adapters merged at load, one per deployment.

XLM-RoBERTa with rotary positions (theta 20000) in place of absolute ones: post-norm layers, a fused
Wqkv and out_proj with biases, a plain GELU MLP (fc1, fc2) with biases, one token type, mean pooling
in the published pipeline; weight names of Jina's flash implementation (emb_ln,
encoder.layers.N.mixer.Wqkv, mixer.out_proj, mlp.fc1/fc2, norm1/norm2), which transformers 5's
`JinaEmbeddingsV3Model` keeps on disk.

Two checkpoint formats. transformers' (model_type jina_embeddings_v3): the encoder alone, without
adapters (what that class computes). Jina's own (`XLMRobertaLoRA`: model_type xlm-roberta,
position_embedding_type rotary, `lora_adaptations`, run by its remote code): every linear and
embedding of the encoder is a torch parametrization, its weight under
`parametrizations.weight.original` and, per task t of `lora_adaptations`, low-rank factors
`lora_A[t]`, `lora_B[t]` scaled by lora_alpha / lora_rank: a linear's weight [out, in] becomes
W + B[t] @ A[t] * scaling (A [rank, in], B [out, rank]); an embedding table [vocab, dim]
W + A[t] @ B[t] * scaling (A [vocab, rank], B [rank, dim]), as its `LoRAParametrization.lora_forward`
computes. No field of a request carries a task to the worker (prompts are token ids by then), so the
deployment picks one (`WorkerConfig.adapter`): its weights are merged in float32 at load, exactly
the model's forward with that task for every sequence, at the base model's cost. Without one the
base weights are served, as the model's `encode` without a task does. The task's instruction
prefix ("Represent the query for retrieving evidence documents: ") is a prompt, the gateway's.
"""

import logging
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

log = logging.getLogger(__name__)

JINA_V3_FAMILY = ("jina_embeddings_v3",)
_ORIGINAL, _LORA = ".parametrizations.weight.original", ".parametrizations.weight.0.lora_"


def is_jina_lora_checkpoint(config: dict[str, Any]) -> bool:
    """Whether config.json is Jina's own jina-embeddings-v3 (XLM-R with rotary positions and task
    LoRA adapters, run by its remote code)."""
    return config.get("model_type") == "xlm-roberta" and (
        config.get("position_embedding_type") == "rotary" or "lora_adaptations" in config
    )


def tasks_of(config: dict[str, Any]) -> tuple[str, ...]:
    """The task adapters a jina-embeddings-v3 config.json names (none in transformers' format)."""
    return tuple(config.get("lora_adaptations") or ())


def jina_v3_shape(config: dict[str, Any]) -> RotaryEncoderShape:
    """The rotary encoder of a jina-embeddings-v3 config.json, in either format."""
    hidden, num_heads = config.get("hidden_size", 1024), config.get("num_attention_heads", 16)
    if is_jina_lora_checkpoint(config):
        if config.get("position_embedding_type") != "rotary":
            raise InvalidInput(f"jina-embeddings-v3 with {config.get('position_embedding_type')!r} positions")
        if float(config.get("rotary_emb_fraction", 1.0)) != 1.0:
            raise InvalidInput(f"jina-embeddings-v3 with rotary_emb_fraction {config['rotary_emb_fraction']}")
        theta, divisor = float(config.get("rotary_emb_base", 10000.0)), 1.0
    else:
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
        rotary_interleaved=bool(config.get("rotary_emb_interleaved", False)),
        attention_bias=True,
        is_gated=False,
    ).check()


class _Adapted:
    """The checkpoint's weights with one task's LoRA merged (none: the base weights)."""

    def __init__(self, weights: dict[str, torch.Tensor], config: dict[str, Any], adapter: str) -> None:
        self.weights = weights
        tasks = tasks_of(config)
        if adapter and adapter not in tasks:
            served = f"its tasks are {', '.join(tasks)}" if tasks else "it has no task adapters"
            raise InvalidInput(f"adapter {adapter!r} is not one of this model's: {served}")
        has_lora = any(_LORA in key for key in weights)
        if has_lora != bool(tasks):
            raise InvalidInput(
                "config.json's lora_adaptations and the checkpoint's LoRA weights disagree: "
                f"{len(tasks)} tasks named, LoRA weights {'present' if has_lora else 'absent'}"
            )
        self.task = tasks.index(adapter) if adapter else None
        self.scaling = float(config.get("lora_alpha", 1)) / float(config.get("lora_rank", 4))

    def weight(self, module: str, *, is_embedding: bool = False) -> torch.Tensor:
        """`module`'s weight: plain, or the parametrization's original plus the task's update."""
        if f"{module}.weight" in self.weights:
            return self.weights[f"{module}.weight"]
        base = take(self.weights, module + _ORIGINAL)
        if self.task is None:
            return base
        a = take(self.weights, f"{module}{_LORA}A")[self.task].float()
        b = take(self.weights, f"{module}{_LORA}B")[self.task].float()
        update = (a @ b) if is_embedding else (b @ a)
        return base.float() + update.view(base.shape) * self.scaling

    def linear(self, ours: str, module: str) -> dict[str, torch.Tensor]:
        return {f"{ours}.weight": self.weight(module), f"{ours}.bias": take(self.weights, f"{module}.bias")}


def jina_v3_state(
    weights: dict[str, torch.Tensor], config: dict[str, Any], shape: RotaryEncoderShape, adapter: str
) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under RotaryEncoder's names, `adapter`'s LoRA merged."""
    adapted = _Adapted(weights, config, adapter)
    state = {
        "word_embeddings.weight": adapted.weight("embeddings.word_embeddings", is_embedding=True),
        "embed_norm.weight": take(weights, "emb_ln.weight"),
        "embed_norm.bias": take(weights, "emb_ln.bias"),
    }
    if shape.type_vocab_size:
        types = adapted.weight("embeddings.token_type_embeddings", is_embedding=True)
        state["token_type_embeddings.weight"] = types
    for i in range(shape.num_layers):
        hf, ours = f"encoder.layers.{i}.", f"layers.{i}."
        state |= adapted.linear(ours + "qkv", hf + "mixer.Wqkv")
        state |= adapted.linear(ours + "attn_out", hf + "mixer.out_proj")
        state |= adapted.linear(ours + "mlp.up", hf + "mlp.fc1")
        state |= adapted.linear(ours + "mlp.down", hf + "mlp.fc2")
        state |= linear_state(weights, ours + "attn_norm", hf + "norm1", True)
        state |= linear_state(weights, ours + "mlp_norm", hf + "norm2", True)
    return state


def build_jina_v3(
    model_dir: ModelDir, weights: dict[str, torch.Tensor], attend: Attention, pooling: str
) -> RotaryEmbedder:
    """A jina-embeddings-v3 embedder with the deployment's task adapter merged, on the CPU."""
    shape = jina_v3_shape(model_dir.config)
    model = RotaryEmbedder(shape, attend, pooling)
    model.encoder.load(jina_v3_state(weights, model_dir.config, shape, model_dir.adapter))
    tasks = tasks_of(model_dir.config)
    if model_dir.adapter:
        log.info("jina-embeddings-v3: task adapter %s merged into the weights", model_dir.adapter)
    elif tasks:
        log.warning(
            "jina-embeddings-v3: no --adapter, so the base weights are served (as its encode without a "
            "task); its task adapters: %s",
            ", ".join(tasks),
        )
    return model
