"""The gateway's OpenAPI document against the real gateway and workers: it is valid OpenAPI 3.1, it
names every route the app serves, and schemathesis, generating requests from it (valid and
invalid), finds no server error and no answer that departs from the document."""

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import positive_data_acceptance

from kembed.gateway.api import openapi
from kembed.gateway.config import GatewayConfig
from kembed.gateway.edge.app import create_app
from kembed.worker.config import bundled_model_dir

# Examples per operation and mode: a few hundred requests in all, the same ones every run
# (derandomized), about 20 s on two cores.
EXAMPLES = {GenerationMode.POSITIVE: 20, GenerationMode.NEGATIVE: 6}
CONFIG = SchemathesisConfig.from_dict(
    # A request the document rejects may also be too large (413): a list past the batch limit.
    {"checks": {"negative_data_rejection": {"expected-statuses": ["400", "404", "413", "415", "422"]}}}
)


def said(response) -> str:
    """The error message of a body in any of the three shapes (OpenAI's, Cohere's, TEI's)."""
    try:
        body = response.json()
    except ValueError:
        return response.text
    error = body.get("error") if isinstance(body, dict) else None
    return str(error.get("message") if isinstance(error, dict) else error or body.get("message", ""))


def is_accepted(response) -> bool:
    """A 2xx; or a refusal for what no schema can state, how many tokens a text has
    (gateway/api/openapi_limits.py): over the model's limit untruncated, over Cohere's `max_tokens` with
    truncate NONE, a Perplexity chunk without tokens (whitespace only); and token ids its tokenizer did
    not make (the schema's description says they must be framed by its special tokens, which JSON
    Schema cannot require of an array's last item)."""
    if response.status_code < 300:
        return True
    message = said(response)
    return (
        (response.status_code == 413 and "tokens" in message)
        or (response.status_code == 400 and "has no tokens" in message)
        or (response.status_code in (400, 422) and "not made by this model's tokenizer" in message)
    )


def run_operations(
    url: str, mode: GenerationMode, tasks: set[str | None], also: frozenset[str] = frozenset()
) -> dict[str, tuple[int, int]]:
    """Schemathesis' own pytest plugin does not load under this pytest; its strategies do, driven
    here by hypothesis directly: per operation (of `tasks`, and those labelled in `also`), requests
    generated from the served document, each checked for a server error and for status, headers and
    body against the document; a valid one must be accepted. Returns, per operation, how many
    requests were sent and how many of them answered 2xx."""
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json", config=CONFIG)
    answered: dict[str, list[int]] = {}
    for operation in (result.ok() for result in schema.get_all_operations()):
        route = next(
            o for o in openapi.ROUTES if (o.method, o.path) == (operation.method.lower(), operation.path)
        )
        is_chosen = route.task in tasks or operation.label in also
        if not is_chosen or (mode is GenerationMode.NEGATIVE and operation.method.upper() != "POST"):
            continue  # a GET here takes no parameters: there is nothing to get wrong
        answered[operation.label] = [0, 0]

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=EXAMPLES[mode], deadline=None, derandomize=True, database=None,
            suppress_health_check=list(HealthCheck),
        )  # fmt: skip
        def check(case):
            response = case.call_and_validate(timeout=60, excluded_checks=[positive_data_acceptance])
            if mode is GenerationMode.POSITIVE:
                assert is_accepted(response), (
                    f"{case.operation.label} refused a request valid by its document: "
                    f"{response.status_code} {response.text[:500]}\n{case.as_curl_command()}"
                )
            answered[case.operation.label][0] += 1
            answered[case.operation.label][1] += response.status_code < 300

        check()
    return {label: (sent, ok) for label, (sent, ok) in answered.items()}


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"])
def test_every_operation_answers_as_documented(stack, mode):
    answered = run_operations(stack.url, mode, {None, "embed"})
    embedding_routes = {f"{o.method.upper()} {o.path}" for o in openapi.ROUTES if o.task != "score"}
    if mode is GenerationMode.POSITIVE:
        # the bundled model has no sparse head: /embed_sparse is not in its document
        assert set(answered) >= embedding_routes - {"GET /openapi.json", "POST /embed_sparse"}
        # each operation served valid requests (every one refused was refused for its tokens);
        # generated chunks are often of characters the tokenizer drops (controls, private use)
        assert {label: counts for label, counts in answered.items() if counts[1] == 0} == {}


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"])
def test_every_rerank_operation_answers_as_documented(rerank_stack, mode):
    # and the root route, whose body is TEI's rerank one for a cross-encoder
    answered = run_operations(rerank_stack.url, mode, {"score"}, also=frozenset({"POST /"}))
    assert set(answered) == {f"POST {o.path}" for o in openapi.ROUTES if o.task == "score"} | {"POST /"}
    if mode is GenerationMode.POSITIVE:
        assert {label: counts for label, counts in answered.items() if counts[1] < counts[0] / 2} == {}, (
            answered
        )


def test_the_document_names_every_route_the_app_serves():
    app = create_app(GatewayConfig(model_dir=bundled_model_dir(), worker_addresses=("127.0.0.1:1",)))
    served = {
        (method.lower(), route.path)
        for route in app.routes
        for method in getattr(route, "methods", None) or ()
        if method != "HEAD"
    }
    documented = {(op.method, op.path) for op in openapi.ROUTES}
    assert served == documented


def test_the_document_is_served_and_marks_the_key_where_one_is_needed(stack):
    document = httpx.get(f"{stack.url}/openapi.json", timeout=30).json()
    assert document["openapi"] == "3.1.0"
    assert "/v1/embeddings" in document["paths"] and "security" not in document["paths"]["/embed"]["post"]
    assert "/rerank" not in document["paths"]  # an embedding model: its rerank routes answer 501
    assert "/rerank" in openapi.build("x", has_api_key=False, task="score")["paths"]
    page = httpx.get(f"{stack.url}/docs", timeout=30)
    assert page.status_code == 200 and "/openapi.json" in page.text
    script = httpx.get(f"{stack.url}/docs/static/swagger-ui-bundle.js", timeout=30)
    assert script.status_code == 200 and "SwaggerUIBundle" in script.text
    keyed = openapi.build("x", has_api_key=True)
    assert keyed["paths"]["/embed"]["post"]["security"] == [{"bearer": []}]
    assert "security" not in keyed["paths"]["/health"]["get"]
    assert "security" not in keyed["paths"]["/docs"]["get"]


def test_the_embeddings_schema_names_the_outputs_the_model_has(stack):
    schemas = httpx.get(f"{stack.url}/openapi.json", timeout=30).json()["components"]["schemas"]
    request = schemas["EmbeddingRequest"]
    outputs = request["properties"]["outputs"]
    listed = next(branch for branch in outputs["anyOf"] if branch.get("type") == "array")
    # the bundled model: dense alone (its token vectors are /embed_all's), the field optional
    assert listed["items"]["enum"] == ["dense"] and listed["minItems"] == 1
    assert {"type": "null"} in outputs["anyOf"] and "outputs" not in request.get("required", [])
