"""ModernBERT on ragged packed batches against sentence-transformers on the same random weights: the
embedder (`SentenceTransformer(dir).encode`, cosine >= 0.999 per row) and the reranker head
(`CrossEncoder(dir).predict`, within 1 %). The local layers' window (8 tokens wide: 4 either side)
is far shorter than most test texts, and attention sharp enough (initializer_range 0.2) that a band
one key too narrow misses the bar (measured: cosine 0.95, against 0.99999994 for the right one)."""

import json

import numpy as np
import pytest
import torch
import transformers
from real_minilm import corpus_texts
from st_directories import (
    VOCAB_SIZE,
    cosine_rows,
    engine_rows,
    randomise_norms,
    save_sentence_transformer,
    save_transformer,
)

from kembed.proto.accuracy import MIN_COSINE
from kembed.worker.config import WorkerConfig
from kembed.worker.engine import load_engine

TINY = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    intermediate_size=96,
    max_position_embeddings=512,
    local_attention=8,
    global_attn_every_n_layers=2,  # layers 0 and 2 global, 1 and 3 local
    global_rope_theta=1000.0,  # bases far apart, so a layer rotated with the other's shows
    local_rope_theta=100.0,
    pad_token_id=0,
    bos_token_id=101,
    cls_token_id=101,
    eos_token_id=102,
    sep_token_id=102,
    initializer_range=0.2,  # sharper attention than 0.02: the window's edge matters more
)
BIASES = {"no-biases": {}, "biases": dict(norm_bias=True, attention_bias=True, mlp_bias=True)}
TEXTS = corpus_texts(40)


def hub_style(path) -> None:
    """config.json as ModernBERT checkpoints on the hub spell it: no `layer_types` nor
    `rope_parameters`, the flat keys transformers 5 reads them from instead."""
    config = json.loads((path / "config.json").read_text())
    del config["layer_types"], config["rope_parameters"]
    config.update(global_rope_theta=1000.0, local_rope_theta=100.0, global_attn_every_n_layers=2)
    (path / "config.json").write_text(json.dumps(config))


def write_embedder(tmp_path, overrides: dict, *, hub: bool = False):
    torch.manual_seed(0)
    model = transformers.ModernBertModel(transformers.ModernBertConfig(**{**TINY, **overrides})).eval()
    randomise_norms(model, 0.5, 1.5)
    hf_dir = save_transformer(model, tmp_path / "hf")
    if hub:
        hub_style(hf_dir)
    return save_sentence_transformer(hf_dir, tmp_path / "st", "mean", [_normalize()])


def _normalize():
    from sentence_transformers.sentence_transformer.modules import Normalize

    return Normalize()


def reference(path, texts):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(path), device="cpu")
    ids = model.tokenizer(texts, truncation=True, max_length=256)["input_ids"]
    return model.encode(texts, batch_size=16), ids


CASES = {  # (attention backend, config.json style, biases)
    "sdpa-transformers-5-config-no-biases": ("sdpa", "transformers-5", "no-biases"),
    "sdpa-hub-config-biases": ("sdpa", "hub", "biases"),
    "sdpa-padded-hub-config-no-biases": ("sdpa-padded", "hub", "no-biases"),
}


@pytest.mark.parametrize(("backend", "config", "biases"), CASES.values(), ids=list(CASES))
def test_modernbert_sliding_window_matches_sentence_transformers(tmp_path, backend, config, biases):
    path = write_embedder(tmp_path, BIASES[biases], hub=config == "hub")
    expected, ids = reference(path, TEXTS)
    assert max(len(x) for x in ids) > 4 * TINY["local_attention"]  # the window acts on most texts
    together = engine_rows(path, ids, batch=16, backend=backend)
    alone = engine_rows(path, ids[:8], batch=1, backend=backend)
    assert cosine_rows(together, expected).min() >= MIN_COSINE
    assert cosine_rows(alone, expected[:8]).min() >= MIN_COSINE


def test_the_window_changes_long_texts_and_not_short_ones(tmp_path):
    """The same weights with a window wider than every text: texts within the narrow window's reach
    (at most 5 tokens) get the same rows, longer ones other rows."""
    narrow = write_embedder(tmp_path / "narrow", {})
    wide = write_embedder(tmp_path / "wide", {"local_attention": 1024})
    _, ids = reference(narrow, TEXTS)
    lengths = np.array([len(x) for x in ids])
    a, b = engine_rows(narrow, ids, batch=16), engine_rows(wide, ids, batch=16)
    short, long = lengths <= 5, lengths > 40
    assert short.any() and long.any()
    np.testing.assert_allclose(a[short], b[short], rtol=1e-5, atol=1e-6)
    assert cosine_rows(a[long], b[long]).max() < 0.9999


def test_check_model_names_the_family_and_its_local_layers(tmp_path):
    from kembed.worker.tools.check_model import check, render

    result = check(write_embedder(tmp_path, {}), load=True)
    assert result.is_servable, result.reason
    assert (result.family, result.pooling, result.dimensions) == ("modernbert", "mean", 64)
    assert "2 of 4 layers local (a sliding window of 4 tokens either side)" in render(result)


PAIRS = [
    ("what is kembed?", "kembed serves text embeddings from GPUs, " * 6),
    ("sliding windows", "a local layer sees only the tokens near each query"),
    ("x", "y"),
    ("a much longer query about attention patterns and windows " * 2, "short"),
    ("rerank", " ".join(corpus_texts(3))),
]


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_modernbert_reranker_matches_cross_encoder_predict(tmp_path, pooling):
    from sentence_transformers import CrossEncoder

    torch.manual_seed(0)
    config = transformers.ModernBertConfig(**TINY, num_labels=1, classifier_pooling=pooling)
    model = transformers.ModernBertForSequenceClassification(config).eval()
    randomise_norms(model, 0.5, 1.5)
    path = save_transformer(model, tmp_path / "reranker")
    reranker = CrossEncoder(str(path), device="cpu", max_length=256)
    expected = reranker.predict(PAIRS, activation_fn=torch.nn.Identity())
    ids = [reranker.tokenizer(q, d, truncation=True, max_length=256)["input_ids"] for q, d in PAIRS]
    assert max(len(x) for x in ids) > 4 * TINY["local_attention"]
    engine = load_engine(WorkerConfig(model=path, device="cpu"))
    lengths = np.array([len(x) for x in ids], np.int32)
    logits = engine.step(engine.pack(np.concatenate(ids).astype(np.int32), lengths)).wait()
    assert (engine.info.task, engine.info.dimensions) == ("score", 1)
    np.testing.assert_allclose(logits[:, 0], expected, rtol=0.01, atol=1e-4)
    # the scores the gateway serves (sigmoid, CrossEncoder's default for one label) agree as well
    np.testing.assert_allclose(1 / (1 + np.exp(-logits[:, 0])), reranker.predict(PAIRS), rtol=0.01)
