"""Reranking through real processes: two CPU workers serving a cross-encoder behind a gateway, scored
against sentence-transformers' `CrossEncoder(dir).predict` on the same directory, pair by pair."""

from itertools import pairwise

import httpx
import numpy as np
import pytest
import torch
from corpus import texts
from processes import CROSS_ENCODER_MAX_LENGTH

# Long enough, with the query, to pass the 128-token limit (truncated alike); empty and whitespace too.
DOCUMENTS = texts(48, seed=11)
QUERIES = ["how does the gateway balance replicas?", "Kubernetes operator rollout", "", "naïve café ☕"]
MAX_LENGTH = CROSS_ENCODER_MAX_LENGTH  # the cross_encoder_dir fixture's (conftest.py)


@pytest.fixture(scope="session")
def cross_encoder(cross_encoder_dir):
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(cross_encoder_dir), device="cpu", local_files_only=True)


@pytest.fixture
def rerank_client(rerank_stack):
    with httpx.Client(base_url=rerank_stack.url, timeout=60) as http:
        yield http


def assert_same_ranking(order: list[int], reference: np.ndarray, tolerance: float = 1e-5) -> None:
    """`order` sorts `reference` descending, up to ties within `tolerance`."""
    assert sorted(order) == list(range(len(reference)))
    gaps = [reference[a] - reference[b] for a, b in pairwise(order)]
    assert min(gaps) >= -tolerance, f"out of order by {min(gaps)}"


def test_documents_reach_past_the_limit_and_the_worker_is_a_scorer(rerank_client, cross_encoder):
    lengths = [
        len(ids) for ids in cross_encoder.tokenizer([QUERIES[0]] * len(DOCUMENTS), DOCUMENTS)["input_ids"]
    ]
    assert sum(n > MAX_LENGTH for n in lengths) >= 5  # truncation is exercised
    assert cross_encoder.max_seq_length == MAX_LENGTH and cross_encoder.num_labels == 1
    info = rerank_client.get("/info").json()
    assert "reranker" in info["model_type"] and info["max_input_length"] == MAX_LENGTH


@pytest.mark.parametrize("query", QUERIES, ids=["question", "keywords", "empty", "accents-emoji"])
def test_tei_rerank_matches_cross_encoder_predict(rerank_client, cross_encoder, query):
    expected = cross_encoder.predict([(query, doc) for doc in DOCUMENTS], batch_size=16)
    response = rerank_client.post("/rerank", json={"query": query, "texts": DOCUMENTS, "return_text": True})
    assert response.status_code == 200, response.text
    ranked = response.json()
    scores = np.array([r["score"] for r in sorted(ranked, key=lambda r: r["index"])])
    np.testing.assert_allclose(scores, expected, rtol=1e-4, atol=1e-5)
    assert_same_ranking([r["index"] for r in ranked], expected)
    assert all(r["text"] == DOCUMENTS[r["index"]] for r in ranked)


def test_tei_raw_scores_are_the_logits(rerank_client, cross_encoder):
    query = QUERIES[0]
    logits = cross_encoder.predict([(query, doc) for doc in DOCUMENTS], activation_fn=torch.nn.Identity())
    response = rerank_client.post("/rerank", json={"query": query, "texts": DOCUMENTS, "raw_scores": True})
    ranked = response.json()
    scores = np.array([r["score"] for r in sorted(ranked, key=lambda r: r["index"])])
    np.testing.assert_allclose(scores, logits, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("top_n", [None, 5], ids=["all", "top-5"])
def test_v1_rerank_matches_cross_encoder_rank(rerank_client, cross_encoder, top_n):
    query = QUERIES[1]
    expected = cross_encoder.predict([(query, doc) for doc in DOCUMENTS])
    reference = cross_encoder.rank(query, DOCUMENTS, top_k=top_n)  # [{corpus_id, score}] best first
    documents = [doc if i % 2 else {"text": doc} for i, doc in enumerate(DOCUMENTS)]
    body = {"query": query, "documents": documents, "top_n": top_n, "return_documents": True}
    response = rerank_client.post("/v1/rerank", json=body)
    assert response.status_code == 200, response.text
    payload = response.json()
    results = payload["results"]
    assert len(results) == len(reference)
    for result, ref in zip(results, reference, strict=True):
        assert result["relevance_score"] == pytest.approx(
            float(expected[result["index"]]), rel=1e-4, abs=1e-5
        )
        assert result["relevance_score"] == pytest.approx(float(ref["score"]), rel=1e-4, abs=1e-5)
        assert result["document"] == {"text": DOCUMENTS[result["index"]]}
    if top_n is None:
        assert_same_ranking([r["index"] for r in results], expected)
    assert payload["usage"]["total_tokens"] == sum(
        min(len(ids), MAX_LENGTH)
        for ids in cross_encoder.tokenizer([query] * len(DOCUMENTS), DOCUMENTS)["input_ids"]
    )


def test_the_cross_encoder_refuses_embeddings_and_the_embedder_refuses_reranks(rerank_client, client):
    embed = rerank_client.post("/v1/embeddings", json={"input": "hello"})
    assert embed.status_code == 501, embed.text
    rerank = client.post("/v1/rerank", json={"query": "q", "documents": ["a"]})
    assert rerank.status_code == 501 and "embedding model" in rerank.json()["error"]["message"]
