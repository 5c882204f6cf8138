"""The gateway's OpenAPI document against the real gateway and workers: it is valid OpenAPI 3.1, it
names every route the app serves, and schemathesis, generating requests from it (valid and
invalid), finds no server error and no answer that departs from the document."""

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from kembed.gateway import openapi
from kembed.gateway.app import create_app
from kembed.gateway.config import GatewayConfig
from kembed.worker.config import bundled_model_dir


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"])
def test_every_operation_answers_as_documented(stack, mode):
    """Schemathesis' own pytest plugin does not load under this pytest; its strategies do, driven
    here by hypothesis directly: per operation, requests generated from the document, each checked
    for a server error and for status, headers and body against the document."""
    schema = schemathesis.openapi.from_url(f"{stack.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    embedding_routes = {f"{o.method.upper()} {o.path}" for o in openapi.ROUTES if o.task != "score"}
    assert {op.label for op in operations} >= embedding_routes - {"GET /openapi.json"}
    for operation in operations:
        if mode is GenerationMode.NEGATIVE and operation.method.upper() != "POST":
            continue  # a GET here takes no parameters: there is nothing to get wrong

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def check(case):
            # A schema-valid request may still be refused: a token id past the vocabulary, an empty
            # list, a model name this gateway does not serve are runtime facts the document does not
            # encode; every other check runs (no 5xx; status, content type, headers, body as documented).
            case.call_and_validate(timeout=60, excluded_checks=[positive_data_acceptance])

        check()


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
