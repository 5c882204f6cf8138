"""Qwen3 decoders (Qwen3-Embedding, pplx-embed-v1; Qwen3-Reranker through llm_reranker.py): the
shared decoder (decoder.py) with Qwen3's per-head RMSNorm of q and k before RoPE, and biases on all
four attention projections only where `attention_bias` says.

Attention is causal, as Qwen3 was trained, unless the config asks for bidirectional attention
(pplx-embed-v1: `bidirectional_pplx_qwen3`, `use_bidirectional_attention: true`; decoder.py's
`is_bidirectional`).
"""

from typing import Any

from kembed.worker.engine.models.decoder import DecoderShape, is_bidirectional, read_shape
from kembed.worker.errors import InvalidInput

QWEN3_FAMILY = ("qwen3", "bidirectional_pplx_qwen3")


def qwen3_shape(config: dict[str, Any]) -> DecoderShape:
    """The network a Qwen3 config.json describes; InvalidInput for a setting kembed does not implement."""
    model_type = config.get("model_type", "")
    if model_type not in QWEN3_FAMILY:
        raise InvalidInput(f"model_type {model_type!r} is not a Qwen3 decoder {QWEN3_FAMILY}")
    has_bias = bool(config.get("attention_bias", False))
    return read_shape(
        config, "Qwen3",
        qkv_bias=has_bias, o_bias=has_bias, has_qk_norm=True, is_causal=not is_bidirectional(config),
    )  # fmt: skip
