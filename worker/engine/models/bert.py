"""BERT-family encoders (BERT, MiniLM, RoBERTa, XLM-RoBERTa) over packed ragged batches.

Our own model code, not `transformers.AutoModel` (that is the reference in tests). Tokens of all
sequences are packed into one [num_tokens, hidden] matrix; only attention needs sequence boundaries
(`AttentionMetadata`). Q, K and V are fused into one matmul at load time. With fp8 linears
(`--linear-dtype fp8`, fp8.py) the layers pass each activation on quantised by the kernel that
made it (`forward_fp8`).
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from kembed.worker.engine.kernels.fp8 import (
    Fp8Rows,
    activation_quantize,
    fp8_linear,
    is_quantized,
    quantize_rows,
)
from kembed.worker.engine.kernels.fused import add_layer_norm, add_layer_norm_fp8, linear_activation
from kembed.worker.engine.layers.attention import Attention, AttentionMetadata
from kembed.worker.engine.layers.relative_bias import AttentionBias
from kembed.worker.engine.models.served import PooledEmbedder
from kembed.worker.errors import InvalidInput

BERT_FAMILY = ("bert", "roberta", "xlm-roberta")
HIDDEN_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


@dataclass(frozen=True)
class BertShape:
    """The config.json fields that shape the network."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    activation: str
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    position_offset: int  # RoBERTa numbers positions from padding_idx + 1; BERT from 0

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "BertShape":
        model_type = config.get("model_type", "")
        if model_type not in BERT_FAMILY:
            raise InvalidInput(f"model_type {model_type!r} is not a BERT-family encoder {BERT_FAMILY}")
        if config.get("position_embedding_type", "absolute") != "absolute":
            raise InvalidInput("only absolute position embeddings are supported")
        activation = config.get("hidden_act", "gelu")
        if activation not in HIDDEN_ACTIVATIONS:
            raise InvalidInput(f"unsupported hidden_act {activation!r}")
        is_roberta = model_type != "bert"
        return cls(
            vocab_size=config["vocab_size"],
            hidden_size=config["hidden_size"],
            num_layers=config["num_hidden_layers"],
            num_heads=config["num_attention_heads"],
            intermediate_size=config["intermediate_size"],
            activation=activation,
            max_position_embeddings=config["max_position_embeddings"],
            type_vocab_size=config.get("type_vocab_size", 2),
            layer_norm_eps=config.get("layer_norm_eps", 1e-12),
            position_offset=config.get("pad_token_id", 1) + 1 if is_roberta else 0,
        )

    @property
    def max_sequence_length(self) -> int:
        return self.max_position_embeddings - self.position_offset


class BertLayer(nn.Module):
    """A post-LayerNorm encoder layer: attention (with the family's position bias, if any), then the
    activation MLP, each added to its input and normalised (BERT, RoBERTa, MPNet)."""

    FP8_LINEARS = ("qkv", "attn_out", "ffn_in", "ffn_out")  # what `--linear-dtype fp8` quantises

    def __init__(self, shape: BertShape, attend: Attention) -> None:
        super().__init__()
        hidden = shape.hidden_size
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.attn_out = nn.Linear(hidden, hidden)
        self.attn_norm = nn.LayerNorm(hidden, eps=shape.layer_norm_eps)
        self.ffn_in = nn.Linear(hidden, shape.intermediate_size)
        self.ffn_out = nn.Linear(shape.intermediate_size, hidden)
        self.ffn_norm = nn.LayerNorm(hidden, eps=shape.layer_norm_eps)
        self.activation_name = shape.activation
        self.activation = HIDDEN_ACTIVATIONS[shape.activation]
        self.num_heads = shape.num_heads
        self.attend = attend

    def forward(
        self, x: torch.Tensor, meta: AttentionMetadata, bias: AttentionBias | None = None
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        q, k, v = self.qkv(x).view(num_tokens, 3, self.num_heads, -1).unbind(1)
        attn = self.attend(q, k, v, meta, False, bias=self.attention_bias(q, k, bias)).reshape(num_tokens, -1)
        x = add_layer_norm(self.attn_out(attn), x, self.attn_norm)
        hidden = linear_activation(x, self.ffn_in, self.activation_name, self.activation)
        return add_layer_norm(self.ffn_out(hidden), x, self.ffn_norm)

    def attention_bias(
        self, q: torch.Tensor, k: torch.Tensor, bias: AttentionBias | None
    ) -> AttentionBias | None:
        """The bias of this layer's scores: the family's shared one (`bias`), as here, or one the
        layer makes from its q and k [num_tokens, heads, head_dim] (DeBERTa's disentangled terms)."""
        return bias

    def forward_fp8(
        self, x: torch.Tensor, xq: Fp8Rows, meta: AttentionMetadata, bias: AttentionBias | None = None
    ) -> tuple[torch.Tensor, Fp8Rows]:
        """The layer with fp8 linears on CUDA: takes and returns the hidden state both in the model's
        dtype (the residual) and quantised (the next GEMM's input), each made by one kernel."""
        num_tokens = x.shape[0]
        qkv = fp8_linear(self.qkv).mm(xq)
        q, k, v = qkv.view(num_tokens, 3, self.num_heads, -1).unbind(1)
        attn = self.attend(q, k, v, meta, False, bias=self.attention_bias(q, k, bias)).reshape(num_tokens, -1)
        x, xq = add_layer_norm_fp8(fp8_linear(self.attn_out)(attn), x, self.attn_norm)
        hidden = activation_quantize(fp8_linear(self.ffn_in).mm(xq), self.activation_name)
        return add_layer_norm_fp8(fp8_linear(self.ffn_out).mm(hidden), x, self.ffn_norm)


@dataclass(frozen=True)
class LayerNames:
    """Where a post-LayerNorm family's checkpoint keeps one layer's attention tensors, under
    `encoder.layer.{i}.` (the MLP's names, `intermediate.dense`, `output.dense` and
    `output.LayerNorm`, are the same in every such family)."""

    qkv: tuple[str, str, str] = ("attention.self.query", "attention.self.key", "attention.self.value")
    attn_out: str = "attention.output.dense"
    attn_norm: str = "attention.output.LayerNorm"


def layer_state(
    weights: dict[str, torch.Tensor], index: int, prefix: str, names: LayerNames = LayerNames()
) -> dict[str, torch.Tensor]:
    """Layer `index`'s tensors from a transformers state dict, as the `BertLayer` state under
    `prefix` (Q, K and V fused)."""
    hf = f"encoder.layer.{index}."
    state = {}
    for kind in ("weight", "bias"):
        state[f"{prefix}qkv.{kind}"] = torch.cat([weights[f"{hf}{name}.{kind}"] for name in names.qkv])
        state[f"{prefix}attn_out.{kind}"] = weights[f"{hf}{names.attn_out}.{kind}"]
        state[f"{prefix}attn_norm.{kind}"] = weights[f"{hf}{names.attn_norm}.{kind}"]
        state[f"{prefix}ffn_in.{kind}"] = weights[f"{hf}intermediate.dense.{kind}"]
        state[f"{prefix}ffn_out.{kind}"] = weights[f"{hf}output.dense.{kind}"]
        state[f"{prefix}ffn_norm.{kind}"] = weights[f"{hf}output.LayerNorm.{kind}"]
    return state


def run_layers(
    layers: nn.ModuleList, x: torch.Tensor, meta: AttentionMetadata, bias: AttentionBias | None = None
) -> torch.Tensor:
    """`BertLayer`s over the embedded tokens [num_tokens, hidden]: with fp8 linears on CUDA, each
    passing the next its input quantised as well (`forward_fp8`)."""
    if x.is_cuda and is_quantized(layers[0]):
        xq = quantize_rows(x)
        for fp8_layer in cast("list[BertLayer]", layers):
            x, xq = fp8_layer.forward_fp8(x, xq, meta, bias)
        return x
    for layer in layers:
        x = layer(x, meta, bias)
    return x


class BertEncoder(nn.Module):
    """Embeddings + encoder layers; returns the last hidden state of every packed token."""

    def __init__(self, shape: BertShape, attend: Attention) -> None:
        super().__init__()
        self.shape = shape
        self.word_embeddings = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.position_embeddings = nn.Embedding(shape.max_position_embeddings, shape.hidden_size)
        # DistilBERT has no token types (type_vocab_size 0): nothing is added for them
        self.token_type_embeddings = (
            nn.Embedding(shape.type_vocab_size, shape.hidden_size) if shape.type_vocab_size else None
        )
        self.embed_norm = nn.LayerNorm(shape.hidden_size, eps=shape.layer_norm_eps)
        self.layers = nn.ModuleList(BertLayer(shape, attend) for _ in range(shape.num_layers))

    def forward(
        self,
        input_ids: torch.Tensor,  # [num_tokens]
        position_ids: torch.Tensor,  # [num_tokens], 0-based within each sequence
        token_type_ids: torch.Tensor,  # [num_tokens]
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        x: torch.Tensor = self.word_embeddings(input_ids) + self.position_embeddings(
            position_ids + self.shape.position_offset
        )
        if self.token_type_embeddings is not None and self.shape.type_vocab_size == 1:
            # RoBERTa / XLM-R: one type. The edge lets 0 and 1 through (a pair's two segments), and a
            # 1 would index past this table: on a GPU a device-side assert that kills the worker.
            # The one row is every token's, whatever a raw client sent (the gateway sends none).
            x = x + self.token_type_embeddings.weight[0]
        elif self.token_type_embeddings is not None:
            x = x + self.token_type_embeddings(token_type_ids)
        return run_layers(self.layers, self.embed_norm(x), meta)  # [num_tokens, hidden]

    def load_hf_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Load a transformers BertModel/RobertaModel state dict (prefix-stripped), fusing Q/K/V."""
        state = {
            "word_embeddings.weight": weights["embeddings.word_embeddings.weight"],
            "position_embeddings.weight": weights["embeddings.position_embeddings.weight"],
            "embed_norm.weight": weights["embeddings.LayerNorm.weight"],
            "embed_norm.bias": weights["embeddings.LayerNorm.bias"],
        }
        if self.token_type_embeddings is not None:
            state["token_type_embeddings.weight"] = weights["embeddings.token_type_embeddings.weight"]
        for i in range(self.shape.num_layers):
            state.update(layer_state(weights, i, f"layers.{i}."))
        self.load_state_dict(state, strict=True)


class BertEmbedder(PooledEmbedder):
    """BERT-family encoder + sentence-transformers pooling."""

    def __init__(self, shape: BertShape, attend: Attention, pooling: str) -> None:
        super().__init__(pooling, shape.hidden_size, shape.max_sequence_length, shape.vocab_size)
        self.encoder = BertEncoder(shape, attend)

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        hidden: torch.Tensor = self.encoder(input_ids, position_ids, token_type_ids, meta)
        return hidden
