"""A field a route does not define is refused naming it, on every route, through a real gateway and
real workers, as the OpenAI API answers ("Unrecognized request argument supplied: X"). Before, every
request model ignored unknown fields: `"dimension": 128` or `"truncate": false` on /v1/embeddings
answered 200 as if unsaid, full-size vectors and a silent truncation."""

import httpx
import pytest

LONG = "word " * 400  # ~400 tokens, past the bundled model's 256

# (route, a valid body, the status of an invalid request there: OpenAI's and Cohere's 400, TEI's 422)
EMBEDDING_ROUTES = {
    "/v1/embeddings": ({"input": ["a"]}, 400),
    "/v1/contextualizedembeddings": ({"input": [["a", "b"]]}, 400),
    "/v1/embed": ({"texts": ["a"]}, 400),
    "/v2/embed": ({"texts": ["a"], "input_type": "search_document"}, 400),
    "/embed": ({"inputs": ["a"]}, 422),
    "/embed_sparse": ({"inputs": ["a"]}, 422),
    "/embed_all": ({"inputs": ["a"]}, 422),
    "/tokenize": ({"inputs": ["a"]}, 422),
    "/similarity": ({"inputs": {"source_sentence": "a", "sentences": ["b"]}}, 422),
    "/decode": ({"ids": [101, 102]}, 422),
    "/": ({"inputs": ["a"]}, 422),
}
RERANK_ROUTES = {
    "/rerank": ({"query": "q", "texts": ["a"]}, 422),
    "/v1/rerank": ({"query": "q", "documents": ["a"]}, 400),
    "/v2/rerank": ({"query": "q", "documents": ["a"]}, 400),
}


def message(response: httpx.Response) -> str:
    body = response.json()
    error = body.get("error", body.get("message"))
    return error["message"] if isinstance(error, dict) else error


@pytest.mark.parametrize("route", list(EMBEDDING_ROUTES))
def test_an_unknown_field_is_refused_naming_it(stack, route):
    body, status = EMBEDDING_ROUTES[route]
    response = httpx.post(f"{stack.url}{route}", json=body | {"colour": "blue"}, timeout=30)
    assert response.status_code == status, response.text
    assert message(response) == "Unrecognized request argument supplied: colour"


@pytest.mark.parametrize("route", list(RERANK_ROUTES))
def test_an_unknown_field_is_refused_naming_it_on_the_rerank_routes(rerank_stack, route):
    body, status = RERANK_ROUTES[route]
    assert httpx.post(f"{rerank_stack.url}{route}", json=body, timeout=30).status_code == 200
    response = httpx.post(f"{rerank_stack.url}{route}", json=body | {"colour": "blue"}, timeout=30)
    assert response.status_code == status, response.text
    assert message(response) == "Unrecognized request argument supplied: colour"


@pytest.mark.parametrize(
    ("route", "body", "says"),
    [
        ("/v1/embeddings", {"input": "x", "dimension": 128}, "dimension (did you mean `dimensions`?)"),
        ("/v1/embeddings", {"input": "x", "truncate": False}, "argument supplied: truncate"),
        ("/v1/embeddings", {"input": "x", "prompt": "query"}, "prompt (did you mean `prompt_name`?)"),
        ("/embed", {"inputs": "x", "normalise": False}, "normalise (did you mean `normalize`?)"),
        (
            "/similarity",
            {"inputs": {"source_sentence": "a", "sentences": ["b"]}, "parameters": {"truncation": False}},
            "parameters.truncation (did you mean `truncate`?)",
        ),
        ("/v2/embed", {"texts": ["a"], "output_dimensions": 64}, "(did you mean `output_dimension`?)"),
        ("/v1/embeddings", {"input": "x", "a": 1, "b": 2}, "Unrecognized request arguments supplied: a, b"),
    ],
    ids=["dimension", "truncate", "prompt", "normalise", "nested-parameters", "cohere", "two"],
)
def test_a_misspelt_field_is_refused_with_the_name_it_likely_meant(stack, route, body, says):
    response = httpx.post(f"{stack.url}{route}", json=body, timeout=30)
    assert 400 <= response.status_code < 500, response.text
    assert says in message(response)


def test_the_openai_route_refuses_truncate_false_rather_than_truncate_silently(stack):
    """The request the issue found: the OpenAI route has no `truncate`; it was ignored and a long
    input cut. Now refused; /embed's `truncate: false` is a 413 for the same input."""
    refused = httpx.post(f"{stack.url}/v1/embeddings", json={"input": LONG, "truncate": False}, timeout=30)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "truncate"
    too_long = httpx.post(f"{stack.url}/embed", json={"inputs": LONG, "truncate": False}, timeout=30)
    assert too_long.status_code == 413


def test_the_fields_real_clients_send_are_taken(stack):
    """The OpenAI SDK's `user`, huggingface_hub's `encoding_format` to TEI's root route (float, the
    answer's only form there), a Cohere v1 document's own fields beside its `text`."""
    openai = httpx.post(f"{stack.url}/v1/embeddings", json={"input": "x", "user": "u-1"}, timeout=30)
    assert openai.status_code == 200
    hub = httpx.post(f"{stack.url}/", json={"inputs": "x", "encoding_format": "float"}, timeout=30)
    assert hub.status_code == 200 and len(hub.json()[0]) == 384
    base64 = httpx.post(f"{stack.url}/embed", json={"inputs": "x", "encoding_format": "base64"}, timeout=30)
    assert base64.status_code == 422 and "encoding_format" in base64.json()["error"]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"rank_fields": ["title"]}, "rank_fields ['title'] is not supported"),
        ({"max_chunks_per_doc": 10}, "max_chunks_per_doc is not supported"),
    ],
    ids=["rank-fields", "max-chunks-per-doc"],
)
def test_cohere_v1_rerank_options_kembed_does_not_serve_are_refused_naming_them(rerank_stack, body, says):
    base = {"query": "q", "documents": [{"text": "a", "title": "t"}, "b"]}
    taken = httpx.post(f"{rerank_stack.url}/v1/rerank", json=base | {"rank_fields": ["text"]}, timeout=30)
    assert taken.status_code == 200, taken.text
    response = httpx.post(f"{rerank_stack.url}/v1/rerank", json=base | body, timeout=30)
    assert response.status_code == 400 and says in message(response)
