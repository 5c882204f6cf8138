"""Our Qwen3 decoder on ragged packed batches against transformers' Qwen3Model on the same random weights."""

import json

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
    num_key_value_heads=2,  # grouped-query attention, as the real 0.6B (16 q / 8 kv heads)
    head_dim=16,  # set explicitly, as Qwen3 does: 4 * 16 = hidden here, but need not be
    intermediate_size=128,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
    # Not the 1e6 default: short test sequences then rotate enough for wrong positions to show.
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    initializer_range=0.1,  # sharper attention than 0.02, so causal and bidirectional differ clearly
    attn_implementation="eager",  # the reference honours an explicit all-visible mask as given
)
# Mixed lengths: a single token, a length repeated, and one past 64 (more than one padded tile).
LENGTHS = np.array([1, 7, 33, 2, 70, 12, 12, 5], np.int32)
# Config flags under which bidirectional Qwen3 embedders ship.
BIDIRECTIONAL_FLAGS = {
    "pplx-embed": {"model_type": "bidirectional_pplx_qwen3", "use_bidirectional_attention": True},
    "use-bidirectional-attention": {"use_bidirectional_attention": True},
    "is-causal-false": {"is_causal": False},
}


def write_model(tmp_path, pooling: str | None, config_overrides: dict | None = None):
    """A random tiny Qwen3Model saved as safetensors, with a sentence-transformers pipeline unless
    `pooling` is None (a bare transformers directory)."""
    torch.manual_seed(0)
    model = transformers.Qwen3Model(transformers.Qwen3Config(**TINY)).eval()
    with torch.no_grad():  # norm weights start at one: randomise them so a misplaced norm shows
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    model.save_pretrained(tmp_path)
    if config_overrides:
        config = json.loads((tmp_path / "config.json").read_text())
        (tmp_path / "config.json").write_text(json.dumps({**config, **config_overrides}))
    if pooling is not None:
        pooling_config = {"word_embedding_dimension": TINY["hidden_size"], "pooling_mode": pooling}
        write_pipeline(tmp_path, pooling_config, normalize=True)
    return model


def reference(model, sequences: list[np.ndarray], pooling: str, causal: bool = True) -> np.ndarray:
    """transformers, one sequence at a time (no padding at all), pooled by hand. Bidirectional: an
    explicit additive mask of zeros (every key visible) replaces the causal one."""
    rows = []
    with torch.no_grad():
        for seq in sequences:
            ids = torch.from_numpy(seq.astype(np.int64))[None]
            mask = None if causal else {"full_attention": torch.zeros(1, 1, len(seq), len(seq))}
            hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state[0].float()
            rows.append({"mean": hidden.mean(0), "last": hidden[-1]}[pooling])
    return torch.stack(rows).numpy()


def embed(tmp_path, backend: str, sequences: list[np.ndarray], dtype: str = "float32"):
    engine = load_engine(WorkerConfig(model=tmp_path, attention_backend=backend, device="cpu", dtype=dtype))
    lengths = np.array([len(s) for s in sequences], np.int32)
    return engine, engine.step(engine.pack(np.concatenate(sequences), lengths)).wait()


def random_sequences(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, TINY["vocab_size"], n).astype(np.int32) for n in LENGTHS]


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


BACKENDS = pytest.mark.parametrize("backend", ["sdpa", "sdpa-padded"])


@BACKENDS
@pytest.mark.parametrize("pooling", ["last", "mean"], ids=["lasttoken", "mean"])
def test_causal_ragged_batch_matches_transformers_per_row(tmp_path, backend, pooling):
    model = write_model(tmp_path, "lasttoken" if pooling == "last" else "mean")
    sequences = random_sequences(1)
    engine, ours = embed(tmp_path, backend, sequences)
    expected = reference(model, sequences, pooling)
    assert ours.shape == expected.shape == (len(LENGTHS), TINY["hidden_size"])
    assert cosine_rows(ours, expected).min() >= MIN_COSINE
    np.testing.assert_allclose(ours, expected, rtol=1e-3, atol=1e-4)  # raw pooled, not just direction
    assert engine.info.pooling == pooling and engine.info.normalize


@BACKENDS
@pytest.mark.parametrize("flags", BIDIRECTIONAL_FLAGS.values(), ids=BIDIRECTIONAL_FLAGS.keys())
def test_bidirectional_ragged_batch_matches_transformers_without_causal_mask(tmp_path, backend, flags):
    model = write_model(tmp_path, "mean", flags)
    sequences = random_sequences(2)
    _, ours = embed(tmp_path, backend, sequences)
    expected = reference(model, sequences, "mean", causal=False)
    assert cosine_rows(ours, expected).min() >= MIN_COSINE
    np.testing.assert_allclose(ours, expected, rtol=1e-3, atol=1e-4)


@BACKENDS
def test_causal_and_bidirectional_differ_except_for_single_tokens(tmp_path, backend):
    causal_dir, bidirectional_dir = tmp_path / "causal", tmp_path / "bidirectional"
    write_model(causal_dir, "mean")
    write_model(bidirectional_dir, "mean", {"use_bidirectional_attention": True})  # same weights
    sequences = random_sequences(3)
    _, causal = embed(causal_dir, backend, sequences)
    _, bidirectional = embed(bidirectional_dir, backend, sequences)
    longer = LENGTHS > 1
    assert cosine_rows(causal[longer], bidirectional[longer]).max() < MIN_COSINE
    np.testing.assert_allclose(causal[~longer], bidirectional[~longer], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_stays_close_to_transformers_in_float32(tmp_path, dtype):
    model = write_model(tmp_path, "lasttoken")
    sequences = random_sequences(4)
    _, ours = embed(tmp_path, "sdpa-padded", sequences, dtype=dtype)
    assert np.isfinite(ours).all()
    # Measured: bfloat16 0.9996, float16 0.99999 (transformers itself in bfloat16: 0.9998).
    assert cosine_rows(ours, reference(model, sequences, "last")).min() >= MIN_COSINE


def test_bare_directory_pools_the_last_token_and_reports_the_config_limits(tmp_path):
    model = write_model(tmp_path, pooling=None)
    sequences = random_sequences(5)
    engine, ours = embed(tmp_path, "sdpa", sequences)
    assert cosine_rows(ours, reference(model, sequences, "last")).min() >= MIN_COSINE
    assert engine.info.dimensions == TINY["hidden_size"]
    assert engine.info.max_sequence_length == TINY["max_position_embeddings"]
    assert engine.info.vocab_size == TINY["vocab_size"]
    assert engine.info.task == "embed"
