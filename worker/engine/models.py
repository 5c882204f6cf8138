"""Which network a model directory builds: the dispatch over served families.

Every family implements `ServedModel` (served.py); a new family is a module plus a branch here.
"""

from kembed.worker.engine.attention import Attend, AttentionShape
from kembed.worker.engine.bert import BERT_FAMILY, BertEmbedder, BertShape
from kembed.worker.engine.cross_encoder import BertCrossEncoder
from kembed.worker.engine.model_dir import ModelDir, load_weights
from kembed.worker.engine.qwen3 import Qwen3Shape, build_qwen3
from kembed.worker.engine.served import ServedModel
from kembed.worker.errors import InvalidInput

QWEN3_FAMILY = ("qwen3", "bidirectional_pplx_qwen3")


def build_model(model_dir: ModelDir, attend: Attend) -> ServedModel:
    """The served network for `model_dir`, weights loaded, on the CPU in the checkpoint's dtype."""
    config = model_dir.config
    model_type = model_dir.model_type
    architectures = config.get("architectures") or ()
    if model_type in BERT_FAMILY and any(a.endswith("ForSequenceClassification") for a in architectures):
        return BertCrossEncoder.load(model_dir, attend)
    if model_type in BERT_FAMILY:
        model = BertEmbedder(BertShape.from_config(config), attend, model_dir.pooling or "mean")
        model.encoder.load_hf_weights(load_weights(model_dir.path))
        return model
    if model_type in QWEN3_FAMILY:
        return build_qwen3(model_dir, attend)
    supported = (*BERT_FAMILY, *QWEN3_FAMILY)
    raise InvalidInput(f"model_type {model_type!r} is not supported (supported: {', '.join(supported)})")


def attention_shape(model_dir: ModelDir) -> AttentionShape:
    """The attention shape of `model_dir`'s network, before building it (for `auto` timing)."""
    config = model_dir.config
    if model_dir.model_type in QWEN3_FAMILY:
        qwen = Qwen3Shape.from_config(config)
        return AttentionShape(qwen.num_heads, qwen.num_kv_heads, qwen.head_dim, qwen.is_causal)
    bert = BertShape.from_config(config)  # raises InvalidInput for an unsupported family
    return AttentionShape(bert.num_heads, bert.num_heads, bert.hidden_size // bert.num_heads, False)
