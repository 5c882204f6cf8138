"""Mistral decoders (e5-mistral's architecture) on ragged packed batches against sentence-transformers
on the same random weights: causal attention within a sliding window (`sliding_window` 8: the query
and the 7 tokens before it, far fewer than most test texts), grouped-query attention, last-token
pooling, Normalize.

The tokenizer is e5-mistral's kind: a byte-pair Llama tokenizer whose `tokenizer.json` post-processor
writes `<s> $A </s>`, so the pooled last token is `</s>`, and whose tokenizer_config.json says
`add_eos_token`. The gateway tokenizes with the `tokenizers` library from tokenizer.json alone; the
ids it makes are the ids sentence-transformers (transformers 5) makes, checked here: with the
post-processor's `</s>`, and without it (transformers 5 then appends no `</s>` either, whatever
`add_eos_token` says), so kembed pools the token sentence-transformers pools."""

import json

import numpy as np
import pytest
import torch
import transformers
from real_minilm import corpus_texts
from st_directories import cosine_rows, engine_rows, randomise_norms, save_sentence_transformer
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from kembed.proto.accuracy import MIN_COSINE

TEXTS = corpus_texts(40)
TINY = dict(
    vocab_size=400,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
    max_position_embeddings=512,
    sliding_window=8,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    initializer_range=0.2,
)


def write_tokenizer(path, with_eos: bool) -> None:
    """A Llama-style BPE tokenizer trained on the test texts: `<s> $A </s>` (or `<s> $A`)."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=TINY["vocab_size"], special_tokens=["<unk>", "<s>", "</s>"])
    tokenizer.train_from_iterator(TEXTS, trainer)
    template = "<s> $A </s>" if with_eos else "<s> $A"
    special = [("<s>", 1), ("</s>", 2)] if with_eos else [("<s>", 1)]
    tokenizer.post_processor = processors.TemplateProcessing(single=template, special_tokens=special)
    tokenizer.save(str(path / "tokenizer.json"))
    config = {
        "tokenizer_class": "LlamaTokenizer",
        "add_bos_token": True,
        "add_eos_token": True,  # as e5-mistral's says; transformers 5 follows tokenizer.json
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<unk>",
        "model_max_length": 512,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config))


def write_embedder(tmp_path, *, with_eos: bool = True, overrides: dict | None = None):
    from sentence_transformers.sentence_transformer.modules import Normalize

    torch.manual_seed(0)
    model = transformers.MistralModel(transformers.MistralConfig(**{**TINY, **(overrides or {})})).eval()
    randomise_norms(model, 0.5, 1.5)
    hf_dir = tmp_path / "hf"
    model.save_pretrained(hf_dir)
    write_tokenizer(hf_dir, with_eos)
    return save_sentence_transformer(hf_dir, tmp_path / "st", "lasttoken", [Normalize()])


def reference(path, texts):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(path), device="cpu")
    ids = model.tokenizer(texts, truncation=True, max_length=256)["input_ids"]
    return model.encode(texts, batch_size=16), ids


def gateway_ids(path, texts) -> list[list[int]]:
    """What the gateway makes of the texts: tokenizer.json through the `tokenizers` library, its
    stored padding and truncation cleared (gateway/tokenizing/tokenizer_load.py)."""
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return [tokenizer.encode(text).ids[:256] for text in texts]


@pytest.mark.parametrize("backend", ["sdpa", "sdpa-padded"])
def test_mistral_sliding_window_matches_sentence_transformers(tmp_path, backend):
    path = write_embedder(tmp_path)
    expected, ids = reference(path, TEXTS)
    assert max(len(x) for x in ids) > 4 * TINY["sliding_window"] and all(x[-1] == 2 for x in ids)
    together = engine_rows(path, ids, batch=16, backend=backend)
    alone = engine_rows(path, ids[:8], batch=1, backend=backend)
    assert cosine_rows(together, expected).min() >= MIN_COSINE
    assert cosine_rows(alone, expected[:8]).min() >= MIN_COSINE


@pytest.mark.parametrize("with_eos", [True, False], ids=["post-processor-eos", "no-post-processor-eos"])
def test_the_gateway_makes_the_ids_sentence_transformers_makes(tmp_path, with_eos):
    path = write_embedder(tmp_path, with_eos=with_eos)
    short = [t for t in TEXTS if len(t) < 400]  # the gateway truncates by its own rule; not this test's
    _, ids = reference(path, short)
    assert gateway_ids(path, short) == ids
    assert all((x[-1] == 2) == with_eos for x in ids)


def test_without_a_window_every_key_before_the_query_is_seen(tmp_path):
    """`sliding_window: null` is full causal attention; the engine then differs from the windowed
    model on texts past the window, and matches sentence-transformers."""
    path = write_embedder(tmp_path, overrides={"sliding_window": None})
    expected, ids = reference(path, TEXTS)
    full = engine_rows(path, ids, batch=16)
    assert cosine_rows(full, expected).min() >= MIN_COSINE
    windowed = engine_rows(write_embedder(tmp_path / "windowed"), ids, batch=16)
    long = np.array([len(x) for x in ids]) > 40
    assert cosine_rows(full[long], windowed[long]).max() < 0.9999


def test_check_model_names_the_family_and_its_window(tmp_path):
    from kembed.worker.tools.check_model import check, render

    result = check(write_embedder(tmp_path), load=True)
    assert result.is_servable, result.reason
    assert (result.family, result.pooling, result.dimensions) == ("mistral", "last", 64)
    assert "causal; every layer a sliding window of 8 tokens (the query and 7 before it)" in render(result)
