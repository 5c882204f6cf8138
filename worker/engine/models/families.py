"""Which network a model directory builds: the dispatch over served families.

Every family implements `ServedModel` (served.py); a new family is a module plus a branch here.
"""

from kembed.worker.engine.layers.attention import Attention, AttentionShape
from kembed.worker.engine.models.bert import BERT_FAMILY, BertEmbedder, BertShape
from kembed.worker.engine.models.cross_encoder import BertCrossEncoder
from kembed.worker.engine.models.gemma3 import GEMMA3_FAMILY, Gemma3Shape, build_gemma3, gemma3_pooling
from kembed.worker.engine.models.heads import M3Heads
from kembed.worker.engine.models.mistral import MISTRAL_FAMILY, build_mistral, mistral_shape
from kembed.worker.engine.models.mistral import describe_attention as describe_decoder_attention
from kembed.worker.engine.models.model_dir import ModelDir, load_weights
from kembed.worker.engine.models.modernbert import (
    MODERNBERT_FAMILY,
    ModernBertCrossEncoder,
    ModernBertShape,
    build_modernbert,
    is_cross_encoder,
)
from kembed.worker.engine.models.qwen3 import QWEN3_FAMILY, Qwen3Shape, build_qwen3, qwen3_pooling
from kembed.worker.engine.models.served import PooledEmbedder, ServedModel
from kembed.worker.engine.models.splade import SpladeEmbedder
from kembed.worker.errors import InvalidInput

# The families whose models answer scores (`/rerank`); every other one answers embeddings.
SCORER_FAMILIES = ("cross-encoder", "modernbert-cross-encoder")
Shape = BertShape | Qwen3Shape | ModernBertShape | Gemma3Shape


def family_of(model_dir: ModelDir) -> str:
    """Which served family builds `model_dir`: `cross-encoder` (a BERT-family encoder with a
    sequence-classification head: scores), `modernbert-cross-encoder` (ModernBERT's), or an embedder:
    `bert`, `qwen3`, `modernbert`, `gemma3`, `mistral`; InvalidInput saying why not."""
    model_type = model_dir.model_type
    architectures = model_dir.config.get("architectures") or ()
    if model_type in BERT_FAMILY and any(a.endswith("ForSequenceClassification") for a in architectures):
        return "cross-encoder"
    if model_type in BERT_FAMILY:
        return "bert"
    if model_type in QWEN3_FAMILY:
        return "qwen3"
    if model_type in MODERNBERT_FAMILY:
        return "modernbert-cross-encoder" if is_cross_encoder(model_dir.config) else "modernbert"
    if model_type in GEMMA3_FAMILY:
        return "gemma3"
    if model_type in MISTRAL_FAMILY:
        return "mistral"
    supported = ", ".join((*BERT_FAMILY, *QWEN3_FAMILY, *MODERNBERT_FAMILY, *GEMMA3_FAMILY, *MISTRAL_FAMILY))
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
    deployment's override), else its family's default; "" for a cross-encoder (its head reads the
    first token)."""
    family = family_of(model_dir)
    if family == "qwen3":
        return qwen3_pooling(model_dir, Qwen3Shape.from_config(model_dir.config))
    if family == "mistral":
        return qwen3_pooling(model_dir, mistral_shape(model_dir.config))
    if family == "gemma3":
        return gemma3_pooling(model_dir)
    if model_dir.splade is not None:
        return f"splade {model_dir.splade.pooling}, {model_dir.splade.activation}"
    if family in ("bert", "modernbert"):
        return model_dir.pooling or "mean"
    return ""


def build_model(model_dir: ModelDir, attend: Attention) -> ServedModel:
    """The served network for `model_dir`, weights loaded, on the CPU in the checkpoint's dtype."""
    family = family_of(model_dir)
    if family in SCORER_FAMILIES:
        if model_dir.dense:
            raise InvalidInput(f"{model_dir.path} is a cross-encoder with Dense modules in modules.json")
        if family == "modernbert-cross-encoder":
            return ModernBertCrossEncoder.load(model_dir, attend)
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
    elif family == "modernbert":
        embedder = build_modernbert(model_dir, attend, pooling_of(model_dir))
    elif family == "gemma3":
        embedder = build_gemma3(model_dir, attend)
    elif family == "mistral":
        embedder = build_mistral(model_dir, attend)
    else:
        embedder = build_qwen3(model_dir, attend)
    embedder.load_dense(model_dir.dense)  # before the move to the device and dtype, as the encoder
    embedder.load_heads(M3Heads.load(model_dir.path, embedder.facts.hidden_size))
    return embedder


def shape_of(model_dir: ModelDir) -> Shape:
    """The config.json fields that shape `model_dir`'s network; InvalidInput for one not served."""
    family = family_of(model_dir)  # raises InvalidInput for an unsupported family
    config = model_dir.config
    if family == "qwen3":
        return Qwen3Shape.from_config(config)
    if family == "mistral":
        return mistral_shape(config)
    if family.startswith("modernbert"):
        return ModernBertShape.from_config(config)
    if family == "gemma3":
        return Gemma3Shape.from_config(config)
    return BertShape.from_config(config)


def attention_shape(model_dir: ModelDir) -> AttentionShape:
    """The attention shape of `model_dir`'s network, before building it (for `auto` timing, and to
    keep backends that cannot serve its sliding window from being chosen)."""
    shape = shape_of(model_dir)
    if isinstance(shape, Qwen3Shape):
        return AttentionShape(
            shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.is_causal, shape.window
        )
    if isinstance(shape, ModernBertShape):
        window = shape.window if any(shape.is_local) else None
        return AttentionShape(shape.num_heads, shape.num_heads, shape.head_dim, False, window)
    if isinstance(shape, Gemma3Shape):
        window = shape.window if any(shape.is_local) else None
        return AttentionShape(shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.is_causal, window)
    return AttentionShape(shape.num_heads, shape.num_heads, shape.hidden_size // shape.num_heads, False)


def describe_attention(model_dir: ModelDir) -> str:
    """The attention pattern served, in words (check-model)."""
    shape = shape_of(model_dir)
    if isinstance(shape, ModernBertShape | Gemma3Shape):
        return shape.describe_attention()
    if isinstance(shape, Qwen3Shape):
        return describe_decoder_attention(shape)
    return "bidirectional"
