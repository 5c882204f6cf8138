"""An LLM reranker through real processes: a CPU worker serving a tiny random Qwen3ForCausalLM that
sentence-transformers saved as a CrossEncoder (LogitScore, Qwen3-Reranker's chat template) behind a
gateway on the same directory; /rerank, /v1/rerank and /v2/rerank against `CrossEncoder(dir).predict`,
scores within 1 %."""

import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from processes import start_stack

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))
from decoder_dirs import QWEN3_RERANKER_TEMPLATE, reranker_dir

QUERY = "what is the capital of france?"
DOCUMENTS = [
    "paris",
    "paris is the capital and the largest city of france " * 3,
    "the quick brown fox jumps over the lazy dog",
    "",
    "kembed serves text embeddings and relevance scores from GPU workers, " * 6,  # past the 160-token limit
]
MAX_LENGTH = 160


@pytest.fixture(scope="module")
def reranker_path(tmp_path_factory) -> Path:
    return reranker_dir(
        tmp_path_factory.mktemp("llm-reranker"), "qwen3", QWEN3_RERANKER_TEMPLATE, max_length=MAX_LENGTH
    )


@pytest.fixture(scope="module")
def expected(reranker_path) -> np.ndarray:
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(reranker_path), device="cpu")
    scores: np.ndarray = model.predict([(QUERY, d) for d in DOCUMENTS])  # the saved activation: sigmoid
    return scores


@pytest.fixture(scope="module")
def http(log_dir, reranker_path):
    stack = start_stack(log_dir, num_workers=1, model_dir=reranker_path, worker_model_dir=reranker_path)
    try:
        with httpx.Client(base_url=stack.url, timeout=60) as client:
            yield client
    finally:
        for proc in stack.processes:
            proc.stop()


def test_tei_rerank_matches_cross_encoder_predict(http, expected):
    info = http.get("/info").json()
    assert info["max_input_length"] == MAX_LENGTH
    response = http.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS})
    assert response.status_code == 200, response.text
    scores = np.array([r["score"] for r in sorted(response.json(), key=lambda r: r["index"])])
    np.testing.assert_allclose(scores, expected, rtol=1e-2, atol=1e-5)


def test_openai_and_cohere_rerank_match_cross_encoder_predict(http, expected):
    for route in ("/v1/rerank", "/v2/rerank"):
        body = {"query": QUERY, "documents": DOCUMENTS, "model": http.get("/info").json()["model_id"]}
        response = http.post(route, json=body)
        assert response.status_code == 200, (route, response.text)
        results = response.json()["results"]
        scores = np.array([r["relevance_score"] for r in sorted(results, key=lambda r: r["index"])])
        np.testing.assert_allclose(scores, expected, rtol=1e-2, atol=1e-5)
        assert [r["index"] for r in results] == list(np.argsort(-expected, kind="stable"))


def test_raw_scores_are_logit_yes_minus_logit_no(http, reranker_path):
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(reranker_path), device="cpu")
    logits = model.predict([(QUERY, d) for d in DOCUMENTS], activation_fn=torch.nn.Identity())
    response = http.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS, "raw_scores": True})
    scores = np.array([r["score"] for r in sorted(response.json(), key=lambda r: r["index"])])
    np.testing.assert_allclose(scores, logits, rtol=1e-2, atol=1e-4)
