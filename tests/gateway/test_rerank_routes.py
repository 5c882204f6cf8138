"""TEI's /rerank and the Cohere/Jina-shaped /v1/rerank over fake scoring workers: pair tokenization,
sigmoid or raw scores, ranking, top_n, chunking across replicas, and refusals."""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc
import numpy as np
import pytest
import transformers
from gateway_fakes import BUNDLED_MODEL_DIR, FakeEmbedder, unpack

from kembed.proto import embedder_pb2 as pb

QUERY = "what is the capital of france?"
DOCS = [
    "Paris is the capital and largest city of France.",
    "Berlin is the capital of Germany.",
    "The Eiffel Tower is in Paris.",
    "bananas",
    "",
]


def pair_logit(ids: np.ndarray) -> float:
    """The fake's logit: a function of every id of the pair, so a pair answered out of place shows."""
    return float(int(ids.astype(np.int64).sum()) % 997) / 100 - 5


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


@dataclass
class RecordingScorer(FakeEmbedder):
    """A cross-encoder worker double that records every pair (ids and token types) it scores."""

    task: str = "score"
    num_labels: int = 1
    pairs: list[tuple[list[int], list[int]]] = field(default_factory=list)
    num_score_calls: int = 0

    async def Score(self, request: pb.ScoreRequest, context: grpc.aio.ServicerContext) -> pb.ScoreResponse:
        if self.fail_with is not None:
            await context.abort(self.fail_with, f"fake {self.fail_with.name}")
        self.num_score_calls += 1
        ids = unpack(request.batch)
        types = unpack(pb.TokenBatch(token_ids=request.batch.token_type_ids, lengths=request.batch.lengths))
        self.pairs.extend((i.tolist(), t.tolist()) for i, t in zip(ids, types, strict=True))
        logits = np.array([[pair_logit(i) + j for j in range(self.num_labels)] for i in ids], dtype="<f4")
        return pb.ScoreResponse(scores=logits.tobytes(), num_sequences=len(ids), num_labels=self.num_labels)


@pytest.fixture(scope="module")
def hf_tokenizer():
    return transformers.AutoTokenizer.from_pretrained(str(BUNDLED_MODEL_DIR))


def expected_pairs(hf_tokenizer, docs: list[str], max_length: int = 256) -> tuple[list, list]:
    """What sentence-transformers' CrossEncoder feeds the model: the tokenizer on (query, doc) pairs,
    truncation longest_first at the model's max length."""
    encoded = hf_tokenizer([QUERY] * len(docs), docs, truncation="longest_first", max_length=max_length)
    return encoded["input_ids"], encoded["token_type_ids"]


async def test_pairs_are_tokenized_as_sentence_transformers_cross_encoder_does(gateway_with, hf_tokenizer):
    long_doc = "the capital city " * 300  # past 256 tokens together with the query: truncated
    docs = [*DOCS, long_doc]
    fake = RecordingScorer()
    async with gateway_with(fake) as client:
        response = await client.post("/rerank", json={"query": QUERY, "texts": docs})
    assert response.status_code == 200, response.text
    ids, types = expected_pairs(hf_tokenizer, docs)
    assert [p[0] for p in fake.pairs] == ids
    assert [p[1] for p in fake.pairs] == types  # segment 1 for the document: the worker needs them
    assert len(fake.pairs[-1][0]) == 256


@pytest.mark.parametrize(
    ("options", "finish"),
    [({}, sigmoid), ({"raw_scores": True}, lambda x: x)],
    ids=["sigmoid-by-default", "raw-scores"],
)
async def test_tei_rerank_sorts_by_score_with_tei_fields(gateway_with, hf_tokenizer, options, finish):
    async with gateway_with(RecordingScorer()) as client:
        plain = await client.post("/rerank", json={"query": QUERY, "texts": DOCS, **options})
        with_text = await client.post(
            "/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True, **options}
        )
    logits = np.array([pair_logit(np.array(i)) for i in expected_pairs(hf_tokenizer, DOCS)[0]])
    expected = finish(logits)
    order = sorted(range(len(DOCS)), key=lambda i: -expected[i])
    ranked = plain.json()
    assert [r["index"] for r in ranked] == order
    assert all(set(r) == {"index", "score"} for r in ranked)
    np.testing.assert_allclose([r["score"] for r in ranked], expected[order], rtol=1e-6)
    assert [(r["index"], r["text"]) for r in with_text.json()] == [(i, DOCS[i]) for i in order]


async def test_v1_rerank_has_the_cohere_shape(gateway_with, hf_tokenizer):
    documents = [DOCS[0], {"text": DOCS[1], "title": "ignored"}, *DOCS[2:]]
    async with gateway_with(RecordingScorer()) as client:
        response = await client.post(
            "/v1/rerank",
            json={"model": "fake-minilm", "query": QUERY, "documents": documents, "return_documents": True},
        )
    assert response.status_code == 200, response.text
    body = response.json()
    ids, _ = expected_pairs(hf_tokenizer, DOCS)
    scores = sigmoid(np.array([pair_logit(np.array(i)) for i in ids]))
    order = sorted(range(len(DOCS)), key=lambda i: -scores[i])
    assert set(body) == {"id", "model", "results", "usage"}
    assert body["model"] == "fake-minilm" and len(body["id"]) == 32
    assert body["usage"] == {"total_tokens": sum(len(i) for i in ids)}
    assert [r["index"] for r in body["results"]] == order
    np.testing.assert_allclose([r["relevance_score"] for r in body["results"]], scores[order], rtol=1e-6)
    assert [r["document"] for r in body["results"]] == [{"text": DOCS[i]} for i in order]


@pytest.mark.parametrize(
    ("top_n", "num_results"),
    [(None, 5), (2, 2), (1, 1), (5, 5), (50, 5)],
    ids=["all-by-default", "two", "one", "exactly-all", "more-than-there-are"],
)
async def test_v1_rerank_top_n_keeps_the_best(gateway_with, top_n, num_results):
    async with gateway_with(RecordingScorer()) as client:
        everything = (await client.post("/v1/rerank", json={"query": QUERY, "documents": DOCS})).json()
        response = await client.post("/v1/rerank", json={"query": QUERY, "documents": DOCS, "top_n": top_n})
    results = response.json()["results"]
    assert results == everything["results"][:num_results]
    assert all(set(r) == {"index", "relevance_score"} for r in results)  # no documents unless asked
    assert response.json()["usage"] == everything["usage"]  # every document was scored


async def test_equal_scores_keep_input_order(gateway_with):
    async with gateway_with(RecordingScorer()) as client:
        response = await client.post("/v1/rerank", json={"query": "q", "documents": ["same"] * 4})
    assert [r["index"] for r in response.json()["results"]] == [0, 1, 2, 3]


async def test_large_reranks_are_chunked_over_replicas_and_reassembled_in_order(gateway_with, hf_tokenizer):
    docs = [f"document number {i} " + "word " * (i % 7) for i in range(40)]
    fakes = [RecordingScorer(), RecordingScorer()]
    async with gateway_with(*fakes, chunk_tokens=64, max_chunk_sequences=8) as client:
        response = await client.post("/rerank", json={"query": QUERY, "texts": docs, "raw_scores": True})
    ids, _ = expected_pairs(hf_tokenizer, docs)
    expected = {i: pair_logit(np.array(seq)) for i, seq in enumerate(ids)}
    got = {r["index"]: r["score"] for r in response.json()}
    assert got == pytest.approx(expected, rel=1e-6)
    assert sum(f.num_score_calls for f in fakes) >= 10 and all(f.num_score_calls for f in fakes)


REFUSALS = [
    # (worker, route, body, status, fragment)
    (RecordingScorer(), "/v1/rerank", {"query": "q", "documents": []}, 400, "`documents` must not be empty"),
    (RecordingScorer(), "/v1/rerank", {"query": "q", "documents": [5]}, 400, "documents must be a list"),
    (RecordingScorer(), "/v1/rerank", {"query": "q", "documents": [{}]}, 400, "documents.0"),
    (RecordingScorer(), "/v1/rerank", {"documents": ["a"]}, 400, "query: Field required"),
    (RecordingScorer(), "/v1/rerank", {"query": "q", "documents": ["a"], "top_n": 0}, 400, "top_n"),
    (RecordingScorer(), "/v1/rerank", {"query": "q", "documents": ["a"], "model": "x"}, 404, "`x` does not"),
    (RecordingScorer(), "/rerank", {"query": "q", "texts": "a"}, 422, "texts: Input should be a valid array"),
    (
        RecordingScorer(),
        "/rerank",
        {"query": "q", "texts": ["ok", "word " * 300], "truncate": False},
        413,
        "the pair of the query and texts[1] is 304 tokens, more than the model's limit of 256",
    ),
    (FakeEmbedder(), "/v1/rerank", {"query": "q", "documents": ["a"]}, 501, "it is an embedding model"),
    (
        RecordingScorer(num_labels=3),
        "/rerank",
        {"query": "q", "texts": ["a"]},
        501,
        "classifier with 3 labels",
    ),
    (RecordingScorer(num_labels=3), "/v1/rerank", {"query": "q", "documents": ["a"]}, 501, "3 labels"),
    (
        FakeEmbedder(task="score"),  # a worker whose Score answers UNIMPLEMENTED
        "/v1/rerank",
        {"query": "q", "documents": ["a"]},
        501,
        "does not support reranking",
    ),
    (
        RecordingScorer(fail_with=grpc.StatusCode.INVALID_ARGUMENT),
        "/v1/rerank",
        {"query": "q", "documents": ["a"]},
        400,
        "worker rejected the batch",
    ),
]


@pytest.mark.parametrize(
    ("worker", "route", "body", "status", "fragment"),
    REFUSALS,
    ids=[
        "no-documents",
        "document-not-text",
        "document-object-without-text",
        "no-query",
        "top-n-zero",
        "unknown-model",
        "tei-texts-not-a-list",
        "tei-overlong-pair-untruncated",
        "embedding-model",
        "tei-multi-label-classifier",
        "multi-label-classifier",
        "worker-without-score",
        "worker-rejects-batch",
    ],
)
async def test_rerank_refusals_come_from_the_error_table(gateway_with, worker, route, body, status, fragment):
    async with gateway_with(worker) as client:
        response = await client.post(route, json=body)
    assert response.status_code == status, response.text
    payload = response.json()
    if route.startswith("/v1/"):  # OpenAI's error body, as vLLM answers on its /v1/rerank
        assert set(payload["error"]) == {"message", "type", "param", "code"}
        assert fragment in payload["error"]["message"]
    else:
        assert set(payload) == {"error", "error_type"}
        assert fragment in payload["error"]
