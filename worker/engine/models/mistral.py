"""Mistral decoder embedders (e5-mistral-7b-instruct, SFR-Embedding-Mistral): `MistralModel`, causal,
grouped-query attention, RMSNorm, SwiGLU, rotary positions, and an optional sliding window, pooled at
the last token.

The layers are the shared decoder's (decoder.py) without per-head q/k norms or biases: the same fused
Q/K/V and gate/up projections, the same fused CUDA kernels, the same weight names. With
`sliding_window` w a query sees itself and the w - 1 tokens before it (transformers' `kv > q - w`);
the window is a no-op for sequences of at most w tokens, and kept as given all the same.

The last token is what the pipeline pools: for e5-mistral `</s>`, where its `tokenizer.json`
post-processor appends it. The gateway runs that post-processor (the `tokenizers` library), as
transformers 5 and so sentence-transformers do: both append `</s>` where tokenizer.json says so, and
neither where it does not, whatever tokenizer_config.json's `add_eos_token` says
(tests/worker/test_mistral_matches_sentence_transformers.py).
"""

from typing import Any

from kembed.worker.engine.models.decoder import DecoderShape, read_shape
from kembed.worker.errors import InvalidInput

MISTRAL_FAMILY = ("mistral",)


def mistral_shape(config: dict[str, Any]) -> DecoderShape:
    """The decoder shape of a Mistral config.json; InvalidInput for what is not served."""
    model_type = config.get("model_type", "")
    if model_type not in MISTRAL_FAMILY:
        raise InvalidInput(f"model_type {model_type!r} is not a Mistral decoder {MISTRAL_FAMILY}")
    window = config.get("sliding_window")
    if window is not None and (not isinstance(window, int) or window < 1):
        raise InvalidInput(f"sliding_window {window!r} is not a positive number of tokens")
    return read_shape(
        config, "Mistral",
        qkv_bias=False, o_bias=False, has_qk_norm=False, is_causal=True,
        window=None if window is None else window - 1,
    )  # fmt: skip


def describe_attention(shape: DecoderShape) -> str:
    kind = "causal" if shape.is_causal else "bidirectional"
    if shape.window is None:
        return f"{kind}; every layer global"
    tokens = shape.window + 1
    return f"{kind}; every layer a sliding window of {tokens} tokens (the query and {shape.window} before it)"
