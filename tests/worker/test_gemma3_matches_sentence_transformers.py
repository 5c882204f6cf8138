"""Gemma 3 text encoders (EmbeddingGemma's architecture) on ragged packed batches against
sentence-transformers on the same random weights, through EmbeddingGemma's pipeline: mean pooling,
two Dense layers (64 -> 128 -> 64 here, 768 -> 3072 -> 768 in the real one, identity activations, no
bias), Normalize, and its prompts. The sliding layers' window (`sliding_window` 8: 4 keys either side,
bidirectional) is far shorter than most test texts; `query_pre_attn_scalar` differs from the head
size, so the softmax scale is Gemma's own; the RoPE bases differ between local and global layers."""

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

TINY = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,  # grouped-query attention (EmbeddingGemma: 3 heads over 1)
    head_dim=16,
    query_pre_attn_scalar=32,
    intermediate_size=96,
    max_position_embeddings=512,
    sliding_window=8,
    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
        "full_attention": {"rope_type": "default", "rope_theta": 10000.0},
    },
    use_bidirectional_attention=True,
    pad_token_id=0,
    bos_token_id=101,
    eos_token_id=102,
    initializer_range=0.2,  # sharp attention: a band one key off misses the bar
)
PROMPTS = {"query": "task: search result | query: ", "document": "title: none | text: "}
TEXTS = corpus_texts(40)


def write_embedder(tmp_path, overrides: dict | None = None):
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize

    torch.manual_seed(0)
    config = transformers.Gemma3TextConfig(**{**TINY, **(overrides or {})})
    model = transformers.Gemma3TextModel(config).eval()
    randomise_norms(model, -0.5, 0.5)  # Gemma's norms scale by 1 + weight: zero-initialised
    hf_dir = save_transformer(model, tmp_path / "hf")
    dense = [
        Dense(64, 128, bias=False, activation_function=torch.nn.Identity()),
        Dense(128, 64, bias=False, activation_function=torch.nn.Identity()),
    ]
    return save_sentence_transformer(hf_dir, tmp_path / "st", "mean", [*dense, Normalize()], PROMPTS)


def reference(path, texts, prompt_name: str | None = None):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(path), device="cpu")
    prompt = model.prompts.get(prompt_name or "", "")
    ids = model.tokenizer([prompt + t for t in texts], truncation=True, max_length=256)["input_ids"]
    return model.encode(texts, batch_size=16, prompt_name=prompt_name), ids


@pytest.mark.parametrize("backend", ["sdpa", "sdpa-padded"])
def test_embeddinggemma_pipeline_matches_sentence_transformers(tmp_path, backend):
    path = write_embedder(tmp_path)
    expected, ids = reference(path, TEXTS)
    assert max(len(x) for x in ids) > 4 * TINY["sliding_window"]
    together = engine_rows(path, ids, batch=16, backend=backend)
    alone = engine_rows(path, ids[:8], batch=1, backend=backend)
    assert together.shape == expected.shape == (len(TEXTS), 64)
    assert cosine_rows(together, expected).min() >= MIN_COSINE
    assert cosine_rows(alone, expected[:8]).min() >= MIN_COSINE


def test_prompted_queries_match_sentence_transformers_with_the_prompt(tmp_path):
    """The prompt is the gateway's to prepend (its text from config_sentence_transformers.json): the
    ids of prompt + text give sentence-transformers' rows for prompt_name="query"."""
    path = write_embedder(tmp_path)
    expected, ids = reference(path, TEXTS[:12], prompt_name="query")
    assert cosine_rows(engine_rows(path, ids, batch=12), expected).min() >= MIN_COSINE


def test_a_causal_gemma3_sees_the_window_before_each_query(tmp_path):
    """Without `use_bidirectional_attention` the sliding layers are causal: the query and the
    `sliding_window - 1` tokens before it; no modules.json: last-token pooling, no Dense layers."""
    torch.manual_seed(0)
    config = transformers.Gemma3TextConfig(**{**TINY, "use_bidirectional_attention": False})
    model = transformers.Gemma3TextModel(config).eval()
    randomise_norms(model, -0.5, 0.5)
    path = save_transformer(model, tmp_path / "causal")
    from sentence_transformers import SentenceTransformer

    ids = SentenceTransformer(str(path), device="cpu").tokenizer(TEXTS, truncation=True, max_length=256)[
        "input_ids"
    ]
    with torch.no_grad():
        expected = np.stack(
            [model(input_ids=torch.tensor([x])).last_hidden_state[0, -1].numpy() for x in ids[:16]]
        )
    assert cosine_rows(engine_rows(path, ids[:16], batch=8), expected).min() >= MIN_COSINE


def test_check_model_names_the_family_its_dense_layers_and_prompts(tmp_path):
    from kembed.worker.tools.check_model import check, render

    result = check(write_embedder(tmp_path), load=True)
    assert result.is_servable, result.reason
    assert (result.family, result.pooling, result.dimensions) == ("gemma3", "mean", 64)
    assert [d.split(":")[1].strip() for d in result.dense] == ["64 -> 128, Identity", "128 -> 64, Identity"]
    assert result.prompts == PROMPTS
    assert "2 of 3 layers local (a sliding window of 4 tokens either side)" in render(result)


@pytest.mark.parametrize(
    ("field", "value", "refusal"),
    [
        ("attn_logit_softcapping", 50.0, "attn_logit_softcapping"),
        (
            "rope_parameters",
            {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}},
            "linear",
        ),
    ],
    ids=["softcapping", "scaled-rope"],
)
def test_an_unsupported_gemma3_variant_is_refused_naming_it(tmp_path, field, value, refusal):
    from kembed.worker.config import WorkerConfig
    from kembed.worker.engine import load_engine
    from kembed.worker.errors import InvalidInput

    path = write_embedder(tmp_path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, field: value}))
    with pytest.raises(InvalidInput, match=refusal):
        load_engine(WorkerConfig(model=path, device="cpu"))
