"""Tiny random models of the relative-position-bias families, saved as sentence-transformers saves them
(the CPU tests and the GPU tests share them): MPNet and sentence-T5 embedders, DeBERTa-v2/v3 rerankers.

Each uses the bundled all-MiniLM-L6-v2 tokenizer (its vocabulary is the model's), and is sized so that
the family's position scheme acts on the test texts: texts longer than the buckets' exact range and
than `max_distance` (T5), than DeBERTa's log buckets' `mid`, and bias weights large enough to change
the vectors (checked by the tests, which zero them and see the rows move).
"""

import shutil
from pathlib import Path

import torch
import transformers

from kembed.worker.config import bundled_model_dir

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
VOCAB = 30522  # the bundled tokenizer's
MAX_LENGTH = 200  # tokens per text (and pair) the pipelines keep
# head size 32: one the Triton kernel takes, so the GPU tests run these on it
LAYERS = dict(num_hidden_layers=2, num_attention_heads=2, hidden_size=64, intermediate_size=128)


def _tokenizer_dir() -> Path:
    """The bundled model's directory; on a GPU machine without the package, its copy in
    .kembed/minilm-fp16 (real_minilm.py writes it; its tokenizer files are the package's)."""
    bundled = bundled_model_dir()
    if bundled is not None:
        return bundled
    copy = Path(__file__).resolve().parents[2] / ".kembed" / "minilm-fp16"
    assert (copy / "tokenizer.json").is_file(), "no bundled tokenizer: run tests/worker/real_minilm.py"
    return copy


def _with_tokenizer(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    source = _tokenizer_dir()
    for name in TOKENIZER_FILES:
        shutil.copy(source / name, path / name)
    return path


def _spread_position_bias(model: torch.nn.Module, std: float) -> None:
    """Relative position weights large enough to move the vectors (the default init barely does)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "relative_attention_bias" in name or "rel_embeddings" in name:
                param.normal_(0.0, std)


def _save_pipeline(hf_dir: Path, path: Path, dense: int | None) -> Path:
    """Transformer -> Pooling(mean) [-> Dense(identity, no bias)] -> Normalize, saved by
    sentence-transformers itself into `path` (sentence-t5's pipeline with `dense`)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer

    transformer = Transformer(str(hf_dir), max_seq_length=MAX_LENGTH)
    modules: list[torch.nn.Module] = [transformer, Pooling(LAYERS["hidden_size"], "mean")]
    if dense is not None:
        torch.manual_seed(1)
        modules.append(
            Dense(LAYERS["hidden_size"], dense, bias=False, activation_function=torch.nn.Identity())
        )
    SentenceTransformer(modules=[*modules, Normalize()], device="cpu").save(str(path))
    return path


def write_mpnet(path: Path) -> Path:
    """all-mpnet-base-v2's architecture and pipeline (mean pooling, Normalize), shrunk."""
    hf_dir = _with_tokenizer(path.parent / f"{path.name}-hf")
    config = transformers.MPNetConfig(
        vocab_size=VOCAB, max_position_embeddings=MAX_LENGTH + 2, initializer_range=0.2, **LAYERS
    )  # weights large enough that attention, and so its bias, moves the vectors
    torch.manual_seed(0)
    model = transformers.MPNetModel(config, add_pooling_layer=False).eval()
    _spread_position_bias(model, 2.0)
    model.save_pretrained(hf_dir)
    return _save_pipeline(hf_dir, path, dense=None)


def write_sentence_t5(path: Path, feed_forward_proj: str) -> Path:
    """sentence-t5's architecture and pipeline (mean pooling, a Dense layer, Normalize), shrunk, with
    16 buckets up to a distance of 20 (the texts are longer)."""
    hf_dir = _with_tokenizer(path.parent / f"{path.name}-hf")
    config = transformers.T5Config(
        vocab_size=VOCAB, d_model=LAYERS["hidden_size"], d_kv=32, d_ff=LAYERS["intermediate_size"],
        num_layers=LAYERS["num_hidden_layers"], num_heads=LAYERS["num_attention_heads"],
        relative_attention_num_buckets=16, relative_attention_max_distance=20,
        feed_forward_proj=feed_forward_proj,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.T5EncoderModel(config).eval()
    _spread_position_bias(model, 2.0)
    with torch.no_grad():  # RMSNorm weights start at one: randomise them so a misplaced norm shows
        for name, param in model.named_parameters():
            if "layer_norm" in name:
                param.uniform_(0.5, 1.5)
    model.save_pretrained(hf_dir)
    return _save_pipeline(hf_dir, path, dense=48)


# DeBERTa-v3 as mxbai-rerank-v1 ships it (log buckets, shared keys, normed position embeddings, no
# absolute positions or token types), and DeBERTa-v2's older settings (no buckets, own position
# projections, absolute positions and token types, the "p2c|c2p" spelling), and one term alone.
DEBERTA_VARIANTS = {
    "v3": dict(
        relative_attention=True, position_buckets=16, max_relative_positions=-1, pos_att_type=["p2c", "c2p"],
        share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False, type_vocab_size=0,
    ),
    "v2": dict(
        relative_attention=True, position_buckets=-1, max_relative_positions=40, pos_att_type="c2p|p2c",
        share_att_key=False, position_biased_input=True, type_vocab_size=2,
    ),
    "c2p-only": dict(
        relative_attention=True, position_buckets=8, max_relative_positions=64, pos_att_type=["c2p"],
        share_att_key=False, position_biased_input=True, type_vocab_size=0, embedding_size=48,
    ),
}  # fmt: skip


def write_deberta_reranker(path: Path, variant: str) -> Path:
    """A DebertaV2ForSequenceClassification (one label) with the bundled tokenizer, as CrossEncoder
    loads it."""
    _with_tokenizer(path)
    config = transformers.DebertaV2Config(
        vocab_size=VOCAB, max_position_embeddings=512, num_labels=1, initializer_range=0.1,
        **LAYERS, **DEBERTA_VARIANTS[variant],
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.DebertaV2ForSequenceClassification(config).eval()
    _spread_position_bias(model, 1.0)
    model.save_pretrained(path)
    return path
