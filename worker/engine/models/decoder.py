"""Llama-style decoder blocks over packed ragged batches: the network of Qwen3, Qwen2, Mistral and
EuroBERT (and of the LLM rerankers built on them), each family a `DecoderShape` read from its
config.json.

Our own model code, not transformers' (that is the reference in tests). As in `bert.py`, the tokens
of all sequences form one [num_tokens, hidden] matrix and only attention sees sequence boundaries.
A layer is pre-norm: RMSNorm, attention with rotary positions (grouped-query, causal or
bidirectional as the shape says; Qwen3 normalises q and k per head before RoPE), RMSNorm, SwiGLU.
What differs between families is a knob of the shape: biases on q/k/v, on the output projection,
on the MLP; the per-head q/k norm; causality; a sliding window (Mistral's: every layer's). At load
time Q, K and V are fused into one matmul and so are the MLP's gate and up projections. On CUDA the
fused kernels (fused_decoder.py) run the norms, RoPE and the SiLU gate; with fp8 linears
(`--linear-dtype fp8`, fp8.py) the norms and gate hand the GEMMs their input quantised
(`forward_fp8`). There is no LM head here: embedders pool the final hidden states
(`tie_word_embeddings` and any `lm_head.weight` are ignored) and the LLM rerankers take two of its
rows (llm_reranker.py).
"""

from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from kembed.worker.engine.kernels.fp8 import activation_quantize, fp8_linear, is_quantized
from kembed.worker.engine.kernels.fused_decoder import (
    can_fuse,
    qk_norm_rope,
    rms_norm,
    rms_norm_fp8,
    silu_mul,
)
from kembed.worker.engine.layers.attention import Attention, AttentionMetadata, AttentionShape
from kembed.worker.engine.layers.norms import RMSNorm
from kembed.worker.engine.layers.rope import RotaryEmbedding, rotate
from kembed.worker.engine.models.model_dir import ModelDir
from kembed.worker.engine.models.served import PooledEmbedder
from kembed.worker.errors import InvalidInput


@dataclass(frozen=True)
class DecoderShape:
    """The config.json fields that shape a decoder network, and the family's knobs."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    qkv_bias: bool  # q/k/v projections have biases (Qwen2 always; Qwen3 and EuroBERT: attention_bias)
    o_bias: bool  # the attention output projection has one
    is_causal: bool
    has_qk_norm: bool = False  # Qwen3's per-head RMSNorm of q and k before RoPE
    mlp_bias: bool = False  # EuroBERT's mlp_bias
    window: int | None = None  # keys before each query every layer sees (Mistral's sliding window); None: all

    @property
    def max_sequence_length(self) -> int:
        return self.max_position_embeddings

    @property
    def attention(self) -> AttentionShape:
        return AttentionShape(
            self.num_heads, self.num_kv_heads, self.head_dim, self.is_causal, window=self.window
        )


def read_shape(config: dict[str, Any], family: str, **knobs: Any) -> DecoderShape:
    """The `DecoderShape` of a Llama-style config.json; `knobs` are the family's own fields (biases,
    q/k norm, causality, a window). InvalidInput names a setting kembed does not implement: a sliding
    window the family's reader did not take (`window` among the knobs: Mistral's)."""
    if config.get("hidden_act", "silu") != "silu":
        raise InvalidInput(f"unsupported hidden_act {config['hidden_act']!r} ({family} uses silu)")
    has_window = config.get("use_sliding_window") or "sliding_attention" in (config.get("layer_types") or ())
    if has_window and "window" not in knobs:
        raise InvalidInput(f"{family}: sliding-window attention is not supported")
    # transformers >= 5 writes `rope_parameters`; older configs `rope_theta` and `rope_scaling`.
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise InvalidInput(f"{family}: rope type {rope_type!r} is not supported (only unscaled RoPE)")
    num_heads = config["num_attention_heads"]
    num_kv_heads = config.get("num_key_value_heads") or num_heads
    head_dim = config.get("head_dim") or config["hidden_size"] // num_heads
    if num_heads % num_kv_heads or head_dim % 2:
        raise InvalidInput(f"bad attention shape: {num_heads} heads, {num_kv_heads} kv heads, {head_dim=}")
    return DecoderShape(
        vocab_size=config["vocab_size"],
        hidden_size=config["hidden_size"],
        num_layers=config["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        intermediate_size=config["intermediate_size"],
        max_position_embeddings=config["max_position_embeddings"],
        rms_norm_eps=config.get("rms_norm_eps", 1e-6),
        rope_theta=float(rope.get("rope_theta", config.get("rope_theta", 10000.0))),
        **knobs,
    )


def is_bidirectional(config: dict[str, Any]) -> bool:
    """Whether a decoder checkpoint was trained with bidirectional attention.

    Spellings seen in the wild: pplx-embed-v1 (`model_type: bidirectional_pplx_qwen3`, whose remote
    code turns causality off in every layer, and `use_bidirectional_attention: true`), EmbeddingGemma
    (`use_bidirectional_attention: true`), Gemma 4 (`use_bidirectional_attention: "all"`; "vision"
    means images only, so text stays causal) and a plain `is_causal: false` (transformers >= 5.2
    reads it for every decoder: gte-Qwen2's bidirectional attention is said so)."""
    return (
        config.get("model_type") == "bidirectional_pplx_qwen3"
        or config.get("use_bidirectional_attention") in (True, "all")
        or config.get("is_causal") is False
    )


_BIDIRECTIONAL_FLAGS = (
    ("model_type", "bidirectional_pplx_qwen3"),
    ("use_bidirectional_attention", True),
    ("use_bidirectional_attention", "all"),
    ("is_causal", False),
)


def attention_pattern(config: dict[str, Any], shape: DecoderShape) -> str:
    """What check-model says of a decoder's attention: causal, or bidirectional and why."""
    if shape.is_causal:
        return "causal"
    for key, value in _BIDIRECTIONAL_FLAGS:
        if config.get(key) == value and type(config.get(key)) is type(value):
            return f"bidirectional (config.json {key}: {value!r})"
    return "bidirectional (the family is an encoder)"


class DecoderLayer(nn.Module):
    FP8_LINEARS = ("qkv", "o_proj", "gate_up", "down")  # what `--linear-dtype fp8` quantises

    def __init__(self, shape: DecoderShape, attend: Attention) -> None:
        super().__init__()
        hidden, head_dim = shape.hidden_size, shape.head_dim
        q_size, kv_size = shape.num_heads * head_dim, shape.num_kv_heads * head_dim
        self.input_norm = RMSNorm(hidden, shape.rms_norm_eps)
        self.qkv = nn.Linear(hidden, q_size + 2 * kv_size, bias=shape.qkv_bias)
        # per head, before RoPE (Qwen3); None where the family has none
        self.q_norm = RMSNorm(head_dim, shape.rms_norm_eps) if shape.has_qk_norm else None
        self.k_norm = RMSNorm(head_dim, shape.rms_norm_eps) if shape.has_qk_norm else None
        self.o_proj = nn.Linear(q_size, hidden, bias=shape.o_bias)
        self.post_attn_norm = RMSNorm(hidden, shape.rms_norm_eps)
        self.gate_up = nn.Linear(hidden, 2 * shape.intermediate_size, bias=shape.mlp_bias)
        self.down = nn.Linear(shape.intermediate_size, hidden, bias=shape.mlp_bias)
        self.qkv_sizes = (q_size, kv_size, kv_size)
        self.num_heads, self.num_kv_heads, self.head_dim = shape.num_heads, shape.num_kv_heads, head_dim
        self.is_causal = shape.is_causal
        self.window = shape.window
        self.attend = attend

    def forward(
        self,
        x: torch.Tensor,  # [num_tokens, hidden]
        cos: torch.Tensor,  # [num_tokens, 1, head_dim/2]
        sin: torch.Tensor,  # [num_tokens, 1, head_dim/2]
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [num_tokens, hidden]
        """The plain-torch layer: the CPU path, and the reference of the fused one."""
        num_tokens = x.shape[0]
        q, k, v = self.qkv(self.input_norm(x)).split(self.qkv_sizes, dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        attn = self.attend(q, k, v, meta, self.is_causal, self.window)  # [tokens, heads, head_dim]
        x = x + self.o_proj(attn.reshape(num_tokens, -1))
        gate, up = self.gate_up(self.post_attn_norm(x)).chunk(2, dim=-1)
        out: torch.Tensor = x + self.down(F.silu(gate) * up)
        return out

    def _qk(
        self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k of the fused qkv rows, normalised (where the family does) and rotated: one kernel."""
        q_weight = None if self.q_norm is None else self.q_norm.weight
        k_weight = None if self.k_norm is None else self.k_norm.weight
        eps = self.input_norm.eps
        return qk_norm_rope(qkv, q_weight, k_weight, eps, cos, sin, self.num_heads, self.num_kv_heads)

    def forward_fused(
        self,
        x: torch.Tensor,  # [num_tokens, hidden]: the residual stream
        delta: torch.Tensor | None,  # [num_tokens, hidden]: the previous layer's MLP output, not yet added
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The same layer in ten kernels on CUDA (fused_decoder.py); returns (residual stream, this
        layer's MLP output), which the next layer adds inside its input norm."""
        num_tokens, eps = x.shape[0], self.input_norm.eps
        h, x = rms_norm(x, self.input_norm.weight, eps, residual=delta)
        qkv = self.qkv(h)
        q, k = self._qk(qkv, cos, sin)
        v = qkv[:, -self.qkv_sizes[2] :].view(num_tokens, self.num_kv_heads, self.head_dim)
        attn = self.attend(q, k, v, meta, self.is_causal, self.window)  # [tokens, heads, head_dim]
        h, x = rms_norm(
            self.o_proj(attn.reshape(num_tokens, -1)), self.post_attn_norm.weight, eps, residual=x
        )
        return x, self.down(silu_mul(self.gate_up(h)))

    def forward_fp8(
        self,
        x: torch.Tensor,
        delta: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward_fused` with fp8 linears: each GEMM's input comes quantised from the kernel that
        made it (the norms, the SiLU gate; attention's output is quantised on its own)."""
        num_tokens, eps = x.shape[0], self.input_norm.eps
        hq, x = rms_norm_fp8(x, self.input_norm.weight, eps, residual=delta)
        qkv = fp8_linear(self.qkv).mm(hq)
        q, k = self._qk(qkv, cos, sin)
        v = qkv[:, -self.qkv_sizes[2] :].view(num_tokens, self.num_kv_heads, self.head_dim)
        attn = self.attend(q, k, v, meta, self.is_causal, self.window)  # [tokens, heads, head_dim]
        hq, x = rms_norm_fp8(
            fp8_linear(self.o_proj)(attn.reshape(num_tokens, -1)), self.post_attn_norm.weight, eps, residual=x
        )
        gated = activation_quantize(fp8_linear(self.gate_up).mm(hq), "silu_mul")
        return x, fp8_linear(self.down).mm(gated)


class Decoder(nn.Module):
    """Token embeddings + decoder layers + final norm; returns the last hidden state of every token."""

    def __init__(self, shape: DecoderShape, attend: Attention) -> None:
        super().__init__()
        self.shape = shape
        self.embed_tokens = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.rope = RotaryEmbedding(shape.head_dim, shape.max_position_embeddings, shape.rope_theta)
        self.layers = nn.ModuleList(DecoderLayer(shape, attend) for _ in range(shape.num_layers))
        self.norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)

    def forward(
        self,
        input_ids: torch.Tensor,  # [num_tokens]
        position_ids: torch.Tensor,  # [num_tokens], 0-based within each sequence
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        cos, sin = self.rope(position_ids)
        if can_fuse(x, self.shape.head_dim):
            delta: torch.Tensor | None = None
            is_fp8 = is_quantized(self.layers[0])
            for fused_layer in cast("list[DecoderLayer]", self.layers):
                run = fused_layer.forward_fp8 if is_fp8 else fused_layer.forward_fused
                x, delta = run(x, delta, cos, sin, meta)
            assert delta is not None, "a model has layers"
            return rms_norm(delta, self.norm.weight, self.norm.eps, residual=x)[0]
        for layer in self.layers:
            x = layer(x, cos, sin, meta)
        out: torch.Tensor = self.norm(x)  # [num_tokens, hidden]
        return out

    def load_hf_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Load a transformers Llama-style state dict (Qwen3Model, Qwen2Model, EuroBertModel; a task
        head's `model.` prefix stripped), fusing Q/K/V and gate/up. Other keys (`lm_head.weight`)
        are not the decoder's and are left alone."""
        shape = self.shape
        state = {"embed_tokens.weight": weights["embed_tokens.weight"], "norm.weight": weights["norm.weight"]}
        for i in range(shape.num_layers):
            hf, ours = f"layers.{i}.", f"layers.{i}."
            for kind, is_there in (("weight", True), ("bias", shape.qkv_bias)):
                if is_there:
                    state[f"{ours}qkv.{kind}"] = torch.cat(
                        [weights[f"{hf}self_attn.{name}_proj.{kind}"] for name in ("q", "k", "v")]
                    )
            for kind, is_there in (("weight", True), ("bias", shape.o_bias)):
                if is_there:
                    state[f"{ours}o_proj.{kind}"] = weights[f"{hf}self_attn.o_proj.{kind}"]
            for kind, is_there in (("weight", True), ("bias", shape.mlp_bias)):
                if is_there:
                    state[f"{ours}gate_up.{kind}"] = torch.cat(
                        [weights[f"{hf}mlp.gate_proj.{kind}"], weights[f"{hf}mlp.up_proj.{kind}"]]
                    )
                    state[f"{ours}down.{kind}"] = weights[f"{hf}mlp.down_proj.{kind}"]
            norms = [("input_norm", "input_layernorm"), ("post_attn_norm", "post_attention_layernorm")]
            if shape.has_qk_norm:
                norms += [("q_norm", "self_attn.q_norm"), ("k_norm", "self_attn.k_norm")]
            for ours_norm, hf_norm in norms:
                state[f"{ours}{ours_norm}.weight"] = weights[f"{hf}{hf_norm}.weight"]
        self.load_state_dict(state, strict=True)


class DecoderEmbedder(PooledEmbedder):
    """A decoder + sentence-transformers pooling (last token for Qwen3-Embedding and gte-Qwen2, mean
    for pplx-embed and EuroBERT)."""

    def __init__(self, shape: DecoderShape, attend: Attention, pooling: str) -> None:
        super().__init__(pooling, shape.hidden_size, shape.max_sequence_length, shape.vocab_size)
        self.decoder = Decoder(shape, attend)

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        hidden: torch.Tensor = self.decoder(input_ids, position_ids, meta)  # token types: decoders have none
        return hidden


def decoder_pooling(model_dir: ModelDir, shape: DecoderShape) -> str:
    """The directory's sentence-transformers pooling; without modules.json, the last token for a causal
    model (only it has seen the whole sequence) and the mean for a bidirectional one."""
    if model_dir.pooling is not None:  # the directory's pipeline, or the deployment's override
        return model_dir.pooling
    return "last" if shape.is_causal else "mean"
