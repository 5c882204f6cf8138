"""Which network a model directory builds: the dispatch over served families.

Every family implements `ServedModel` (served.py); a new family is a module plus a line in a table
here: the encoder embedders in ENCODERS, the Llama-style decoders (each a reader of config.json into
a `DecoderShape`, decoder.py) in DECODERS; the others have a branch of their own.
"""

from collections.abc import Callable
from typing import Any

import torch

from kembed.worker.engine.layers.attention import Attention, AttentionShape
from kembed.worker.engine.layers.relative_bias import DISENTANGLED, DISTANCE
from kembed.worker.engine.models.bert import BERT_FAMILY, BertEmbedder, BertShape
from kembed.worker.engine.models.cross_encoder import BertCrossEncoder
from kembed.worker.engine.models.deberta import (
    DEBERTA_ARCHITECTURE,
    DEBERTA_FAMILY,
    DebertaCrossEncoder,
    DebertaShape,
)
from kembed.worker.engine.models.decoder import (
    DecoderEmbedder,
    DecoderShape,
    attention_pattern,
    decoder_pooling,
)
from kembed.worker.engine.models.distilbert import DISTILBERT_FAMILY, build_distilbert, distilbert_shape
from kembed.worker.engine.models.eurobert import EUROBERT_FAMILY, eurobert_shape
from kembed.worker.engine.models.gemma3 import GEMMA3_FAMILY, Gemma3Shape, build_gemma3, gemma3_pooling
from kembed.worker.engine.models.gte import GTE_FAMILY, build_gte, gte_shape
from kembed.worker.engine.models.heads import M3Heads
from kembed.worker.engine.models.jina_v3 import (
    JINA_V3_FAMILY,
    build_jina_v3,
    is_jina_lora_checkpoint,
    jina_v3_shape,
    tasks_of,
)
from kembed.worker.engine.models.llm_reranker import LogitScorer
from kembed.worker.engine.models.mistral import MISTRAL_FAMILY, mistral_shape
from kembed.worker.engine.models.mistral import describe_attention as describe_decoder_attention
from kembed.worker.engine.models.model_dir import ModelDir, load_weights
from kembed.worker.engine.models.modernbert import (
    MODERNBERT_FAMILY,
    ModernBertCrossEncoder,
    ModernBertShape,
    build_modernbert,
    is_cross_encoder,
)
from kembed.worker.engine.models.mpnet import MPNET_FAMILY, MPNetEmbedder, mpnet_shape
from kembed.worker.engine.models.nomic_bert import NOMIC_FAMILY, build_nomic, nomic_shape
from kembed.worker.engine.models.qwen2 import QWEN2_FAMILY, qwen2_shape
from kembed.worker.engine.models.qwen3 import QWEN3_FAMILY, qwen3_shape
from kembed.worker.engine.models.rotary_bert import RotaryEncoderShape
from kembed.worker.engine.models.served import PooledEmbedder, ServedModel
from kembed.worker.engine.models.splade import SpladeEmbedder
from kembed.worker.engine.models.t5 import T5_FAMILY, T5Embedder, T5Shape
from kembed.worker.errors import InvalidInput

Builder = Callable[[ModelDir, dict[str, torch.Tensor], Attention, str], PooledEmbedder]
Shape = BertShape | DecoderShape | RotaryEncoderShape | T5Shape | DebertaShape | ModernBertShape | Gemma3Shape


def _build_mpnet(
    model_dir: ModelDir, weights: dict[str, torch.Tensor], attend: Attention, pooling: str
) -> PooledEmbedder:
    mpnet = MPNetEmbedder(model_dir.config, attend, pooling)
    mpnet.encoder.load_hf_weights(weights)
    return mpnet


def _build_modernbert(
    model_dir: ModelDir, weights: dict[str, torch.Tensor], attend: Attention, pooling: str
) -> PooledEmbedder:
    return build_modernbert(model_dir, attend, pooling)  # it reads its own weights


def _build_t5(
    model_dir: ModelDir, weights: dict[str, torch.Tensor], attend: Attention, pooling: str
) -> PooledEmbedder:
    t5 = T5Embedder(T5Shape.from_config(model_dir.config), attend, pooling)
    t5.load_hf_weights(weights)
    return t5


class _Encoder:
    """An encoder embedder family: its model_types, config reading, builder and the pooling its
    published pipelines use (the default for a directory without modules.json)."""

    def __init__(
        self,
        model_types: tuple[str, ...],
        shape: Callable[[dict[str, Any]], Shape],
        build: Builder,
        pooling: str,
    ) -> None:
        self.model_types, self.shape, self.build, self.pooling = model_types, shape, build, pooling


# family name -> the encoder embedder families besides BERT's (their names are check-model's)
ENCODERS = {
    "distilbert": _Encoder(DISTILBERT_FAMILY, distilbert_shape, build_distilbert, "mean"),
    "nomic_bert": _Encoder(NOMIC_FAMILY, nomic_shape, build_nomic, "mean"),
    "gte": _Encoder(GTE_FAMILY, gte_shape, build_gte, "cls"),
    "jina_embeddings_v3": _Encoder(JINA_V3_FAMILY, jina_v3_shape, build_jina_v3, "mean"),
    "mpnet": _Encoder(MPNET_FAMILY, mpnet_shape, _build_mpnet, "mean"),
    "t5": _Encoder(T5_FAMILY, T5Shape.from_config, _build_t5, "mean"),
    "modernbert": _Encoder(MODERNBERT_FAMILY, ModernBertShape.from_config, _build_modernbert, "mean"),
}
# model_type -> (family, the reader of its config.json): the Llama-style decoders (decoder.py)
DECODERS: dict[str, tuple[str, Callable[[dict[str, Any]], DecoderShape]]] = {
    **{model_type: ("qwen3", qwen3_shape) for model_type in QWEN3_FAMILY},
    **{model_type: ("qwen2", qwen2_shape) for model_type in QWEN2_FAMILY},
    **{model_type: ("mistral", mistral_shape) for model_type in MISTRAL_FAMILY},
    **{model_type: ("eurobert", eurobert_shape) for model_type in EUROBERT_FAMILY},
}
LLM_RERANKER_FAMILIES = ("qwen3", "qwen2")  # causal LMs a LogitScore pipeline is served on
LLM_RERANKER = "llm-reranker"
# The families that answer scores (rerankers); every other family embeds.
SCORE_FAMILIES = ("cross-encoder", "deberta", "modernbert-cross-encoder", LLM_RERANKER)
SUPPORTED_MODEL_TYPES = (
    *BERT_FAMILY,
    *DECODERS,
    *GEMMA3_FAMILY,
    *(t for e in ENCODERS.values() for t in e.model_types),
    *DEBERTA_FAMILY,
)


def family_of(model_dir: ModelDir) -> str:
    """Which served family builds `model_dir`: `cross-encoder` (a BERT-family encoder with a
    sequence-classification head), `deberta` (a DeBERTa-v2/v3 reranker), `modernbert-cross-encoder`
    (ModernBERT's) or `llm-reranker` (a Qwen3/Qwen2 causal LM with sentence-transformers' LogitScore),
    which score; or an embedder's (`bert`, `gemma3`, a family of DECODERS or a key of ENCODERS);
    InvalidInput saying why not."""
    model_type = model_dir.model_type
    architectures = model_dir.config.get("architectures") or ()
    is_classifier = any(a.endswith("ForSequenceClassification") for a in architectures)
    if model_dir.logit_score is not None:
        if DECODERS.get(model_type, ("",))[0] not in LLM_RERANKER_FAMILIES:
            raise InvalidInput(
                f"{model_dir.path}: an LLM reranker (LogitScore) is served on a Qwen3 or Qwen2 causal LM, "
                f"not on model_type {model_type!r}"
            )
        return LLM_RERANKER
    if model_type in BERT_FAMILY and is_jina_lora_checkpoint(model_dir.config):
        return "jina_embeddings_v3"  # Jina's own format: XLM-R with rotary positions and task adapters
    if model_type in BERT_FAMILY and is_classifier:
        return "cross-encoder"
    if model_type in BERT_FAMILY:
        return "bert"
    if model_type in DECODERS:
        return DECODERS[model_type][0]
    if model_type in GEMMA3_FAMILY:
        return "gemma3"
    if model_type in MODERNBERT_FAMILY and is_cross_encoder(model_dir.config):
        return "modernbert-cross-encoder"
    if model_type in DEBERTA_FAMILY:
        if DEBERTA_ARCHITECTURE not in architectures:
            raise InvalidInput(
                f"a DeBERTa-v2 model is served as a reranker ({DEBERTA_ARCHITECTURE}), not as "
                f"{', '.join(architectures) or 'a bare encoder'}"
            )
        return "deberta"
    for family, encoder in ENCODERS.items():
        if model_type in encoder.model_types:
            if is_classifier:
                raise InvalidInput(
                    f"architectures {list(architectures)}: kembed serves {family} as an embedder, not its "
                    "sequence-classification head (cross-encoders: BERT, RoBERTa, XLM-RoBERTa, DeBERTa-v2)"
                )
            return family
    supported = ", ".join(SUPPORTED_MODEL_TYPES)
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
    deployment's override), else its family's default; "" for a scorer (its head reads the first
    token)."""
    family = family_of(model_dir)
    if family in SCORE_FAMILIES:
        return ""
    if model_dir.model_type in DECODERS:
        return decoder_pooling(model_dir, decoder_shape(model_dir))
    if family == "gemma3":
        return gemma3_pooling(model_dir)
    if model_dir.splade is not None:
        return f"splade {model_dir.splade.pooling}, {model_dir.splade.activation}"
    if family in SCORE_FAMILIES:
        return ""
    if family in ENCODERS:
        return model_dir.pooling or ENCODERS[family].pooling
    return model_dir.pooling or "mean"


def build_model(model_dir: ModelDir, attend: Attention) -> ServedModel:
    """The served network for `model_dir`, weights loaded, on the CPU in the checkpoint's dtype."""
    family = family_of(model_dir)
    if model_dir.adapter and family != "jina_embeddings_v3":
        raise InvalidInput(f"adapter {model_dir.adapter!r}: a {family} model has no task adapters")
    if family in SCORE_FAMILIES:
        if model_dir.dense:
            raise InvalidInput(f"{model_dir.path} is a cross-encoder with Dense modules in modules.json")
        if family == "deberta":
            return DebertaCrossEncoder.load(model_dir, attend)
        if family == "modernbert-cross-encoder":
            return ModernBertCrossEncoder.load(model_dir, attend)
        if family == LLM_RERANKER:
            assert model_dir.logit_score is not None
            return LogitScorer.load(model_dir, decoder_shape(model_dir), model_dir.logit_score, attend)
        return BertCrossEncoder.load(model_dir, attend)
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
    elif family in ENCODERS:
        build = ENCODERS[family].build
        weights = {} if family == "modernbert" else load_weights(model_dir.path)  # it reads its own
        embedder = build(model_dir, weights, attend, pooling_of(model_dir))
    elif family == "gemma3":
        embedder = build_gemma3(model_dir, attend)
    else:
        decoder = DecoderEmbedder(decoder_shape(model_dir), attend, pooling_of(model_dir))
        decoder.decoder.load_hf_weights(load_weights(model_dir.path))
        embedder = decoder
    embedder.load_dense(model_dir.dense)  # before the move to the device and dtype, as the encoder
    embedder.load_heads(M3Heads.load(model_dir.path, embedder.facts.hidden_size))
    return embedder


def decoder_shape(model_dir: ModelDir) -> DecoderShape:
    """The decoder network of a directory of a DECODERS family (InvalidInput for another)."""
    if model_dir.model_type not in DECODERS:
        raise InvalidInput(f"model_type {model_dir.model_type!r} is not a decoder family {tuple(DECODERS)}")
    return DECODERS[model_dir.model_type][1](model_dir.config)


def shape_of(model_dir: ModelDir) -> Shape:
    """The config.json fields that shape `model_dir`'s network; InvalidInput for one not served."""
    family = family_of(model_dir)
    if model_dir.model_type in DECODERS:
        return decoder_shape(model_dir)
    if family == "gemma3":
        return Gemma3Shape.from_config(model_dir.config)
    if family == "modernbert-cross-encoder":
        return ModernBertShape.from_config(model_dir.config)
    if family == "deberta":
        return DebertaShape.from_config(model_dir.config)
    if family in ENCODERS:
        return ENCODERS[family].shape(model_dir.config)
    return BertShape.from_config(model_dir.config)  # raises InvalidInput for an unsupported family


def attention_shape(model_dir: ModelDir) -> AttentionShape:
    """The attention shape of `model_dir`'s network, before building it (for `auto` timing, and the
    backends that serve its position bias or its sliding window)."""
    shape = shape_of(model_dir)
    if isinstance(shape, DecoderShape):
        return shape.attention
    if isinstance(shape, ModernBertShape):
        window = shape.window if any(shape.is_local) else None
        return AttentionShape(shape.num_heads, shape.num_heads, shape.head_dim, False, window=window)
    if isinstance(shape, Gemma3Shape):
        window = shape.window if any(shape.is_local) else None
        return AttentionShape(
            shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.is_causal, window=window
        )
    if isinstance(shape, T5Shape):
        return AttentionShape(shape.num_heads, shape.num_heads, shape.head_dim, False, bias=DISTANCE)
    if isinstance(shape, DebertaShape):
        heads = shape.layers.num_heads
        bias = DISENTANGLED if shape.has_bias else ""
        return AttentionShape(heads, heads, shape.hidden_size // heads, False, bias=bias)
    bias = DISTANCE if model_dir.model_type in MPNET_FAMILY else ""
    return AttentionShape(
        shape.num_heads, shape.num_heads, shape.hidden_size // shape.num_heads, False, bias=bias
    )


def network_of(model_dir: ModelDir) -> str:
    """What network is served, in a line (check-model)."""
    family, shape = family_of(model_dir), shape_of(model_dir)
    if isinstance(shape, RotaryEncoderShape):
        return shape.describe()
    if isinstance(shape, ModernBertShape | Gemma3Shape):
        kind = "ModernBERT encoder" if isinstance(shape, ModernBertShape) else "Gemma 3 decoder"
        return f"{shape.num_layers} pre-norm {kind} layers of {shape.hidden_size}, " + (
            shape.describe_attention()
        )
    if isinstance(shape, DecoderShape):
        stack = f"{shape.num_layers} pre-norm decoder layers of {shape.hidden_size}"
        if shape.window is not None:
            return f"{stack}, {describe_decoder_attention(shape)}"
        return f"{stack}, {'causal' if shape.is_causal else 'bidirectional'} attention"
    if isinstance(shape, T5Shape):
        mlp = f"gated {shape.activation}" if shape.is_gated else shape.activation
        return (
            f"{shape.num_layers} pre-norm T5 encoder layers of {shape.hidden_size} ({shape.num_heads} "
            f"heads), relative position buckets, {mlp} MLP, bidirectional attention"
        )
    if isinstance(shape, DebertaShape):
        bert = shape.layers
        terms = "+".join(shape.terms) or "no"
        return (
            f"{bert.num_layers} post-norm DeBERTa-v2 layers of {bert.hidden_size} ({bert.num_heads} "
            f"heads), disentangled attention ({terms} position terms), a sequence-classification head"
        )
    tokens = "token types" if shape.type_vocab_size else "no token types"
    names = {"distilbert": " (DistilBERT's weight names)", "mpnet": ", a relative position bias"}
    positions = "absolute positions"
    return (
        f"{shape.num_layers} post-norm layers of {shape.hidden_size} ({shape.num_heads} heads), {positions}, "
        f"{tokens}, {shape.activation} MLP, bidirectional attention{names.get(family, '')}"
    )


def adapters_of(model_dir: ModelDir) -> tuple[str, ...]:
    """The task adapters a deployment of `model_dir` may pick (WorkerConfig.adapter); () for none."""
    return tasks_of(model_dir.config) if family_of(model_dir) == "jina_embeddings_v3" else ()


def describe_attention(model_dir: ModelDir) -> str:
    """The attention pattern served, in words (check-model)."""
    shape = shape_of(model_dir)
    if isinstance(shape, ModernBertShape | Gemma3Shape):
        return shape.describe_attention()
    if isinstance(shape, DecoderShape):
        if shape.window is not None:
            return describe_decoder_attention(shape)
        return attention_pattern(model_dir.config, shape)
    return "bidirectional"
