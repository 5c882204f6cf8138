"""MPNet and sentence-T5 embedders, DeBERTa-v2/v3 rerankers: kembed's own forward over packed ragged
batches (CPU engine, both CPU attention backends) against sentence-transformers on the same directory
(`SentenceTransformer(dir).encode`: cosine >= 0.999 a row; `CrossEncoder(dir).predict`: logits within
1 %), each text alone and all together in mixed batches. The relative position weights are large
enough to matter: zeroed, the rows move well past the bar."""

import numpy as np
import pytest
import torch
from bias_models import MAX_LENGTH, write_deberta_reranker, write_mpnet, write_sentence_t5
from real_minilm import corpus_texts

from kembed.proto.accuracy import MIN_COSINE
from kembed.worker.config import WorkerConfig
from kembed.worker.engine import load_engine
from kembed.worker.errors import InvalidInput, StartupError

_CORPUS = corpus_texts(60)
# edge cases, scripts and code, then the longest prose (past the 200-token cut)
TEXTS = _CORPUS[:16] + sorted(_CORPUS, key=len)[-8:]
# (sequences, a batch's size): a few alone, all in mixed batches of 7, all in one batch
ALONE_MIXED_ALL = ((6, 1), (99, 7), (99, 99))
QUERIES = ["how are relative positions bucketed?", "kubernetes operator", "a"]

EMBEDDERS = {
    "mpnet": write_mpnet,
    "sentence-t5-relu": lambda path: write_sentence_t5(path, "relu"),
    "sentence-t5-gated-gelu": lambda path: write_sentence_t5(path, "gated-gelu"),
}


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def run_batches(engine, seqs: list[list[int]], batch_size: int, types=None) -> np.ndarray:
    """The engine's rows for `seqs`, `batch_size` sequences a step."""
    rows = []
    for at in range(0, len(seqs), batch_size):
        batch = [np.array(s, np.int32) for s in seqs[at : at + batch_size]]
        lengths = np.array([len(s) for s in batch], np.int32)
        batch_types = None if types is None else np.concatenate(types[at : at + batch_size]).astype(np.int32)
        rows.append(engine.step(engine.pack(np.concatenate(batch), lengths, batch_types)).wait())
    return np.concatenate(rows)


@pytest.fixture(scope="module", params=list(EMBEDDERS), ids=list(EMBEDDERS))
def embedder(request, tmp_path_factory):
    from sentence_transformers import SentenceTransformer

    path = EMBEDDERS[request.param](tmp_path_factory.mktemp("st") / request.param)
    model = SentenceTransformer(str(path), device="cpu")
    ids = model.tokenizer(TEXTS, truncation=True, max_length=MAX_LENGTH)["input_ids"]
    assert max(len(i) for i in ids) == MAX_LENGTH and min(len(i) for i in ids) <= 3
    return request.param, path, ids, model.encode(TEXTS, convert_to_numpy=True)


@pytest.mark.parametrize("backend", ["sdpa", "sdpa-padded"])
def test_relative_bias_embedder_matches_sentence_transformers(embedder, backend):
    name, path, ids, expected = embedder
    engine = load_engine(WorkerConfig(model=path, device="cpu", attention_backend=backend))
    for count, batch_size in ALONE_MIXED_ALL:
        ours = run_batches(engine, ids[:count], batch_size)
        assert ours.shape == expected[:count].shape
        assert cosine_rows(ours, expected[:count]).min() >= MIN_COSINE, batch_size
    assert engine.info.pooling == "mean" and engine.info.normalize
    assert engine.info.dimensions == (48 if name.startswith("sentence-t5") else 64)  # t5: its Dense layer


def test_the_position_bias_acts_on_the_test_texts(embedder):
    _, path, ids, expected = embedder
    engine = load_engine(WorkerConfig(model=path, device="cpu"))
    model = engine.model
    bias = model.encoder.position_bias if hasattr(model, "encoder") else model.position_bias
    with torch.no_grad():
        bias.relative_attention_bias.weight.zero_()
    assert cosine_rows(run_batches(engine, ids, len(ids)), expected).min() < 0.99


@pytest.fixture(scope="module", params=["v3", "v2", "c2p-only"])
def reranker(request, tmp_path_factory):
    from sentence_transformers import CrossEncoder

    path = write_deberta_reranker(tmp_path_factory.mktemp("ce") / request.param, request.param)
    model = CrossEncoder(str(path), device="cpu", max_length=MAX_LENGTH)
    pairs = [(query, text) for query in QUERIES for text in TEXTS[:12]]
    encoded = model.tokenizer(
        [q for q, _ in pairs], [t for _, t in pairs], truncation=True, max_length=MAX_LENGTH
    )
    types = [np.array(t, np.int32) for t in encoded["token_type_ids"]]
    logits = model.predict(pairs, activation_fn=torch.nn.Identity(), convert_to_numpy=True)
    return path, encoded["input_ids"], types, logits.reshape(len(pairs), -1)


@pytest.mark.parametrize("backend", ["sdpa", "sdpa-padded"])
def test_deberta_reranker_matches_cross_encoder_predict(reranker, backend):
    path, ids, types, expected = reranker
    engine = load_engine(WorkerConfig(model=path, device="cpu", attention_backend=backend))
    assert (engine.info.task, engine.info.dimensions) == ("score", 1)
    for count, batch_size in ALONE_MIXED_ALL:
        ours, want = run_batches(engine, ids[:count], batch_size, types), expected[:count]
        assert ours.shape == want.shape
        np.testing.assert_allclose(ours, want, rtol=1e-2, atol=1e-2 * np.abs(want).max())
        assert np.corrcoef(ours[:, 0], want[:, 0])[0, 1] > 0.9999  # the ranking, not the scale alone


def test_deberta_position_terms_act_on_the_test_pairs(reranker):
    path, ids, types, expected = reranker
    engine = load_engine(WorkerConfig(model=path, device="cpu"))
    with torch.no_grad():
        for layer in engine.model.layers:
            layer.pos_key.zero_()
            layer.pos_query.zero_()
    moved = np.abs(run_batches(engine, ids, len(ids), types) - expected).max()
    assert moved > 0.03 * np.abs(expected).max()  # three times the tolerance above


def test_a_backend_that_adds_no_bias_is_refused_for_mpnet(tmp_path):
    path = write_mpnet(tmp_path / "mpnet")
    with pytest.raises(StartupError, match="adds no distance position bias"):
        load_engine(WorkerConfig(model=path, device="cpu", attention_backend="torch-varlen"))


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("conv_kernel_size", 3, "conv_kernel_size 3 is not served"),
        ("architectures", ["DebertaV2Model"], "served as a reranker (DebertaV2ForSequenceClassification)"),
    ],
    ids=["deberta-v2-xlarge-convolution", "deberta-bare-encoder"],
)
def test_unsupported_deberta_variants_are_refused_naming_them(tmp_path, setting, value, message):
    import json

    path = write_deberta_reranker(tmp_path / "deberta", "v3")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, setting: value}))
    with pytest.raises(InvalidInput, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_engine(WorkerConfig(model=path, device="cpu"))


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("feed_forward_proj", "gated-swish-x", "feed_forward_proj 'gated-swish-x' is not served"),
        ("is_decoder", True, "a T5 decoder"),
    ],
    ids=["t5-unknown-mlp", "t5-decoder"],
)
def test_unsupported_t5_variants_are_refused_naming_them(tmp_path, setting, value, message):
    import json

    path = write_sentence_t5(tmp_path / "t5", "relu")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, setting: value}))
    with pytest.raises(InvalidInput, match=message):
        load_engine(WorkerConfig(model=path, device="cpu"))
