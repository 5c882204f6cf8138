"""jina-embeddings-v3 encoders on the shared rotary encoder (rotary_bert.py), with its task LoRA
adapters chosen per sequence.

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
computes. Every task is served beside every other (layers/lora.py): the base weights as they are,
each task's factors side by side, each token taking its sequence's task's update, so one step runs
retrieval.query and retrieval.passage sequences together. A sequence's task rides in its token type
ids, which this model has no other use for (one token type): 0 is the deployment's default
(`WorkerConfig.adapter`, else the base weights, as the model's `encode` without a task), t + 1 task
t of `lora_adaptations`; the worker's edge writes them from each request's adapter. The task's
instruction prefix ("Represent the query for retrieving evidence documents: ") is a prompt, the
gateway's. transformers' format has no adapters: its encoder as it is.
"""

import logging
from typing import Any

import torch
from torch import nn

from kembed.worker.engine.layers.attention import Attention, AttentionMetadata
from kembed.worker.engine.layers.lora import (
    TaskLoRAEmbedding,
    TaskLoRALinear,
    TaskMask,
    side_by_side_embedding,
    side_by_side_linear,
)
from kembed.worker.engine.layers.mlp import DenseMLP
from kembed.worker.engine.models.model_dir import ModelDir
from kembed.worker.engine.models.rotary_bert import (
    RotaryEmbedder,
    RotaryEncoder,
    RotaryEncoderLayer,
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


def check_tasks(weights: dict[str, torch.Tensor], config: dict[str, Any], adapter: str) -> tuple[str, ...]:
    """The checkpoint's tasks; InvalidInput where `adapter` is not one of them or config.json and the
    weights disagree on having adapters."""
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
    return tasks


class _Checkpoint:
    """The checkpoint's weights: plain, or the parametrization's original with every task's factors."""

    def __init__(self, weights: dict[str, torch.Tensor], config: dict[str, Any]) -> None:
        self.weights = weights
        self.scaling = float(config.get("lora_alpha", 1)) / float(config.get("lora_rank", 4))

    def module(self, ours: str, theirs: str, *, is_embedding: bool = False) -> dict[str, torch.Tensor]:
        """{ours.weight, ours.bias (a linear's), ours.lora_a, ours.lora_b (an adapted one's)}."""
        if f"{theirs}.weight" in self.weights:  # not a parametrization: no adapters
            state = {f"{ours}.weight": self.weights[f"{theirs}.weight"]}
        else:
            state = {f"{ours}.weight": take(self.weights, theirs + _ORIGINAL)}
            a, b = take(self.weights, f"{theirs}{_LORA}A"), take(self.weights, f"{theirs}{_LORA}B")
            side_by_side = side_by_side_embedding if is_embedding else side_by_side_linear
            state[f"{ours}.lora_a"], state[f"{ours}.lora_b"] = side_by_side(a, b, self.scaling)
        if not is_embedding:
            state[f"{ours}.bias"] = take(self.weights, f"{theirs}.bias")
        return state


def jina_v3_state(
    weights: dict[str, torch.Tensor], config: dict[str, Any], shape: RotaryEncoderShape
) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under RotaryEncoder's names, every task's factors beside the weights."""
    checkpoint = _Checkpoint(weights, config)
    state = checkpoint.module("word_embeddings", "embeddings.word_embeddings", is_embedding=True)
    state |= {
        "embed_norm.weight": take(weights, "emb_ln.weight"),
        "embed_norm.bias": take(weights, "emb_ln.bias"),
    }
    if shape.type_vocab_size:
        types = checkpoint.module(
            "token_type_embeddings", "embeddings.token_type_embeddings", is_embedding=True
        )
        state |= types
    for i in range(shape.num_layers):
        hf, ours = f"encoder.layers.{i}.", f"layers.{i}."
        state |= checkpoint.module(ours + "qkv", hf + "mixer.Wqkv")
        state |= checkpoint.module(ours + "attn_out", hf + "mixer.out_proj")
        state |= checkpoint.module(ours + "mlp.up", hf + "mlp.fc1")
        state |= checkpoint.module(ours + "mlp.down", hf + "mlp.fc2")
        state |= linear_state(weights, ours + "attn_norm", hf + "norm1", True)
        state |= linear_state(weights, ours + "mlp_norm", hf + "norm2", True)
    return state


def _adapt(encoder: RotaryEncoder, tasks: TaskMask) -> None:
    """Swap the encoder's linears and embedding tables for task-adapted ones (layers/lora.py)."""

    def linear(old: nn.Linear) -> TaskLoRALinear:
        return TaskLoRALinear(old.in_features, old.out_features, old.bias is not None, tasks)

    def embedding(old: nn.Embedding) -> TaskLoRAEmbedding:
        return TaskLoRAEmbedding(old.num_embeddings, old.embedding_dim, tasks)

    encoder.word_embeddings = embedding(encoder.word_embeddings)
    if encoder.token_type_embeddings is not None:
        encoder.token_type_embeddings = embedding(encoder.token_type_embeddings)
    for layer in encoder.layers:
        assert isinstance(layer, RotaryEncoderLayer) and isinstance(layer.mlp, DenseMLP)
        layer.qkv, layer.attn_out = linear(layer.qkv), linear(layer.attn_out)
        layer.mlp.up, layer.mlp.down = linear(layer.mlp.up), linear(layer.mlp.down)


class JinaTaskEmbedder(RotaryEmbedder):
    """A jina-embeddings-v3 embedder serving every task adapter: each sequence's task is its token
    type ids (0: `default`, the deployment's; t + 1: task t)."""

    def __init__(
        self, shape: RotaryEncoderShape, attend: Attention, pooling: str, tasks: tuple[str, ...], default: str
    ) -> None:
        super().__init__(shape, attend, pooling)
        self.tasks = TaskMask(len(tasks), 1)  # the rank is set by the checkpoint (load)
        self.task_names = tasks
        self.default_task = tasks.index(default) if default else -1

    def load(self, state: dict[str, torch.Tensor]) -> None:
        rank = state["word_embeddings.lora_a"].shape[1] // len(self.task_names)
        self.tasks.rank = rank
        _adapt(self.encoder, self.tasks)
        self.encoder.load(state)

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        chosen = torch.where(token_type_ids == 0, self.default_task, token_type_ids - 1)
        self.tasks.select(chosen, self.encoder.embed_norm.weight.dtype)
        hidden: torch.Tensor = self.encoder(input_ids, position_ids, torch.zeros_like(token_type_ids), meta)
        return hidden


def build_jina_v3(
    model_dir: ModelDir, weights: dict[str, torch.Tensor], attend: Attention, pooling: str
) -> RotaryEmbedder:
    """A jina-embeddings-v3 embedder, on the CPU: with every task adapter where the checkpoint has them."""
    shape = jina_v3_shape(model_dir.config)
    tasks = check_tasks(weights, model_dir.config, model_dir.adapter)
    state = jina_v3_state(weights, model_dir.config, shape)
    if not tasks:
        model = RotaryEmbedder(shape, attend, pooling)
        model.encoder.load(state)
        return model
    adapted = JinaTaskEmbedder(shape, attend, pooling, tasks, model_dir.adapter)
    adapted.load(state)
    default = model_dir.adapter or "none: the base weights, as its encode without a task"
    log.info(
        "jina-embeddings-v3: task adapters %s, each request's own; default %s", ", ".join(tasks), default
    )
    return adapted
