"""Successful answers have the OpenAI and TEI shapes their clients expect."""

from __future__ import annotations

import numpy as np
import openai
import pytest
from gateway_fakes import DIMENSIONS, FakeEmbedder, fake_vector

TEXT_IDS = {"hello world": [101, 7592, 2088, 102], "x": [101, 1060, 102]}


def normalised(rows: list[list[int]], dimensions: int = DIMENSIONS) -> np.ndarray:
    raw = np.stack([fake_vector(np.array(ids))[:dimensions] for ids in rows])
    return raw / np.linalg.norm(raw, axis=1, keepdims=True)


@pytest.mark.parametrize("encoding_format", ["base64", "float"], ids=["sdk-default-base64", "float"])
async def test_openai_sdk_reads_embeddings(gateway_with, encoding_format):
    async with gateway_with(FakeEmbedder()) as client:
        sdk = openai.AsyncOpenAI(base_url="http://gateway/v1", api_key="unused", http_client=client)
        options = {} if encoding_format == "base64" else {"encoding_format": "float"}
        result = await sdk.embeddings.create(model="fake-minilm", input=list(TEXT_IDS), **options)
    assert [item.index for item in result.data] == [0, 1]
    np.testing.assert_allclose(
        [item.embedding for item in result.data], normalised(list(TEXT_IDS.values())), rtol=1e-6
    )
    assert result.model == "fake-minilm"
    assert result.usage.prompt_tokens == result.usage.total_tokens == 7


async def test_openai_dimensions_truncate_then_renormalise(gateway_with):
    async with gateway_with(FakeEmbedder()) as client:
        response = await client.post(
            "/v1/embeddings",
            json={"input": "hello world", "dimensions": 3, "user": "u1"},
        )
    (item,) = response.json()["data"]
    np.testing.assert_allclose([item["embedding"]], normalised([TEXT_IDS["hello world"]], 3), rtol=1e-6)


async def test_openai_route_returns_raw_vectors_for_a_model_without_normalize(gateway_with):
    async with gateway_with(FakeEmbedder(normalize=False)) as client:
        response = await client.post("/v1/embeddings", json={"input": [[5, 6, 7]]})
    np.testing.assert_allclose([response.json()["data"][0]["embedding"]], [fake_vector(np.array([5, 6, 7]))])


async def test_served_name_aliases_are_accepted_and_listed(gateway_with):
    async with gateway_with(
        FakeEmbedder(), served_model_names=("minilm", "text-embedding-3-small")
    ) as client:
        response = await client.post("/v1/embeddings", json={"input": "x", "model": "text-embedding-3-small"})
        models = (await client.get("/v1/models")).json()
    assert response.status_code == 200 and response.json()["model"] == "minilm"
    assert [m["id"] for m in models["data"]] == ["minilm", "text-embedding-3-small"]
    assert models["object"] == "list" and models["data"][0]["object"] == "model"


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, normalised([TEXT_IDS["hello world"]])),
        ({"normalize": False}, [fake_vector(np.array(TEXT_IDS["hello world"]))]),
        ({"dimensions": 2}, normalised([TEXT_IDS["hello world"]], 2)),
        ({"prompt_name": "query", "truncation_direction": "Left"}, normalised([TEXT_IDS["hello world"]])),
    ],
    ids=["normalised-by-default", "raw-when-normalize-false", "dimensions", "empty-query-prompt-left"],
)
async def test_tei_embed_returns_a_list_of_vectors(gateway_with, options, expected):
    async with gateway_with(FakeEmbedder()) as client:
        response = await client.post("/embed", json={"inputs": "hello world", **options})
    assert response.status_code == 200
    np.testing.assert_allclose(response.json(), expected, rtol=1e-6)


@pytest.mark.parametrize(("direction", "kept"), [("right", 2023), ("Left", 2773)], ids=["right", "left"])
async def test_long_inputs_are_truncated_to_the_model_limit(gateway_with, direction, kept):
    fake = FakeEmbedder()
    async with gateway_with(fake) as client:
        text = "this " + "word " * 400
        response = await client.post(
            "/embed", json={"inputs": text, "truncation_direction": direction, "normalize": False}
        )
        usage = (await client.post("/v1/embeddings", json={"input": text})).json()["usage"]
    vector = response.json()[0]
    assert vector[0] == 256 and vector[1] == 101 and vector[2] == 102  # length, [CLS], [SEP]
    assert fake.batches[0] == [256] and usage["prompt_tokens"] == 256
    assert fake.sequences[0][1] == kept  # right keeps the leading "this", left drops it


async def test_tokenize_returns_tokens_per_input(gateway_with):
    async with gateway_with(FakeEmbedder()) as client:
        with_special = (await client.post("/tokenize", json={"inputs": ["hello world", "x"]})).json()
        without = (
            await client.post("/tokenize", json={"inputs": "hello world", "add_special_tokens": False})
        ).json()
    assert [[t["id"] for t in tokens] for tokens in with_special] == list(TEXT_IDS.values())
    assert without == [
        [
            {"id": 7592, "text": "hello", "special": False, "start": 0, "stop": 5},
            {"id": 2088, "text": "world", "special": False, "start": 6, "stop": 11},
        ]
    ]


async def test_info_describes_model_limits_and_workers(gateway_with):
    async with gateway_with(FakeEmbedder(), FakeEmbedder()) as client:
        info = (await client.get("/info")).json()
    assert info["model_id"] == "fake-minilm"
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_input_length"] == 256 and info["max_client_batch_size"] == 2048
    assert (
        info["dimensions"] == DIMENSIONS and info["device"] == "cpu" and info["attention_backend"] == "sdpa"
    )
    assert len(info["workers"]) == 2 and all(w["serving"] for w in info["workers"])
    for key in ("model_dtype", "max_batch_tokens", "tokenization_workers", "version"):
        assert key in info


async def test_health_and_ready_when_serving(gateway_with):
    async with gateway_with(FakeEmbedder()) as client:
        assert (await client.get("/health")).json() == {"status": "ok"}
        assert (await client.get("/ready")).json() == {"status": "ready"}


@pytest.mark.parametrize(
    ("options", "first"),
    [
        ({}, {"index": 1, "score": pytest.approx(1 / (1 + np.exp(0.1)))}),
        (
            {"raw_scores": True, "return_text": True},
            {"index": 1, "score": pytest.approx(-0.1), "text": "a b c d e"},
        ),
    ],
    ids=["sigmoid-scores", "raw-scores-with-text"],
)
async def test_rerank_ranks_texts_by_score_on_a_scoring_worker(gateway_with, options, first):
    # The fake's logit is length / 10 - 1: [CLS] q [SEP] a b c d e [SEP] is 9 tokens, -0.1; the longer wins.
    async with gateway_with(FakeEmbedder(task="score", num_labels=1)) as client:
        response = await client.post("/rerank", json={"query": "q", "texts": ["a", "a b c d e"], **options})
    assert response.status_code == 200
    ranked = response.json()
    assert ranked[0] == first and [r["index"] for r in ranked] == [1, 0]
