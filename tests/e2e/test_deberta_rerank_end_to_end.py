"""A DeBERTa-v3 reranker (mxbai-rerank-v1's architecture, tiny random weights, the bundled tokenizer)
through a real CPU worker and gateway: `/rerank` scores every document as
`CrossEncoder(dir).predict` does (within 1 %), in its order."""

import importlib.util
from itertools import pairwise
from pathlib import Path

import httpx
import numpy as np
import pytest
from corpus import texts
from processes import start_stack

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = texts(24, seed=5)


def _bias_models():
    """tests/worker/bias_models.py (the worker tests' model builders), loaded by path."""
    spec = importlib.util.spec_from_file_location("bias_models", REPO / "tests" / "worker" / "bias_models.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def deberta_stack(log_dir, tmp_path_factory):
    models = _bias_models()
    path = models.write_deberta_reranker(tmp_path_factory.mktemp("deberta") / "mxbai-rerank-tiny", "v3")
    started = start_stack(log_dir, num_workers=1, model_dir=path, worker_model_dir=path)
    yield path, started, models.MAX_LENGTH
    for proc in started.processes:
        proc.stop()


def test_deberta_rerank_matches_cross_encoder_predict(deberta_stack):
    import torch
    from sentence_transformers import CrossEncoder

    path, stack, max_length = deberta_stack
    query = "how does a disentangled attention score positions?"
    model = CrossEncoder(str(path), device="cpu", max_length=max_length)
    expected = model.predict([(query, doc) for doc in DOCUMENTS], activation_fn=torch.nn.Identity())
    with httpx.Client(base_url=stack.url, timeout=60) as http:
        response = http.post("/rerank", json={"query": query, "texts": DOCUMENTS, "raw_scores": True})
    assert response.status_code == 200, response.text
    ranked = response.json()
    scores = np.array([r["score"] for r in sorted(ranked, key=lambda r: r["index"])])
    np.testing.assert_allclose(scores, expected, rtol=1e-2, atol=1e-2 * np.abs(expected).max())
    order = [r["index"] for r in ranked]
    assert sorted(order) == list(range(len(DOCUMENTS)))
    assert all(scores[a] >= scores[b] for a, b in pairwise(order))  # best first
