"""EuroBERT encoders (transformers' EuroBertModel): the shared decoder blocks (decoder.py) run
bidirectionally, as a Llama-style encoder: RMSNorm, rotary positions, SwiGLU, biases on the four
attention projections where `attention_bias` says and on the MLP where `mlp_bias` does (EuroBERT's
own checkpoints have neither), no q/k norm. Without a sentence-transformers pipeline it pools the
mean, as every bidirectional decoder does here.
"""

from typing import Any

from kembed.worker.engine.models.decoder import DecoderShape, read_shape
from kembed.worker.errors import InvalidInput

EUROBERT_FAMILY = ("eurobert",)


def eurobert_shape(config: dict[str, Any]) -> DecoderShape:
    """The network a EuroBERT config.json describes; InvalidInput for a setting kembed does not implement."""
    model_type = config.get("model_type", "")
    if model_type not in EUROBERT_FAMILY:
        raise InvalidInput(f"model_type {model_type!r} is not a EuroBERT encoder {EUROBERT_FAMILY}")
    has_bias = bool(config.get("attention_bias", False))
    config = {"rms_norm_eps": 1e-5, **config}  # EuroBertConfig's default, where a config leaves it out
    return read_shape(
        config, "EuroBERT",
        qkv_bias=has_bias, o_bias=has_bias, mlp_bias=bool(config.get("mlp_bias", False)), is_causal=False,
    )  # fmt: skip
