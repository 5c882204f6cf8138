"""SPLADE models (a masked-LM head, log(1 + ReLU) pooled over the tokens) in the engine against
sentence-transformers' SparseEncoder, on small model directories with random weights, and their
rows as the worker sends them (kembed.proto.outputs.vocabulary_words)."""

import json

import numpy as np
import pytest
from splade_model import build_splade_dir, splade_reference

from kembed.proto.outputs import SPARSE, read_vocabulary, vocabulary_words
from kembed.worker.config import WorkerConfig
from kembed.worker.edge.vocabulary import check_asks, compact
from kembed.worker.engine.engine import load_engine
from kembed.worker.errors import InvalidInput
from kembed.worker.info import ModelInfo

TEXTS = ["w1 w2 w3 w2", "w7", "w5 w9 w11 w13 w15 w17 w19 w21 nothere w5", "w0 w0 w0"]


def _ids(path, texts):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    return [e.ids for e in tokenizer.encode_batch(texts)]


@pytest.fixture(
    scope="module",
    params=[
        ("max", "relu", "MLMTransformer"),
        ("sum", "log1p_relu", "MLMTransformer"),
        ("max", "relu", "Transformer"),
    ],
    ids=["max", "sum-log1p", "fill-mask-transformer"],
)
def splade_dir(request, tmp_path_factory):
    pooling, activation, transformer = request.param
    if transformer == "Transformer":  # sentence-transformers 6's layout; CI's has it, a GPU image may not
        pytest.importorskip("sentence_transformers.base.modules")
    return build_splade_dir(
        tmp_path_factory.mktemp("splade") / "tiny-splade",
        pooling=pooling,
        activation=activation,
        transformer=transformer,
    )


def test_the_model_has_sparse_alone_by_vocabulary(splade_dir):
    info = load_engine(WorkerConfig(model=splade_dir, device="cpu", dtype="float32")).info
    assert (info.outputs, info.sparse_vocabulary, info.dimensions, info.vocab_size) == (
        SPARSE,
        True,
        125,
        125,
    )


def test_rows_match_sparse_encoder(splade_dir):
    engine = load_engine(WorkerConfig(model=splade_dir, device="cpu", dtype="float32"))
    sequences = _ids(splade_dir, TEXTS)
    lengths = np.array([len(s) for s in sequences])
    rows = engine.step(engine.pack(np.concatenate(sequences).astype(np.int32), lengths)).wait()
    pairs = read_vocabulary(vocabulary_words(rows)[1], len(TEXTS))
    for (ids, values), want in zip(pairs, splade_reference(splade_dir, TEXTS), strict=True):
        assert ids.tolist() == sorted(want)
        assert np.abs(values - [want[i] for i in ids.tolist()]).max() <= 1e-3


def test_compact_counts_each_requests_words():
    rows = np.zeros((3, 10), np.float32)
    rows[0, [2, 7]] = [0.5, 1.5]
    rows[2, 9] = 2.0
    per_request, words = compact(np.array([2, 1]), rows)  # request 0: rows 0-1, request 1: row 2
    assert per_request.tolist() == [1 + 4 + 1, 3] and words.shape == (9, 1)
    assert words.ravel().tolist() == [2, 2, 7, 0.5, 1.5, 0, 1, 9, 2.0]


@pytest.mark.parametrize(
    "outputs", [0, 1, 3, np.array([2, 1], np.uint8)], ids=["none", "dense", "dense-sparse", "mixed"]
)
def test_anything_but_sparse_alone_is_refused(outputs):
    info = ModelInfo(
        "tiny", "bert", "embed", 125, 128, 125, "splade", False, "float32", "cpu", "sdpa", SPARSE
    )
    with pytest.raises(InvalidInput, match="it has: sparse"):
        check_asks(info, outputs)
    check_asks(info, np.array([SPARSE, SPARSE]))  # accepted


def test_the_words_refuse_a_wrong_count():
    _, words = vocabulary_words(np.array([[0, 1.0, 0]], np.float32))
    with pytest.raises(ValueError):
        read_vocabulary(words, 2)
    with pytest.raises(ValueError):
        read_vocabulary(np.concatenate([words, words[:1]]), 1)


@pytest.mark.gpu
def test_the_graph_replays_what_the_cpu_engine_computes(splade_dir):
    cpu = load_engine(WorkerConfig(model=splade_dir, device="cpu", dtype="float32"))
    # bfloat16: the CUDA engine (graphs, varlen attention) serves half precision
    gpu = load_engine(WorkerConfig(model=splade_dir, device="cuda", dtype="bfloat16", prewarm="none"))
    sequences = _ids(splade_dir, TEXTS)
    lengths = np.array([len(s) for s in sequences])
    ids = np.concatenate(sequences).astype(np.int32)
    want = cpu.step(cpu.pack(ids, lengths)).wait()
    for _ in range(3):  # eager, captured, replayed
        got = gpu.step(gpu.pack(ids, lengths)).wait()
        assert got.shape == want.shape
        cosines = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
        assert cosines.min() >= 0.99  # bf16 against float32
    assert gpu.graphs.num_replays >= 1


def test_check_model_says_sparse_vectors_and_their_routes(splade_dir):
    from kembed.worker.tools.check_model import check

    result = check(splade_dir, load=True)
    assert result.verdict.startswith("servable: sparse vectors (splade ") and result.loaded
    assert result.dimensions == 125 and result.pooling_source == "modules.json"
    assert result.routes is not None and {"POST /v1/embeddings", "POST /embed_sparse"} <= set(result.routes)
    assert not {"POST /embed", "POST /v2/embed", "POST /"} & set(result.routes)


def test_a_transformer_not_for_fill_mask_under_splade_pooling_is_refused_by_name(tmp_path):
    path = build_splade_dir(tmp_path / "s", transformer="Transformer")
    config_file = path / "sentence_bert_config.json"
    config = json.loads(config_file.read_text())
    config["transformer_task"] = "feature-extraction"  # SpladePooling over hidden states: not SPLADE
    config_file.write_text(json.dumps(config))
    with pytest.raises(InvalidInput, match=r"not Transformer \(feature-extraction\), SpladePooling"):
        load_engine(WorkerConfig(model=path, device="cpu", dtype="float32"))
    del config["transformer_task"]
    config_file.write_text(json.dumps(config))
    with pytest.raises(InvalidInput, match=r"not Transformer \(no transformer_task\), SpladePooling"):
        load_engine(WorkerConfig(model=path, device="cpu", dtype="float32"))


def test_a_sparse_pipeline_with_another_module_is_refused_by_name(tmp_path):
    path = build_splade_dir(tmp_path / "s")
    modules_file = path / "modules.json"
    modules = json.loads(modules_file.read_text())
    modules.append(
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
    )
    modules_file.write_text(json.dumps(modules))
    with pytest.raises(InvalidInput, match="not MLMTransformer, SpladePooling, Normalize"):
        load_engine(WorkerConfig(model=path, device="cpu", dtype="float32"))
