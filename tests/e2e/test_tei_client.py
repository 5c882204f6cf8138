"""Hugging Face's own client, `huggingface_hub.InferenceClient(base_url=...)`, as most people call a
TEI server: it posts to the root route. Against a real gateway and real worker processes."""

import httpx
import numpy as np
import pytest
from huggingface_hub import InferenceClient

TEXTS = ["The cat sits on the mat.", "Embeddings map text to vectors.", "東京は日本の首都です。"]


@pytest.fixture
def hf_client(stack):
    return InferenceClient(base_url=stack.url)


def test_feature_extraction_gets_sentence_transformers_vectors(hf_client, reference):
    got = np.asarray(hf_client.feature_extraction(TEXTS), dtype=np.float32)
    expected = reference.encode(TEXTS)
    assert got.shape == expected.shape == (len(TEXTS), 384)
    assert (got * expected).sum(1).min() >= 0.999
    one = np.asarray(hf_client.feature_extraction(TEXTS[0]), dtype=np.float32)
    assert one.shape == (1, 384) and float(one[0] @ expected[0]) >= 0.999


def test_sentence_similarity_is_the_cosine_of_sentence_transformers_vectors(hf_client, reference):
    got = hf_client.sentence_similarity(TEXTS[0], other_sentences=TEXTS[1:])
    vectors = reference.encode(TEXTS)
    np.testing.assert_allclose(got, vectors[1:] @ vectors[0], atol=1e-3)


def test_root_answers_what_the_body_asks_for_and_refuses_what_this_model_cannot(stack):
    embedded = httpx.post(f"{stack.url}/", json={"inputs": ["a", "b"]}, timeout=30)
    assert embedded.status_code == 200 and np.asarray(embedded.json()).shape == (2, 384)
    info = httpx.get(f"{stack.url}/", timeout=30).json()
    assert info["served_model_name"] and info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["auto_truncate"] is True
    rerank = httpx.post(f"{stack.url}/", json={"query": "q", "texts": ["a"]}, timeout=30)
    assert rerank.status_code == 501 and "does not support reranking" in rerank.json()["error"]
    bad = httpx.post(f"{stack.url}/", json=[1, 2], timeout=30)
    assert bad.status_code == 422 and bad.json()["error_type"] == "Validation"


def test_decode_gives_back_the_text_of_tokenize(stack):
    text = "Hello wörld, embeddings!"
    tokens = httpx.post(f"{stack.url}/tokenize", json={"inputs": text}, timeout=30).json()[0]
    ids = [token["id"] for token in tokens]
    decoded = httpx.post(f"{stack.url}/decode", json={"ids": ids}, timeout=30)
    assert decoded.status_code == 200 and decoded.json() == [
        "hello world, embeddings!"
    ]  # uncased, no accents
    both = httpx.post(
        f"{stack.url}/decode", json={"ids": [ids, ids[:2]], "skip_special_tokens": False}, timeout=30
    )
    assert both.json()[0].startswith("[CLS] hello") and len(both.json()) == 2
    bad = httpx.post(f"{stack.url}/decode", json={"ids": [1, 10**9]}, timeout=30)
    assert bad.status_code == 422 and "token id 1000000000 outside" in bad.json()["error"]
