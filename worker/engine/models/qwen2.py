"""Qwen2 decoders (gte-Qwen2-*-instruct, stella_en_*_v5; mxbai-rerank-v2 through llm_reranker.py):
the shared decoder (decoder.py) with biases on the q, k and v projections (always, as
transformers' Qwen2Attention has them), none on the output projection or the MLP, and no q/k norm.

Attention is causal as transformers' Qwen2Model runs it, unless config.json says otherwise
(`is_causal: false`, which transformers >= 5.2 honours, or `use_bidirectional_attention: true`:
decoder.py's `is_bidirectional`). gte-Qwen2 and stella ship their own modeling code (`auto_map`);
kembed runs its own, as transformers' Qwen2Model would, so a checkpoint whose custom code turns
causality off must say so in config.json.
"""

from typing import Any

from kembed.worker.engine.models.decoder import DecoderShape, is_bidirectional, read_shape
from kembed.worker.errors import InvalidInput

QWEN2_FAMILY = ("qwen2",)


def qwen2_shape(config: dict[str, Any]) -> DecoderShape:
    """The network a Qwen2 config.json describes; InvalidInput for a setting kembed does not implement."""
    model_type = config.get("model_type", "")
    if model_type not in QWEN2_FAMILY:
        raise InvalidInput(f"model_type {model_type!r} is not a Qwen2 decoder {QWEN2_FAMILY}")
    return read_shape(config, "Qwen2", qkv_bias=True, o_bias=False, is_causal=not is_bidirectional(config))
