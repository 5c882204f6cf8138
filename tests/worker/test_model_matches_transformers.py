"""Our BERT-family model code on ragged packed batches against transformers on the same random weights."""

import numpy as np
import pytest
import torch
import transformers
from st_pipeline import write_pipeline

from kembed.proto.accuracy import MIN_COSINE
from kembed.worker.config import WorkerConfig
from kembed.worker.engine import load_engine

TINY = dict(
    vocab_size=300,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    max_position_embeddings=80,
)
FAMILIES = {
    "bert": (transformers.BertConfig, transformers.BertModel),
    "roberta": (transformers.RobertaConfig, transformers.RobertaModel),
    "xlm-roberta": (transformers.XLMRobertaConfig, transformers.XLMRobertaModel),
}


def write_model(tmp_path, family: str, pooling: str, normalize: bool):
    config_cls, model_cls = FAMILIES[family]
    torch.manual_seed(0)
    model = model_cls(config_cls(**TINY), add_pooling_layer=False).eval()
    model.save_pretrained(tmp_path)  # safetensors, as hub models ship
    pooling_config = {
        "word_embedding_dimension": TINY["hidden_size"],
        "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean",
        "pooling_mode_lasttoken": pooling == "last",
    }
    write_pipeline(tmp_path, pooling_config, normalize)
    return model


def reference(model, sequences: list[np.ndarray], pooling: str) -> np.ndarray:
    """transformers, one sequence at a time (no padding at all), pooled by hand."""
    rows = []
    with torch.no_grad():
        for seq in sequences:
            hidden = model(input_ids=torch.from_numpy(seq.astype(np.int64))[None]).last_hidden_state[0]
            rows.append({"cls": hidden[0], "mean": hidden.mean(0), "last": hidden[-1]}[pooling])
    return torch.stack(rows).numpy()


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.mark.parametrize("backend", ["sdpa", "sdpa-padded"])
@pytest.mark.parametrize(
    ("family", "pooling"),
    [("bert", "mean"), ("bert", "cls"), ("roberta", "mean"), ("xlm-roberta", "cls"), ("bert", "last")],
    ids=["bert-mean", "bert-cls", "roberta-mean", "xlm-roberta-cls", "bert-last"],
)
def test_ragged_batch_matches_transformers_per_row(tmp_path, family, pooling, backend):
    model = write_model(tmp_path, family, pooling, normalize=True)
    engine = load_engine(WorkerConfig(model=tmp_path, attention_backend=backend, device="cpu"))
    rng = np.random.default_rng(1)
    lengths = np.array(
        [1, 7, 33, 2, 78 - 2 * (family != "bert"), 12, 12], np.int32
    )  # roberta: 2 positions fewer
    sequences = [rng.integers(3, TINY["vocab_size"], n).astype(np.int32) for n in lengths]
    ours = engine.step(engine.pack(np.concatenate(sequences), lengths)).wait()
    expected = reference(model, sequences, pooling)
    assert ours.shape == expected.shape
    assert cosine_rows(ours, expected).min() >= MIN_COSINE
    np.testing.assert_allclose(ours, expected, rtol=1e-3, atol=1e-4)  # raw pooled, not just direction
    assert engine.info.pooling == pooling and engine.info.normalize


def test_same_lengths_take_the_unpadded_path_and_still_match(tmp_path):
    model = write_model(tmp_path, "bert", "mean", normalize=False)
    engine = load_engine(WorkerConfig(model=tmp_path, attention_backend="sdpa-padded", device="cpu"))
    rng = np.random.default_rng(2)
    sequences = [rng.integers(3, 300, 16).astype(np.int32) for _ in range(4)]
    batch = engine.pack(np.concatenate(sequences), np.full(4, 16, np.int32))
    assert batch.meta.pad_index is None
    ours = engine.step(batch).wait()
    assert cosine_rows(ours, reference(model, sequences, "mean")).min() >= MIN_COSINE
    assert not engine.info.normalize


def test_roberta_max_sequence_length_accounts_for_the_position_offset(tmp_path):
    write_model(tmp_path, "roberta", "mean", normalize=True)
    engine = load_engine(WorkerConfig(model=tmp_path, device="cpu"))
    assert engine.info.max_sequence_length == TINY["max_position_embeddings"] - 2


def test_a_one_type_model_ignores_the_second_segment_type_a_raw_client_sends(tmp_path):
    """XLM-R checkpoints have one token type; the edge lets types 0 and 1 through (a pair's two
    segments), and a 1 indexed past the table: an IndexError on the CPU, a device-side assert that
    kills the worker on a GPU. Now every token takes the one row, as with no types at all."""
    torch.manual_seed(0)
    config = transformers.XLMRobertaConfig(**TINY, type_vocab_size=1)
    model = transformers.XLMRobertaModel(config, add_pooling_layer=False).eval()
    model.save_pretrained(tmp_path)
    pooling = {"word_embedding_dimension": TINY["hidden_size"], "pooling_mode_mean_tokens": True}
    write_pipeline(tmp_path, pooling, normalize=False)
    engine = load_engine(WorkerConfig(model=tmp_path, device="cpu", attention_backend="sdpa"))
    lengths = np.array([5, 9], np.int32)
    ids = np.random.default_rng(0).integers(5, 300, int(lengths.sum())).astype(np.int32)
    plain = engine.step(engine.pack(ids, lengths)).wait()
    ones = engine.step(engine.pack(ids, lengths, np.ones_like(ids))).wait()
    np.testing.assert_allclose(ones, plain, rtol=1e-6)
    expected = reference(model, [ids[:5], ids[5:]], "mean")
    assert cosine_rows(plain, expected).min() >= MIN_COSINE
