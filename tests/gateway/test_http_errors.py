"""Every bad input gets its status from the one error table, in the body shape of the route's API."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import orjson
import pytest
from gateway_fakes import FakeEmbedder
from gateway_harness import until_ready

from kembed.gateway import errors
from kembed.gateway.api import openapi
from kembed.gateway.errors import Flavour, render

LONG = "word " * 400
CASES = [
    # (route, raw body, status, fragment of the message)
    ("/v1/embeddings", b'{"input": ', 400, "malformed JSON"),
    ("/v1/embeddings", b"[1, 2]", 400, "body: Input should be an object"),
    ("/v1/embeddings", b"{}", 400, "input: Field required"),
    ("/v1/embeddings", b'{"input": 5}', 400, "input.str: Input should be a valid string"),
    ("/v1/embeddings", b'{"input": [true]}', 400, "input.list[int].0"),
    ("/v1/embeddings", b'{"input": []}', 400, "`input` must not be empty"),
    ("/v1/embeddings", b'{"input": [[]]}', 400, "input 0 is an empty list of token ids"),
    ("/v1/embeddings", b'{"input": [[1, 99999]]}', 400, "input 0 has token id 99999 outside [0, 30522)"),
    # tiktoken's ids (langchain-openai's default): the message says how to send text instead
    (
        "/v1/embeddings",
        b'{"input": [[791, 8415, 100255]]}',
        400,
        "OpenAIEmbeddings(..., check_embedding_ctx_length=False)",
    ),
    ("/embed", b'{"inputs": [[791, 100255]]}', 422, "must come from this model's own tokenizer (30522 ids)"),
    (
        "/v1/embeddings",
        b'{"input": [[1, 9223372036854775808]]}',
        400,
        "input 0 has token id 9223372036854775808 outside [0, 30522)",
    ),
    ("/embed", b'{"inputs": [[-9223372036854775809]]}', 422, "token id -9223372036854775809 outside"),
    ("/v1/embeddings", b'{"input": "a", "encoding_format": "hex"}', 400, "encoding_format"),
    ("/v1/embeddings", b'{"input": "a", "dimensions": 0}', 400, "dimensions must be between 1 and 8, got 0"),
    ("/v1/embeddings", b'{"input": "a", "dimensions": 9}', 400, "dimensions must be between 1 and 8, got 9"),
    ("/v1/embeddings", b'{"input": "a", "dimensions": "4"}', 400, "dimensions"),
    ("/v1/embeddings", b'{"input": "a", "model": "gpt-4"}', 404, "The model `gpt-4` does not exist."),
    ("/v1/embeddings", b'{"input": "a", "prompt_name": "nope"}', 400, "unknown prompt_name 'nope'"),
    (
        "/v1/embeddings",
        orjson.dumps({"input": ["a"] * 2049}),
        413,
        "2049 inputs is more than the limit of 2048",
    ),
    ("/v1/embeddings", orjson.dumps({"input": "a" * (8 * 1024 * 1024)}), 413, "larger than the limit"),
    ("/embed", b"{}", 422, "inputs: Field required"),
    ("/embed", orjson.dumps({"inputs": LONG, "truncate": False}), 413, "input 0 has 402 tokens"),
    (
        "/embed",
        orjson.dumps({"inputs": ["ok", "word " * 1_000_000], "truncate": False}),
        413,
        "input 1 has more than 256 tokens (at least",  # counted from a window, not from all of its 5 MB
    ),
    (
        "/embed",
        orjson.dumps({"inputs": ["ok", "x" * 1_000_000], "truncate": False}),
        413,
        "input 1 has 1000000 characters, more than the 65536",  # one word: never tokenized whole
    ),
    ("/embed", orjson.dumps({"inputs": ["ok", [1] * 300], "truncate": False}), 413, "input 1 has 300 tokens"),
    ("/embed", b'{"inputs": "a", "truncation_direction": "middle"}', 422, "truncation_direction"),
    ("/embed", b'{"inputs": "a", "normalize": "yes"}', 422, "normalize: Input should be a valid boolean"),
    ("/embed", b'{"inputs": [[-1]]}', 422, "token id -1"),
    ("/tokenize", b'{"inputs": []}', 422, "`inputs` must not be empty"),
    ("/tokenize", b'{"inputs": [1]}', 422, "inputs"),
    ("/tokenize", b'{"inputs": "a", "prompt_name": "nope"}', 422, "unknown prompt_name"),
    (
        "/tokenize",
        orjson.dumps({"inputs": ["a b", "c " * 140_000]}),
        413,
        "/tokenize takes at most 262144 characters per request, got 280003",
    ),
    (  # within the character cap, past the token cap: CJK is about a token a character
        "/tokenize",
        orjson.dumps({"inputs": ["a b", "東京大学语义检索" * 9_000]}),
        413,
        "/tokenize answers at most 65536 tokens per request, all inputs together; inputs[1]",
    ),
    ("/decode", orjson.dumps({"ids": [[1000] * 40_000, [1000] * 30_000]}), 413, "at most 65536 ids"),
    ("/rerank", b'{"query": "q", "texts": []}', 422, "`texts` must not be empty"),
    ("/rerank", b'{"query": "q", "texts": ["a"]}', 501, "does not support reranking"),
]


@pytest.mark.parametrize(
    ("route", "body", "status", "fragment"),
    CASES,
    ids=[
        "malformed-json",
        "body-not-object",
        "missing-input",
        "input-number",
        "input-bools",
        "input-empty-list",
        "empty-token-ids",
        "token-id-past-vocab",
        "tiktoken-ids-openai",
        "tiktoken-ids-tei",
        "token-id-past-int64",
        "token-id-below-int64",
        "bad-encoding-format",
        "dimensions-zero",
        "dimensions-over-model",
        "dimensions-string",
        "unknown-model",
        "unknown-prompt-name",
        "too-many-inputs",
        "body-too-large",
        "tei-missing-inputs",
        "tei-overlong-text-untruncated",
        "tei-huge-text-untruncated",
        "tei-huge-word-untruncated",
        "tei-overlong-ids-untruncated",
        "tei-bad-truncation-direction",
        "tei-normalize-not-bool",
        "tei-negative-token-id",
        "tokenize-empty",
        "tokenize-ids",
        "tokenize-unknown-prompt",
        "tokenize-too-long",
        "tokenize-too-many-tokens",
        "decode-too-many-ids",
        "rerank-no-texts",
        "rerank-embedding-model",
    ],
)
async def test_bad_request_status_and_body(gateway_with, route, body, status, fragment):
    async with gateway_with(FakeEmbedder()) as client:
        response = await client.post(route, content=body, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    payload = response.json()
    if route.startswith("/v1/"):
        assert set(payload["error"]) == {"message", "type", "param", "code"}
        assert isinstance(payload["error"]["code"], str)
        assert fragment in payload["error"]["message"]
    else:
        assert set(payload) == {"error", "error_type"}
        assert fragment in payload["error"]


@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        (None, 415),  # an untyped body: a page of any origin can send one without a CORS preflight
        ("text/plain", 415),
        ("application/x-www-form-urlencoded", 415),  # curl -d without -H
        ("multipart/form-data; boundary=x", 415),
        ("application/json; charset=utf-8", 200),
        ("Application/JSON", 200),
        ("application/vnd.kembed+json", 200),
    ],
)
@pytest.mark.parametrize("route", ["/v1/embeddings", "/embed"])
async def test_a_body_not_declared_json_is_refused_415(gateway_with, route, content_type, status):
    body = b'{"inputs": "hello"}' if route == "/embed" else b'{"input": "hello"}'
    headers = {} if content_type is None else {"content-type": content_type}
    async with gateway_with(FakeEmbedder()) as client:
        response = await client.post(route, content=body, headers=headers)
    assert response.status_code == status, response.text
    if status == 415:
        message = (
            response.json()["error"]["message"] if route.startswith("/v1/") else response.json()["error"]
        )
        assert "Content-Type: application/json" in message


async def test_declared_oversize_body_is_refused_before_reading(gateway_with):
    async with gateway_with(FakeEmbedder(), max_request_bytes=100) as client:
        response = await client.post(
            "/embed", content=b"x" * 101, headers={"content-type": "application/json"}
        )
    assert response.status_code == 413
    assert response.json()["error_type"] == "Validation"


async def test_unimplemented_score_on_a_scoring_worker_is_501(gateway_with):
    async with gateway_with(FakeEmbedder(task="score")) as client:
        response = await client.post("/rerank", json={"query": "q", "texts": ["a", "b"]})
    assert response.status_code == 501
    assert "does not support reranking" in response.json()["error"]


TABLE = [
    (errors.InvalidInput, 422),
    (errors.PayloadTooLarge, 413),
    (errors.UnsupportedMediaType, 415),
    (errors.NotFound, 404),
    (errors.Overloaded, 429),
    (errors.Unavailable, 503),
    (errors.Unsupported, 501),
    (errors.Timeout, 504),
    (errors.WorkerFailed, 500),
]


@pytest.mark.parametrize(("error_class", "status"), TABLE, ids=[cls.__name__ for cls, _ in TABLE])
@pytest.mark.parametrize("flavour", list(Flavour), ids=[f.value for f in Flavour])
def test_error_table_maps_each_error_once(error_class, status, flavour):
    response = render(error_class("boom", param="input"), flavour, retry_after_s=3)
    body = orjson.loads(response.body)
    if flavour is Flavour.OPENAI:  # OpenAI says 400 where TEI says 422, and its code is a string
        assert response.status_code == (400 if status == 422 else status)
        assert body["error"]["message"] == "boom" and body["error"]["param"] == "input"
        assert isinstance(body["error"]["code"], str) and body["error"]["code"]
    elif flavour is Flavour.COHERE:  # Cohere's body is its message alone; 400 where TEI says 422
        assert response.status_code == (400 if status == 422 else status)
        assert body == {"message": "boom"}
    else:
        assert response.status_code == status
        assert body["error"] == "boom" and body["error_type"] in TEI_ERROR_TYPES
    assert (response.headers.get("retry-after") == "3") is (error_class is errors.Overloaded)


# TEI's own error schemas, copied from its OpenAPI document (the file says from which commit).
TEI_SCHEMAS = json.loads((Path(__file__).parent / "fixtures" / "tei_error_schemas.json").read_text())
TEI_ERROR_TYPES = TEI_SCHEMAS["ErrorType"]["enum"]


def test_tei_error_bodies_spell_error_type_as_tei_does():
    classes = [cls for cls in vars(errors).values() if isinstance(cls, type)]
    every_error = [
        cls for cls in classes if issubclass(cls, errors.GatewayError) and cls is not errors.GatewayError
    ]
    rendered = {
        cls.__name__: orjson.loads(render(cls("x"), Flavour.TEI, retry_after_s=1).body) for cls in every_error
    }
    assert {
        name: body["error_type"]
        for name, body in rendered.items()
        if body["error_type"] not in TEI_ERROR_TYPES
    } == {}
    assert rendered["InvalidInput"]["error_type"] == "Validation"
    assert (
        rendered["Overloaded"]["error_type"] == "Overloaded"
        and rendered["Unavailable"]["error_type"] == "Unhealthy"
    )
    assert list(errors.TEI_ERROR_TYPES) == TEI_ERROR_TYPES
    documented = openapi.build("x", has_api_key=False)["components"]["schemas"]["TeiError"]
    assert documented["properties"]["error_type"]["enum"] == TEI_ERROR_TYPES
    assert set(documented["required"]) == set(TEI_SCHEMAS["ErrorResponse"]["required"])


async def test_openai_clients_get_their_own_error_types_and_codes(gateway_with):
    """The openai SDK raises BadRequestError only for 400 (kembed said 422 before), NotFoundError
    for 404; `code` is a string, as its types declare."""
    async with gateway_with(FakeEmbedder()) as client:
        sdk = openai.AsyncOpenAI(base_url="http://gateway/v1", api_key="unused", http_client=client)
        with pytest.raises(openai.BadRequestError) as bad:
            await sdk.embeddings.create(model="fake-minilm", input=[])
        assert bad.value.code == "invalid_input" and "must not be empty" in bad.value.message
        with pytest.raises(openai.NotFoundError) as missing:
            await sdk.embeddings.create(model="no-such-model", input="a")
        assert missing.value.code == "model_not_found"


ALLOWED = {
    "/v1/embeddings": {"POST"},
    "/embed": {"POST"},
    "/info": {"GET", "HEAD"},
    "/": {"GET", "HEAD", "POST"},
}


@pytest.mark.parametrize("method", ["PUT", "DELETE", "OPTIONS"])
async def test_405_says_every_method_the_path_is_served_with(gateway_with, method):
    async with gateway_with(FakeEmbedder()) as client:
        await until_ready(client)
        for path, allowed in ALLOWED.items():
            response = await client.request(method, path)
            assert response.status_code == 405
            assert set(response.headers["allow"].split(", ")) == allowed, path
            for other in allowed - {"POST"}:  # and each method it names is served
                assert (await client.request(other, path)).status_code == 200, (other, path)
        assert (await client.post("/", json={"inputs": "a"})).status_code == 200
