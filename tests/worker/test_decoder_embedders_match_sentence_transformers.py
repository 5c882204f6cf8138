"""Qwen2 (gte-Qwen2, stella) and EuroBERT embedders on kembed's CPU engine against
`SentenceTransformer(dir).encode` on the same directory: tiny random models saved by
sentence-transformers itself (Transformer, Pooling, [Dense], Normalize), a real BPE tokenizer
(decoder_dirs.py), ragged batches of mixed lengths run together and alone, cosine >= 0.999 per row."""

import json
import shutil

import numpy as np
import pytest
import torch
from decoder_dirs import TEXTS, bpe_tokenizer, save_decoder
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules import Dense, Normalize, Transformer
from sentence_transformers.sentence_transformer.modules import Pooling

from kembed.proto.accuracy import MIN_COSINE
from kembed.worker.config import WorkerConfig
from kembed.worker.engine import load_engine
from kembed.worker.errors import InvalidInput


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def st_directory(tmp_path, family: str, pooling: str, *, dense: int = 0, normalize: bool = True, **config):
    """`family` saved as sentence-transformers saves a SentenceTransformer of it: the model and
    tokenizer in a scratch folder, loaded as a Transformer module, the pipeline around it, `save`."""
    raw, path = tmp_path / "raw", tmp_path / "model"
    raw.mkdir(parents=True)
    save_decoder(raw, family, **config)
    bpe_tokenizer(bos_eos=family == "eurobert").save_pretrained(raw)
    modules = [Transformer(str(raw)), Pooling(64, pooling)]
    if dense:  # stella's shape: a projection after pooling
        torch.manual_seed(1)
        modules.append(Dense(64, dense, activation_function=torch.nn.Identity()))
    if normalize:
        modules.append(Normalize())
    SentenceTransformer(modules=modules, device="cpu").save(str(path))
    shutil.rmtree(raw)
    return path


def encode_both(path, backend: str = "sdpa"):
    """(kembed's rows for TEXTS in one ragged batch, the same texts one at a time, ST's rows)."""
    st = SentenceTransformer(str(path), device="cpu")
    expected = st.encode(TEXTS, convert_to_numpy=True, batch_size=len(TEXTS))
    seqs = [np.asarray(ids, np.int32) for ids in st.tokenize(TEXTS)["input_ids"].tolist()]
    mask = st.tokenize(TEXTS)["attention_mask"].numpy().astype(bool)
    seqs = [s[m] for s, m in zip(seqs, mask, strict=True)]  # ST pads; kembed packs
    engine = load_engine(WorkerConfig(model=path, attention_backend=backend, device="cpu"))
    lengths = np.array([len(s) for s in seqs], np.int32)
    together = engine.step(engine.pack(np.concatenate(seqs), lengths)).wait()
    alone = np.concatenate([engine.step(engine.pack(s, np.array([len(s)], np.int32))).wait() for s in seqs])
    if engine.info.normalize:  # the gateway normalises; here by hand
        together /= np.linalg.norm(together, axis=1, keepdims=True)
        alone /= np.linalg.norm(alone, axis=1, keepdims=True)
    return engine, together, alone, expected


CASES = {
    "gte-qwen2-causal-lasttoken": ("qwen2", "lasttoken", {}, 0),
    "qwen2-is-causal-false-mean": ("qwen2", "mean", {"is_causal": False}, 0),
    "stella-qwen2-mean-dense": ("qwen2", "mean", {}, 32),
    "eurobert-mean": ("eurobert", "mean", {}, 0),
    "eurobert-cls": ("eurobert", "cls", {}, 0),
}


@pytest.mark.parametrize("backend", ["sdpa", "sdpa-padded"])
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_decoder_embedder_matches_sentence_transformers_together_and_alone(tmp_path, case, backend):
    family, pooling, config, dense = case
    path = st_directory(tmp_path, family, pooling, dense=dense, **config)
    engine, together, alone, expected = encode_both(path, backend)
    assert together.shape == expected.shape == (len(TEXTS), dense or 64)
    assert cosine_rows(together, expected).min() >= MIN_COSINE
    assert cosine_rows(alone, expected).min() >= MIN_COSINE
    np.testing.assert_allclose(together, expected, rtol=1e-3, atol=1e-4)
    assert engine.info.model_type == family and engine.info.pooling == pooling.replace("lasttoken", "last")


def test_qwen2_causality_follows_the_config_and_sentence_transformers_agrees(tmp_path):
    """The same weights causal and with `is_causal: false`: sentence-transformers (transformers >= 5.2
    honours the flag) gives different vectors, and kembed gives each of them."""
    causal = st_directory(tmp_path / "c", "qwen2", "mean")
    bidirectional = st_directory(tmp_path / "b", "qwen2", "mean", is_causal=False)
    assert json.loads((bidirectional / "config.json").read_text())["is_causal"] is False
    _, ours_causal, _, st_causal = encode_both(causal)
    _, ours_bidirectional, _, st_bidirectional = encode_both(bidirectional)
    longer = np.array([len(t) > 5 for t in TEXTS])
    assert cosine_rows(st_causal[longer], st_bidirectional[longer]).max() < MIN_COSINE
    assert cosine_rows(ours_causal, st_causal).min() >= MIN_COSINE
    assert cosine_rows(ours_bidirectional, st_bidirectional).min() >= MIN_COSINE


def test_qwen2_biases_are_read(tmp_path):
    """q/k/v biases really load (the random biases of decoder_dirs would be lost to zeros otherwise):
    the same directory with its biases zeroed gives other vectors."""
    path = st_directory(tmp_path, "qwen2", "lasttoken")
    _, with_biases, _, _ = encode_both(path)
    from safetensors.torch import load_file, save_file

    weights = load_file(path / "model.safetensors")
    save_file(
        {k: (v * 0 if k.endswith("bias") else v) for k, v in weights.items()}, path / "model.safetensors"
    )
    _, without, _, _ = encode_both(path)
    assert cosine_rows(with_biases, without).min() < MIN_COSINE


@pytest.mark.parametrize(
    ("family", "config", "refusal"),
    [
        ("qwen2", {"use_sliding_window": True, "sliding_window": 8}, "sliding-window attention"),
        ("qwen2", {"hidden_act": "gelu"}, "unsupported hidden_act 'gelu'"),
        (
            "eurobert",
            {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}},
            "rope type 'linear'",
        ),
    ],
    ids=["qwen2-sliding-window", "qwen2-gelu", "eurobert-scaled-rope"],
)
def test_an_unsupported_variant_is_refused_at_start_naming_it(tmp_path, family, config, refusal):
    save_decoder(tmp_path, family)
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), **config}))
    with pytest.raises(InvalidInput, match=refusal):
        load_engine(WorkerConfig(model=tmp_path, device="cpu"))
