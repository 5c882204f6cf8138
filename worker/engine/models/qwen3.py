"""Qwen3 decoder embedders (Qwen3-Embedding, pplx-embed-v1) over packed ragged batches.

Our own model code, not `transformers.Qwen3Model` (that is the reference in tests). As in `bert.py`,
the tokens of all sequences form one [num_tokens, hidden] matrix and only attention sees sequence
boundaries. At load time Q, K and V are fused into one matmul and so are the MLP's gate and up
projections. Attention is causal, as Qwen3 was trained, unless the config asks for bidirectional
attention (pplx-embed-v1: `bidirectional_pplx_qwen3`, `use_bidirectional_attention: true`).
With fp8 linears (`--linear-dtype fp8`, fp8.py) the fused path's norms and SiLU gate hand the GEMMs
their input quantised (`forward_fp8`).
There is no LM head: embedders pool the final hidden states, so `tie_word_embeddings` and any
`lm_head.weight` in the checkpoint are ignored.
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
from kembed.worker.engine.layers.attention import Attention, AttentionMetadata
from kembed.worker.engine.layers.rope import RotaryEmbedding, rotate
from kembed.worker.engine.models.model_dir import ModelDir, load_weights
from kembed.worker.engine.models.served import PooledEmbedder
from kembed.worker.errors import InvalidInput

QWEN3_FAMILY = ("qwen3", "bidirectional_pplx_qwen3")


@dataclass(frozen=True)
class Qwen3Shape:
    """The config.json fields that shape the network."""

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
    attention_bias: bool
    is_causal: bool
    has_qk_norm: bool = True  # per-head q/k RMSNorms before RoPE (Qwen3's; Mistral has none)
    window: int | None = None  # keys before each query a layer sees (mistral.py); None: all

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "Qwen3Shape":
        model_type = config.get("model_type", "")
        if model_type not in QWEN3_FAMILY:
            raise InvalidInput(f"model_type {model_type!r} is not a Qwen3 decoder {QWEN3_FAMILY}")
        if config.get("use_sliding_window") or "sliding_attention" in config.get("layer_types", ()):
            raise InvalidInput("sliding-window attention is not supported")
        return cls.decoder_fields(config)

    @classmethod
    def decoder_fields(cls, config: dict[str, Any], **fields: Any) -> "Qwen3Shape":
        """The fields every Llama-style decoder config spells alike, checked; `fields` the rest."""
        if config.get("hidden_act", "silu") != "silu":
            raise InvalidInput(
                f"unsupported hidden_act {config['hidden_act']!r} (a SwiGLU decoder uses silu)"
            )
        # transformers >= 5 writes `rope_parameters`; older configs `rope_theta` and `rope_scaling`.
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise InvalidInput(f"rope type {rope_type!r} is not supported (only unscaled RoPE)")
        num_heads = config["num_attention_heads"]
        num_kv_heads = config.get("num_key_value_heads") or num_heads
        head_dim = config.get("head_dim") or config["hidden_size"] // num_heads
        if num_heads % num_kv_heads or head_dim % 2:
            raise InvalidInput(
                f"bad attention shape: {num_heads} heads, {num_kv_heads} kv heads, {head_dim=}"
            )
        return cls(
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
            attention_bias=bool(config.get("attention_bias", False)),
            is_causal=not is_bidirectional(config),
            **fields,
        )

    @property
    def max_sequence_length(self) -> int:
        return self.max_position_embeddings


def is_bidirectional(config: dict[str, Any]) -> bool:
    """Whether the checkpoint was trained with bidirectional attention.

    Spellings seen in the wild: pplx-embed-v1 (`model_type: bidirectional_pplx_qwen3`, whose remote
    code turns causality off in every layer, and `use_bidirectional_attention: true`), EmbeddingGemma
    (`use_bidirectional_attention: true`), Gemma 4 (`use_bidirectional_attention: "all"`; "vision"
    means images only, so text stays causal) and a plain `is_causal: false`."""
    return (
        config.get("model_type") == "bidirectional_pplx_qwen3"
        or config.get("use_bidirectional_attention") in (True, "all")
        or config.get("is_causal") is False
    )


class RMSNorm(nn.Module):
    """Qwen3's RMSNorm: normalised in float32 whatever the model dtype, as transformers does, because
    a bfloat16 mean of squares over 1024 channels loses too many digits."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class Qwen3Layer(nn.Module):
    FP8_LINEARS = ("qkv", "o_proj", "gate_up", "down")  # what `--linear-dtype fp8` quantises

    def __init__(self, shape: Qwen3Shape, attend: Attention) -> None:
        super().__init__()
        hidden, head_dim = shape.hidden_size, shape.head_dim
        q_size, kv_size = shape.num_heads * head_dim, shape.num_kv_heads * head_dim
        self.input_norm = RMSNorm(hidden, shape.rms_norm_eps)
        self.qkv = nn.Linear(hidden, q_size + 2 * kv_size, bias=shape.attention_bias)
        # per head, before RoPE; a decoder without them (Mistral) rotates q and k as they come
        self.q_norm = RMSNorm(head_dim, shape.rms_norm_eps) if shape.has_qk_norm else None
        self.k_norm = RMSNorm(head_dim, shape.rms_norm_eps) if shape.has_qk_norm else None
        self.o_proj = nn.Linear(q_size, hidden, bias=shape.attention_bias)
        self.post_attn_norm = RMSNorm(hidden, shape.rms_norm_eps)
        self.gate_up = nn.Linear(hidden, 2 * shape.intermediate_size, bias=False)
        self.down = nn.Linear(shape.intermediate_size, hidden, bias=False)
        self.qkv_sizes = (q_size, kv_size, kv_size)
        self.num_heads, self.num_kv_heads, self.head_dim = shape.num_heads, shape.num_kv_heads, head_dim
        self.is_causal = shape.is_causal
        self.window = shape.window
        self.attend = attend

    def _rotated_qk(
        self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, fused: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k of the fused projection, per head: normalised (where the model has q/k norms) and
        rotated; `fused`: in one kernel (CUDA), else in plain torch."""
        num_tokens = qkv.shape[0]
        if fused and self.q_norm is not None and self.k_norm is not None:
            return qk_norm_rope(
                qkv, self.q_norm.weight, self.k_norm.weight, self.q_norm.eps, cos, sin,
                self.num_heads, self.num_kv_heads,
            )  # fmt: skip
        q, k, _ = qkv.split(self.qkv_sizes, dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return rotate(q, cos, sin), rotate(k, cos, sin)

    def forward(
        self,
        x: torch.Tensor,  # [num_tokens, hidden]
        cos: torch.Tensor,  # [num_tokens, 1, head_dim/2]
        sin: torch.Tensor,  # [num_tokens, 1, head_dim/2]
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [num_tokens, hidden]
        """The plain-torch layer: the CPU path, and the reference of the fused one."""
        num_tokens = x.shape[0]
        qkv = self.qkv(self.input_norm(x))
        q, k = self._rotated_qk(qkv, cos, sin, fused=False)
        v = qkv[:, -self.qkv_sizes[2] :].view(num_tokens, self.num_kv_heads, self.head_dim)
        attn = self.attend(q, k, v, meta, self.is_causal, self.window)  # [num_tokens, num_heads, head_dim]
        x = x + self.o_proj(attn.reshape(num_tokens, -1))
        gate, up = self.gate_up(self.post_attn_norm(x)).chunk(2, dim=-1)
        out: torch.Tensor = x + self.down(F.silu(gate) * up)
        return out

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
        q, k = self._rotated_qk(qkv, cos, sin, fused=True)
        v = qkv[:, -self.qkv_sizes[2] :].view(num_tokens, self.num_kv_heads, self.head_dim)
        attn = self.attend(q, k, v, meta, self.is_causal, self.window)  # [num_tokens, num_heads, head_dim]
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
        q, k = self._rotated_qk(qkv, cos, sin, fused=True)
        v = qkv[:, -self.qkv_sizes[2] :].view(num_tokens, self.num_kv_heads, self.head_dim)
        attn = self.attend(q, k, v, meta, self.is_causal, self.window)  # [num_tokens, num_heads, head_dim]
        hq, x = rms_norm_fp8(
            fp8_linear(self.o_proj)(attn.reshape(num_tokens, -1)), self.post_attn_norm.weight, eps, residual=x
        )
        gated = activation_quantize(fp8_linear(self.gate_up).mm(hq), "silu_mul")
        return x, fp8_linear(self.down).mm(gated)


class Qwen3Decoder(nn.Module):
    """Token embeddings + decoder layers + final norm; returns the last hidden state of every token."""

    def __init__(self, shape: Qwen3Shape, attend: Attention) -> None:
        super().__init__()
        self.shape = shape
        self.embed_tokens = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.rope = RotaryEmbedding(shape.head_dim, shape.max_position_embeddings, shape.rope_theta)
        self.layers = nn.ModuleList(Qwen3Layer(shape, attend) for _ in range(shape.num_layers))
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
            for fused_layer in cast("list[Qwen3Layer]", self.layers):
                run = fused_layer.forward_fp8 if is_fp8 else fused_layer.forward_fused
                x, delta = run(x, delta, cos, sin, meta)
            assert delta is not None, "a model has layers"
            return rms_norm(delta, self.norm.weight, self.norm.eps, residual=x)[0]
        for layer in self.layers:
            x = layer(x, cos, sin, meta)
        out: torch.Tensor = self.norm(x)  # [num_tokens, hidden]
        return out

    def load_hf_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Load a transformers Qwen3Model state dict (prefix-stripped), fusing Q/K/V and gate/up."""
        state = {"embed_tokens.weight": weights["embed_tokens.weight"], "norm.weight": weights["norm.weight"]}
        kinds = ("weight", "bias") if self.shape.attention_bias else ("weight",)
        for i in range(self.shape.num_layers):
            hf, ours = f"layers.{i}.", f"layers.{i}."
            for kind in kinds:
                state[f"{ours}qkv.{kind}"] = torch.cat(
                    [weights[f"{hf}self_attn.{name}_proj.{kind}"] for name in ("q", "k", "v")]
                )
                state[f"{ours}o_proj.{kind}"] = weights[f"{hf}self_attn.o_proj.{kind}"]
            state[f"{ours}gate_up.weight"] = torch.cat(
                [weights[f"{hf}mlp.gate_proj.weight"], weights[f"{hf}mlp.up_proj.weight"]]
            )
            state[f"{ours}down.weight"] = weights[f"{hf}mlp.down_proj.weight"]
            qk_norms = (("q_norm", "self_attn.q_norm"), ("k_norm", "self_attn.k_norm"))
            for ours_norm, hf_norm in (
                ("input_norm", "input_layernorm"),
                ("post_attn_norm", "post_attention_layernorm"),
                *(qk_norms if self.shape.has_qk_norm else ()),
            ):
                state[f"{ours}{ours_norm}.weight"] = weights[f"{hf}{hf_norm}.weight"]
        self.load_state_dict(state, strict=True)


class Qwen3Embedder(PooledEmbedder):
    """Qwen3 decoder + sentence-transformers pooling (last token for Qwen3-Embedding, mean for pplx)."""

    def __init__(self, shape: Qwen3Shape, attend: Attention, pooling: str) -> None:
        super().__init__(pooling, shape.hidden_size, shape.max_sequence_length, shape.vocab_size)
        self.decoder = Qwen3Decoder(shape, attend)

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        hidden: torch.Tensor = self.decoder(input_ids, position_ids, meta)  # token types: Qwen3 has none
        return hidden


def build_qwen3(model_dir: ModelDir, attend: Attention) -> Qwen3Embedder:
    """A Qwen3 embedder for `model_dir`, weights loaded, on the CPU."""
    shape = Qwen3Shape.from_config(model_dir.config)
    model = Qwen3Embedder(shape, attend, qwen3_pooling(model_dir, shape))
    model.decoder.load_hf_weights(load_weights(model_dir.path))
    return model


def qwen3_pooling(model_dir: ModelDir, shape: Qwen3Shape) -> str:
    """The directory's sentence-transformers pooling; without modules.json, the last token for a causal
    model (only it has seen the whole sequence) and the mean for a bidirectional one."""
    if model_dir.pooling is not None:  # the directory's pipeline, or the deployment's override
        return model_dir.pooling
    return "last" if shape.is_causal else "mean"
