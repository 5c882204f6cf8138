"""Cohere's v2 API (`/v2/embed`, `/v2/rerank`) and v1's embed driven by the real `cohere` clients over fake
workers: every embedding type decodes and agrees with the float vectors, prompts follow `input_type`,
truncation and token limits, ranking, and refusals in Cohere's error shape."""

from __future__ import annotations

import base64
import contextlib
from collections.abc import AsyncIterator

import cohere
import httpx
import numpy as np
import pytest
from gateway_fakes import FakeEmbedder
from sentence_transformers.util.quantization import quantize_embeddings
from test_rerank_routes import DOCS, QUERY, RecordingScorer

from kembed.gateway.api.cohere import encode_types

TEXTS = ["hello world", "x"]
ALL_TYPES = ["float", "int8", "uint8", "binary", "ubinary", "base64"]
PROMPTS = '{"query": "query: ", "passage": "passage: "}'


@contextlib.asynccontextmanager
async def sdk_for(client: httpx.AsyncClient) -> AsyncIterator[cohere.AsyncClientV2]:
    # No retries: a refusal must surface as the SDK's typed error at once.
    yield cohere.AsyncClientV2(
        api_key="unused", base_url="http://gateway", httpx_client=client, max_retries=0
    )


async def openai_vectors(client: httpx.AsyncClient, texts: list[str], **options) -> np.ndarray:
    response = await client.post(
        "/v1/embeddings", json={"input": texts, "encoding_format": "float", **options}
    )
    assert response.status_code == 200, response.text
    return np.array([d["embedding"] for d in response.json()["data"]], dtype=np.float32)


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


async def test_sdk_reads_every_embedding_type_and_float_equals_the_openai_route(gateway_with):
    async with gateway_with(FakeEmbedder()) as client, sdk_for(client) as sdk:
        result = await sdk.embed(
            model="fake-minilm", texts=TEXTS, input_type="search_document", embedding_types=ALL_TYPES
        )
        expected = await openai_vectors(client, TEXTS)
    assert isinstance(result, cohere.EmbedByTypeResponse)
    assert result.response_type == "embeddings_by_type" and result.texts == TEXTS and len(result.id) == 32
    assert result.meta.api_version.version == "2" and result.meta.billed_units.input_tokens == 7
    got = result.embeddings
    np.testing.assert_allclose(got.float_, expected, rtol=1e-6)
    b64 = np.stack([np.frombuffer(base64.b64decode(s), dtype="<f4") for s in got.base64])
    np.testing.assert_array_equal(b64, np.array(got.float_, dtype=np.float32))
    int8, uint8 = np.array(got.int8), np.array(got.uint8)
    assert int8.min() >= -128 and int8.max() <= 127 and uint8.min() >= 0 and uint8.max() <= 255
    np.testing.assert_array_equal(uint8, int8 + 128)
    assert cosine(int8.astype(np.float64), expected).min() > 0.999
    np.testing.assert_array_equal(got.ubinary, quantize_embeddings(expected, precision="ubinary"))
    np.testing.assert_array_equal(got.binary, quantize_embeddings(expected, precision="binary"))


def test_quantized_types_follow_the_signs_and_scale_of_each_row():
    rows = np.random.default_rng(0).standard_normal((16, 20)).astype(np.float32)
    rows[3] = 0.0
    encoded = encode_types(rows, ["int8", "uint8", "binary", "ubinary"])
    int8 = np.asarray(encoded["int8"])
    assert int8.dtype == np.int8 and not int8[3].any()
    assert (np.abs(int8).max(axis=1)[np.arange(16) != 3] == 127).all()  # each row uses the full range
    scaled = rows * 127 / np.maximum(np.abs(rows).max(axis=1, keepdims=True), 1e-12)
    assert np.abs(int8 - scaled).max() <= 0.5  # rounded to nearest on each row's own scale
    np.testing.assert_array_equal(encoded["uint8"], int8.astype(np.int16) + 128)
    # 20 dimensions: 3 bytes, the last one padded with zero bits, as sentence-transformers packs them
    np.testing.assert_array_equal(encoded["ubinary"], quantize_embeddings(rows, precision="ubinary"))
    np.testing.assert_array_equal(encoded["binary"], quantize_embeddings(rows, precision="binary"))
    assert np.asarray(encoded["binary"]).shape == (16, 3)


async def test_output_dimension_truncates_then_renormalises_as_openai_dimensions(gateway_with):
    async with gateway_with(FakeEmbedder()) as client, sdk_for(client) as sdk:
        result = await sdk.embed(
            model="fake-minilm", texts=TEXTS, input_type="clustering", output_dimension=3
        )
        expected = await openai_vectors(client, TEXTS, dimensions=3)
    np.testing.assert_allclose(result.embeddings.float_, expected, rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(result.embeddings.float_, axis=1), 1.0, rtol=1e-6)


async def test_inputs_with_text_content_embed_like_texts(gateway_with):
    inputs = [{"content": [{"type": "text", "text": t}]} for t in TEXTS]
    async with gateway_with(FakeEmbedder()) as client, sdk_for(client) as sdk:
        result = await sdk.embed(model="fake-minilm", inputs=inputs, input_type="search_document")
        expected = await openai_vectors(client, TEXTS)
    np.testing.assert_allclose(result.embeddings.float_, expected, rtol=1e-6)
    assert result.texts == TEXTS


@pytest.mark.parametrize(
    ("input_type", "prompt"),
    [
        ("search_query", "query: "),
        ("search_document", "passage: "),
        ("classification", ""),
        ("clustering", ""),
    ],
    ids=["query-prompt", "document-takes-passage-prompt", "classification-none", "clustering-none"],
)
async def test_input_type_picks_the_models_prompt(gateway_with, input_type, prompt):
    fake = FakeEmbedder()
    async with gateway_with(fake, prompts=PROMPTS) as client, sdk_for(client) as sdk:
        await sdk.embed(model="fake-minilm", texts=["hello world"], input_type=input_type)
        await client.post("/v1/embeddings", json={"input": prompt + "hello world"})
    assert fake.sequences[0] == fake.sequences[1]


@pytest.mark.parametrize(("truncate", "first_word"), [("END", 2023), ("START", 2773)], ids=["end", "start"])
async def test_truncate_end_and_start_keep_the_start_and_the_end(gateway_with, truncate, first_word):
    fake = FakeEmbedder()
    async with gateway_with(fake) as client, sdk_for(client) as sdk:
        await sdk.embed(
            model="fake-minilm", texts=["this " + "word " * 400], input_type="clustering", truncate=truncate
        )
    (sequence,) = fake.sequences
    assert len(sequence) == 256 and sequence[1] == first_word  # 2023 "this", 2773 "word"


async def test_max_tokens_cuts_each_text_before_the_model_limit(gateway_with):
    fake = FakeEmbedder()
    async with gateway_with(fake) as client, sdk_for(client) as sdk:
        await sdk.embed(
            model="fake-minilm",
            texts=["one two three four five", "six"],
            input_type="clustering",
            max_tokens=3,
        )
        await sdk.embed(
            model="fake-minilm",
            texts=["one two three four five"],
            input_type="clustering",
            max_tokens=2,
            truncate="START",
        )
        await client.post("/v1/embeddings", json={"input": ["one two three", "six", "four five"]})
    assert fake.sequences[:3] == fake.sequences[3:]


async def test_sdk_rerank_ranks_like_v1_with_top_n(gateway_with):
    async with gateway_with(RecordingScorer()) as client, sdk_for(client) as sdk:
        result = await sdk.rerank(model="fake-minilm", query=QUERY, documents=DOCS, top_n=3)
        v1 = (await client.post("/v1/rerank", json={"query": QUERY, "documents": DOCS})).json()
    assert isinstance(result, cohere.V2RerankResponse)
    assert [(r.index, r.relevance_score) for r in result.results] == [
        (r["index"], pytest.approx(r["relevance_score"], rel=1e-9)) for r in v1["results"][:3]
    ]
    assert result.meta.api_version.version == "2"
    assert result.meta.billed_units.input_tokens == v1["usage"]["total_tokens"]


async def test_max_tokens_per_doc_cuts_documents_before_pairing(gateway_with):
    long_doc = "the capital city of france is paris " * 20
    cut_fake, plain_fake = RecordingScorer(), RecordingScorer()
    async with gateway_with(cut_fake) as client, sdk_for(client) as sdk:
        await sdk.rerank(
            model="fake-minilm", query=QUERY, documents=[long_doc, "paris"], max_tokens_per_doc=4
        )
    async with gateway_with(plain_fake) as client:
        await client.post("/v1/rerank", json={"query": QUERY, "documents": ["the capital city of", "paris"]})
    assert cut_fake.pairs == plain_fake.pairs


REFUSALS = [
    # (worker, route, body, status, fragment)
    (FakeEmbedder(), "/v2/embed", {"texts": []}, 400, "`texts` must not be empty"),
    (FakeEmbedder(), "/v2/embed", {"texts": ["a"], "inputs": []}, 400, "exactly one of `texts` and `inputs`"),
    (
        FakeEmbedder(),
        "/v2/embed",
        {"inputs": [{"content": [{"type": "image_url", "image_url": {"url": "data:x"}}]}]},
        400,
        "inputs[0].content[0] is an image",
    ),
    (FakeEmbedder(), "/v2/embed", {"images": ["data:x"]}, 400, "images are not supported"),
    (FakeEmbedder(), "/v2/embed", {"texts": ["a"], "input_type": "image"}, 400, "`image` is not supported"),
    (FakeEmbedder(), "/v2/embed", {"texts": ["a"], "embedding_types": ["int4"]}, 400, "embedding_types.0"),
    (FakeEmbedder(), "/v2/embed", {"texts": ["a"], "output_dimension": 9}, 400, "between 1 and 8"),
    (FakeEmbedder(), "/v2/embed", {"texts": ["a"], "model": "embed-v4.0"}, 404, "`embed-v4.0` does not"),
    (
        FakeEmbedder(),
        "/v2/embed",
        {"texts": ["ok", "word " * 300], "truncate": "NONE"},
        413,
        'input 1 has 302 tokens, more than the model\'s limit of 256; send truncate "END" or "START"',
    ),
    (
        FakeEmbedder(),
        "/v2/embed",
        {"texts": ["a b c d"], "truncate": "NONE", "max_tokens": 3},
        413,
        "texts[0] has more than max_tokens=3 tokens",
    ),
    (
        RecordingScorer(),
        "/v2/rerank",
        {"query": "q", "documents": [{"text": "a"}]},
        400,
        "documents[0] is an object",
    ),
    (RecordingScorer(), "/v2/rerank", {"query": "q", "documents": []}, 400, "`documents` must not be empty"),
    (RecordingScorer(), "/v2/rerank", {"query": "q", "documents": ["a"], "top_n": 0}, 400, "top_n"),
    (FakeEmbedder(), "/v2/rerank", {"query": "q", "documents": ["a"]}, 501, "it is an embedding model"),
]


@pytest.mark.parametrize(
    ("worker", "route", "body", "status", "fragment"),
    REFUSALS,
    ids=[
        "no-texts",
        "texts-and-inputs",
        "image-content",
        "images",
        "image-input-type",
        "unknown-embedding-type",
        "output-dimension-too-large",
        "unknown-model",
        "overlong-untruncated",
        "over-max-tokens-untruncated",
        "document-object",
        "no-documents",
        "top-n-zero",
        "embedding-model-reranks",
    ],
)
async def test_refusals_have_cohere_error_shape(gateway_with, worker, route, body, status, fragment):
    async with gateway_with(worker) as client:
        response = await client.post(route, json=body)
    assert response.status_code == status, response.text
    assert set(response.json()) == {"message"}
    assert fragment in response.json()["message"]


async def test_sdk_raises_its_typed_errors(gateway_with):
    async with gateway_with(FakeEmbedder()) as client, sdk_for(client) as sdk:
        with pytest.raises(cohere.BadRequestError) as bad:
            await sdk.embed(model="fake-minilm", texts=["a"], input_type="image")
        with pytest.raises(cohere.NotFoundError):
            await sdk.embed(model="embed-v4.0", texts=["a"], input_type="search_query")
    assert "not supported" in bad.value.body["message"]


async def test_missing_api_key_is_refused_in_cohere_shape(gateway_with):
    async with gateway_with(FakeEmbedder(), api_key="secret") as client:
        refused = await client.post("/v2/embed", json={"texts": ["a"]})
        async with sdk_for(client) as sdk:
            with pytest.raises(cohere.UnauthorizedError):
                await sdk.embed(model="fake-minilm", texts=["a"], input_type="search_query")
    assert refused.status_code == 401 and set(refused.json()) == {"message"}


async def test_wrong_method_and_bad_json_answer_in_cohere_shape(gateway_with):
    async with gateway_with(FakeEmbedder()) as client:
        wrong_method = await client.get("/v2/embed")
        bad_json = await client.post("/v2/rerank", content=b"{", headers={"Content-Type": "application/json"})
    assert wrong_method.status_code == 405 and set(wrong_method.json()) == {"message"}
    assert bad_json.status_code == 400 and "malformed JSON" in bad_json.json()["message"]


async def test_the_v1_client_gets_floats_or_the_types_it_asks_for(gateway_with):
    """Cohere's v1 `Client.embed` (`/v1/embed`): v1's float list without `embedding_types`, v2's
    by-type object with them, the same vectors as the OpenAI route; images and no texts refused."""
    async with gateway_with(FakeEmbedder()) as client:
        sdk = cohere.AsyncClient(
            api_key="unused", base_url="http://gateway", httpx_client=client, max_retries=0
        )
        floats = await sdk.embed(model="fake-minilm", texts=TEXTS, input_type="search_document")
        # by type through plain HTTP: the v1 SDK's merge of typed answers trips pydantic's deprecation
        typed = await client.post("/v1/embed", json={"texts": TEXTS, "embedding_types": ["float", "int8"]})
        expected = await openai_vectors(client, TEXTS)
        with pytest.raises(cohere.BadRequestError):
            await sdk.embed(images=["data:image/png;base64,AAAA"])
        with pytest.raises(cohere.BadRequestError):
            await sdk.embed(texts=TEXTS, input_type="image")
    assert (
        floats.response_type == "embeddings_floats" and typed.json()["response_type"] == "embeddings_by_type"
    )
    got = np.array(floats.embeddings, dtype=np.float32)
    assert cosine(got, expected).min() >= 0.9999
    by_type = typed.json()["embeddings"]
    np.testing.assert_array_equal(np.array(by_type["float"], dtype=np.float32), got)
    np.testing.assert_array_equal(by_type["int8"], encode_types(got, ["int8"])["int8"])
