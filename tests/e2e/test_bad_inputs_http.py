"""Acceptance 4: each bad input gets its status and a JSON error body; a good request works right after."""

import time

import httpx
import pytest
from processes import free_port, spawn, start_stack

LONG = "word " * 400  # ~400 tokens, past the model's 256


def openai_error(response: httpx.Response) -> str:
    return response.json()["error"]["message"]


def tei_error(response: httpx.Response) -> str:
    return response.json()["error"]


CASES = [
    ("/v1/embeddings", b'{"input": ["a", ', 400, "JSON"),
    ("/v1/embeddings", {"input": []}, 400, "empty"),
    ("/v1/embeddings", {"input": 5}, 400, "input"),
    ("/v1/embeddings", {"input": [["a"]]}, 400, "input"),
    ("/v1/embeddings", {"input": [[101, 30522, 102]]}, 400, "30522"),
    ("/v1/embeddings", {"input": [[]]}, 400, "empty"),
    ("/v1/embeddings", {"input": "x", "encoding_format": "int8"}, 400, "encoding_format"),
    ("/v1/embeddings", {"input": "x", "dimensions": 0}, 400, "dimensions"),
    ("/v1/embeddings", {"input": "x", "dimensions": 385}, 400, "384"),
    ("/v1/embeddings", {"input": ["x"] * 2049}, 413, "2048"),
    ("/v1/embeddings", {"input": "x", "model": "nope"}, 404, "nope"),
    ("/embed", {"inputs": [LONG], "truncate": False}, 413, "0"),
    ("/embed", {"inputs": "x", "prompt_name": "shouting"}, 422, "shouting"),
    ("/embed", {"inputs": "x", "truncation_direction": "middle"}, 422, "truncation_direction"),
    ("/embed", {"inputs": "x", "normalize": "yes please"}, 422, "normalize"),
    ("/embed", {}, 422, "inputs"),
]


@pytest.mark.parametrize(
    ("route", "body", "status", "says"),
    CASES,
    ids=[
        "malformed-json",
        "empty-list",
        "wrong-type",
        "nested-strings",
        "id-out-of-vocab",
        "empty-ids",
        "bad-encoding",
        "zero-dimensions",
        "too-many-dimensions",
        "too-many-inputs",
        "unknown-model",
        "too-long-untruncated",
        "unknown-prompt",
        "bad-direction",
        "bad-normalize",
        "missing-inputs",
    ],
)
def test_bad_input_gets_status_and_json_error_then_service_goes_on(client, route, body, status, says):
    if isinstance(body, bytes):
        response = client.post(route, content=body, headers={"content-type": "application/json"})
    else:
        response = client.post(route, json=body)
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    message = openai_error(response) if route.startswith("/v1/") else tei_error(response)
    assert says.lower() in message.lower(), message
    good = client.post(route, json={"input": "still fine"} if route.startswith("/v1/") else {"inputs": "ok"})
    assert good.status_code == 200


def test_too_long_untruncated_names_the_input_and_its_length(client):
    response = client.post("/embed", json={"inputs": ["short", LONG], "truncate": False})
    assert response.status_code == 413
    message = tei_error(response)
    assert "1" in message and "256" in message and "402" in message, message


def test_body_over_the_byte_cap_is_413(client):
    response = client.post(
        "/v1/embeddings",
        content=b'{"input": "' + b"a" * (9 << 20) + b'"}',
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 413
    assert "bytes" in openai_error(response)
    assert client.post("/v1/embeddings", json={"input": "ok"}).status_code == 200


def test_no_reachable_worker_is_503_quickly_not_a_hang(log_dir):
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    port = free_port()
    gateway = spawn(
        f"gateway-dead-{port}", ["kembed.gateway", "--port", str(port), "--worker", dead], log_dir
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(150):  # until the process answers at all
            try:
                health = httpx.get(f"{url}/health", timeout=2)
                break
            except httpx.TransportError:
                time.sleep(0.2)
        assert health.status_code == 200  # the process is up ...
        assert httpx.get(f"{url}/ready", timeout=5).status_code == 503  # ... but not ready
        response = httpx.post(f"{url}/v1/embeddings", json={"input": "x"}, timeout=10)
        assert response.status_code == 503
        assert "worker" in openai_error(response).lower()
    finally:
        gateway.stop()


def test_a_worker_that_dies_is_routed_around(log_dir):
    stack = start_stack(log_dir, num_workers=2)
    try:
        stack.processes[0].stop()  # kill one replica; the gateway has not noticed yet
        with httpx.Client(base_url=stack.url, timeout=30) as http:
            for i in range(6):
                response = http.post("/v1/embeddings", json={"input": [f"request {i}", "more"] * 20})
                assert response.status_code == 200, response.text
    finally:
        for proc in stack.processes:
            proc.stop()


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/v1/embeddings", 405),
        ("POST", "/v1/embedding", 404),  # a typo of /v1/embeddings (/v1/embed is Cohere v1's)
        ("POST", "/v2/embeddings", 404),
        ("GET", "/nope", 404),
    ],
    ids=["wrong-method", "unknown-openai-path", "unknown-cohere-path", "unknown-path"],
)
def test_unknown_routes_and_methods_answer_json_too(client, method, path, status):
    response = client.request(method, path)
    assert response.status_code == status
    body = response.json()
    if path.startswith("/v1/"):
        message = body["error"]["message"]
    elif path.startswith("/v2/"):  # Cohere's shape
        message = body["message"]
    else:
        message = body["error"]
    assert path in message
