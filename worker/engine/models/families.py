"""Which network a model directory builds: the dispatch over served families.

Every family implements `ServedModel` (served.py); a new family is a module plus a branch here. The
decoder families (Qwen3, Qwen2, EuroBERT) are each a reader of config.json into a `DecoderShape`
(decoder.py), listed in DECODERS.
"""

from collections.abc import Callable
from typing import Any

from kembed.worker.engine.layers.attention import Attention, AttentionShape
from kembed.worker.engine.models.bert import BERT_FAMILY, BertEmbedder, BertShape
from kembed.worker.engine.models.cross_encoder import BertCrossEncoder
from kembed.worker.engine.models.decoder import DecoderEmbedder, DecoderShape, decoder_pooling
from kembed.worker.engine.models.eurobert import EUROBERT_FAMILY, eurobert_shape
from kembed.worker.engine.models.heads import M3Heads
from kembed.worker.engine.models.llm_reranker import LogitScorer
from kembed.worker.engine.models.model_dir import ModelDir, load_weights
from kembed.worker.engine.models.qwen2 import QWEN2_FAMILY, qwen2_shape
from kembed.worker.engine.models.qwen3 import QWEN3_FAMILY, qwen3_shape
from kembed.worker.engine.models.served import PooledEmbedder, ServedModel
from kembed.worker.engine.models.splade import SpladeEmbedder
from kembed.worker.errors import InvalidInput

# model_type -> (family, the reader of its config.json)
DECODERS: dict[str, tuple[str, Callable[[dict[str, Any]], DecoderShape]]] = {
    **{model_type: ("qwen3", qwen3_shape) for model_type in QWEN3_FAMILY},
    **{model_type: ("qwen2", qwen2_shape) for model_type in QWEN2_FAMILY},
    **{model_type: ("eurobert", eurobert_shape) for model_type in EUROBERT_FAMILY},
}
LLM_RERANKER_FAMILIES = ("qwen3", "qwen2")  # causal LMs a LogitScore pipeline is served on
LLM_RERANKER = "llm-reranker"


def family_of(model_dir: ModelDir) -> str:
    """Which served family builds `model_dir`: `cross-encoder` (a BERT-family encoder with a
    sequence-classification head: scores), `llm-reranker` (a Qwen3/Qwen2 causal LM with
    sentence-transformers' LogitScore: scores), `bert`, `qwen3`, `qwen2` or `eurobert` (embedders);
    InvalidInput saying why not."""
    model_type = model_dir.model_type
    architectures = model_dir.config.get("architectures") or ()
    if model_dir.logit_score is not None:
        if DECODERS.get(model_type, ("",))[0] not in LLM_RERANKER_FAMILIES:
            raise InvalidInput(
                f"{model_dir.path}: an LLM reranker (LogitScore) is served on a Qwen3 or Qwen2 causal LM, "
                f"not on model_type {model_type!r}"
            )
        return LLM_RERANKER
    if model_type in BERT_FAMILY and any(a.endswith("ForSequenceClassification") for a in architectures):
        return "cross-encoder"
    if model_type in BERT_FAMILY:
        return "bert"
    if model_type in DECODERS:
        return DECODERS[model_type][0]
    supported = ", ".join((*BERT_FAMILY, *DECODERS))
    custom = model_dir.config.get("auto_map")
    if custom:  # the architecture exists only as the checkpoint's own Python code
        raise InvalidInput(
            f"model_type {model_type!r} is custom code (config.json auto_map: {', '.join(custom)}; "
            "transformers loads it only with trust_remote_code=True): kembed runs its own code for "
            f"the families it serves ({supported}) and never a model's"
        )
    raise InvalidInput(f"model_type {model_type!r} is not supported (supported: {supported})")


def pooling_of(model_dir: ModelDir) -> str:
    """The pooling an embedder of `model_dir` uses: its sentence-transformers pipeline's (or the
    deployment's override), else its family's default; "" for a scorer (a cross-encoder's head reads
    the first token, an LLM reranker's the last)."""
    family = family_of(model_dir)
    if family in ("cross-encoder", LLM_RERANKER):
        return ""
    if model_dir.splade is not None:
        return f"splade {model_dir.splade.pooling}, {model_dir.splade.activation}"
    if family == "bert":
        return model_dir.pooling or "mean"
    return decoder_pooling(model_dir, decoder_shape(model_dir))


def build_model(model_dir: ModelDir, attend: Attention) -> ServedModel:
    """The served network for `model_dir`, weights loaded, on the CPU in the checkpoint's dtype."""
    family = family_of(model_dir)
    if family == "cross-encoder":
        if model_dir.dense:
            raise InvalidInput(f"{model_dir.path} is a cross-encoder with Dense modules in modules.json")
        return BertCrossEncoder.load(model_dir, attend)
    if family == LLM_RERANKER:
        assert model_dir.logit_score is not None
        return LogitScorer.load(model_dir, decoder_shape(model_dir), model_dir.logit_score, attend)
    if model_dir.splade is not None:
        if family != "bert":
            raise InvalidInput(f"{model_dir.path}: a SPLADE model is served on a BERT-family encoder")
        splade = SpladeEmbedder(BertShape.from_config(model_dir.config), attend, model_dir.splade)
        splade.load_hf_weights(load_weights(model_dir.path))
        return splade
    embedder: PooledEmbedder
    if family == "bert":
        embedder = BertEmbedder(BertShape.from_config(model_dir.config), attend, pooling_of(model_dir))
        embedder.encoder.load_hf_weights(load_weights(model_dir.path))
    else:
        decoder = DecoderEmbedder(decoder_shape(model_dir), attend, pooling_of(model_dir))
        decoder.decoder.load_hf_weights(load_weights(model_dir.path))
        embedder = decoder
    embedder.load_dense(model_dir.dense)  # before the move to the device and dtype, as the encoder
    embedder.load_heads(M3Heads.load(model_dir.path, embedder.facts.hidden_size))
    return embedder


def decoder_shape(model_dir: ModelDir) -> DecoderShape:
    """The decoder network of a Qwen3, Qwen2 or EuroBERT directory (InvalidInput for another)."""
    if model_dir.model_type not in DECODERS:
        raise InvalidInput(f"model_type {model_dir.model_type!r} is not a decoder family {tuple(DECODERS)}")
    return DECODERS[model_dir.model_type][1](model_dir.config)


def shape_of(model_dir: ModelDir) -> BertShape | DecoderShape:
    """The config.json fields that shape `model_dir`'s network; InvalidInput for one not served."""
    if model_dir.model_type in DECODERS:
        return decoder_shape(model_dir)
    return BertShape.from_config(model_dir.config)  # raises InvalidInput for an unsupported family


def attention_shape(model_dir: ModelDir) -> AttentionShape:
    """The attention shape of `model_dir`'s network, before building it (for `auto` timing)."""
    shape = shape_of(model_dir)
    if isinstance(shape, DecoderShape):
        return shape.attention
    return AttentionShape(shape.num_heads, shape.num_heads, shape.hidden_size // shape.num_heads, False)
