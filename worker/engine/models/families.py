"""Which network a model directory builds: the dispatch over served families.

Every family implements `ServedModel` (served.py); a new family is a module plus a branch here.
"""

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
from kembed.worker.engine.models.heads import M3Heads
from kembed.worker.engine.models.model_dir import ModelDir, load_weights
from kembed.worker.engine.models.mpnet import MPNET_FAMILY, MPNetEmbedder, mpnet_shape
from kembed.worker.engine.models.qwen3 import QWEN3_FAMILY, Qwen3Shape, build_qwen3, qwen3_pooling
from kembed.worker.engine.models.served import PooledEmbedder, ServedModel
from kembed.worker.engine.models.splade import SpladeEmbedder
from kembed.worker.engine.models.t5 import T5_FAMILY, T5Embedder, T5Shape
from kembed.worker.errors import InvalidInput

# The families that answer scores (rerankers); every other family embeds.
SCORE_FAMILIES = ("cross-encoder", "deberta")


def family_of(model_dir: ModelDir) -> str:
    """Which served family builds `model_dir`: `cross-encoder` (a BERT-family encoder with a
    sequence-classification head: scores), `deberta` (a DeBERTa-v2/v3 reranker: scores), `bert`,
    `mpnet`, `t5` or `qwen3` (embedders); InvalidInput saying why not."""
    model_type = model_dir.model_type
    architectures = model_dir.config.get("architectures") or ()
    is_classifier = any(a.endswith("ForSequenceClassification") for a in architectures)
    if model_type in BERT_FAMILY and is_classifier:
        return "cross-encoder"
    if model_type in BERT_FAMILY:
        return "bert"
    if model_type in QWEN3_FAMILY:
        return "qwen3"
    if model_type in DEBERTA_FAMILY:
        if DEBERTA_ARCHITECTURE not in architectures:
            raise InvalidInput(
                f"a DeBERTa-v2 model is served as a reranker ({DEBERTA_ARCHITECTURE}), not as "
                f"{', '.join(architectures) or 'a bare encoder'}"
            )
        return "deberta"
    if model_type in MPNET_FAMILY + T5_FAMILY:
        if is_classifier:
            raise InvalidInput(
                f"{', '.join(architectures)} is not served: {model_type} is served as an embedder"
            )
        return "mpnet" if model_type in MPNET_FAMILY else "t5"
    supported = ", ".join((*BERT_FAMILY, *QWEN3_FAMILY, *MPNET_FAMILY, *T5_FAMILY, *DEBERTA_FAMILY))
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
    if family == "qwen3":
        return qwen3_pooling(model_dir, Qwen3Shape.from_config(model_dir.config))
    if model_dir.splade is not None:
        return f"splade {model_dir.splade.pooling}, {model_dir.splade.activation}"
    if family in SCORE_FAMILIES:
        return ""
    return model_dir.pooling or "mean"


def build_model(model_dir: ModelDir, attend: Attention) -> ServedModel:
    """The served network for `model_dir`, weights loaded, on the CPU in the checkpoint's dtype."""
    family = family_of(model_dir)
    if family in SCORE_FAMILIES:
        if model_dir.dense:
            raise InvalidInput(f"{model_dir.path} is a cross-encoder with Dense modules in modules.json")
        if family == "deberta":
            return DebertaCrossEncoder.load(model_dir, attend)
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
    elif family == "mpnet":
        mpnet = MPNetEmbedder(model_dir.config, attend, pooling_of(model_dir))
        mpnet.encoder.load_hf_weights(load_weights(model_dir.path))
        embedder = mpnet
    elif family == "t5":
        t5 = T5Embedder(T5Shape.from_config(model_dir.config), attend, pooling_of(model_dir))
        t5.load_hf_weights(load_weights(model_dir.path))
        embedder = t5
    else:
        embedder = build_qwen3(model_dir, attend)
    embedder.load_dense(model_dir.dense)  # before the move to the device and dtype, as the encoder
    embedder.load_heads(M3Heads.load(model_dir.path, embedder.facts.hidden_size))
    return embedder


def shape_of(model_dir: ModelDir) -> BertShape | Qwen3Shape | T5Shape | DebertaShape:
    """The config.json fields that shape `model_dir`'s network; InvalidInput for one not served."""
    family_of(model_dir)  # an unserved directory is refused with the family dispatch's reason
    model_type = model_dir.model_type
    if model_type in QWEN3_FAMILY:
        return Qwen3Shape.from_config(model_dir.config)
    if model_type in MPNET_FAMILY:
        return mpnet_shape(model_dir.config)
    if model_type in T5_FAMILY:
        return T5Shape.from_config(model_dir.config)
    if model_type in DEBERTA_FAMILY:
        return DebertaShape.from_config(model_dir.config)
    return BertShape.from_config(model_dir.config)  # raises InvalidInput for an unsupported family


def attention_shape(model_dir: ModelDir) -> AttentionShape:
    """The attention shape of `model_dir`'s network, before building it (for `auto` timing, and the
    backends that serve its position bias)."""
    shape = shape_of(model_dir)
    if isinstance(shape, Qwen3Shape):
        return AttentionShape(shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.is_causal)
    if isinstance(shape, T5Shape):
        return AttentionShape(shape.num_heads, shape.num_heads, shape.head_dim, False, DISTANCE)
    if isinstance(shape, DebertaShape):
        heads = shape.layers.num_heads
        bias = DISENTANGLED if shape.has_bias else ""
        return AttentionShape(heads, heads, shape.hidden_size // heads, False, bias)
    bias = DISTANCE if model_dir.model_type in MPNET_FAMILY else ""
    return AttentionShape(shape.num_heads, shape.num_heads, shape.hidden_size // shape.num_heads, False, bias)
