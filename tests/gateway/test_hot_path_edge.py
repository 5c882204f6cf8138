"""The hot routes served by the connection edge itself (hot_path.py), against a real uvicorn server
configured as the gateway serves and raw sockets: every answer equals the ASGI path's for the same
request (status, body, content type), metrics and the API key as around every route, a client that
leaves cancels its request (499), a body over the cap is refused as it arrives, and what the edge
leaves to the ASGI path (pipelining, 100-continue, HTTP/1.0's close) still works."""

import asyncio
import json

import httpx
import pytest
from gateway_fakes import FakeEmbedder
from test_connection_limits import edge, exchange, read_response, request

EMBEDDINGS = "/v1/embeddings"

# (path, body, extra head fields): good requests and bad ones of every kind a hot route refuses
CASES = {
    "openai-float": (EMBEDDINGS, {"input": ["hello world", "kembed"], "encoding_format": "float"}, ""),
    "openai-base64": (EMBEDDINGS, {"input": "hello world", "encoding_format": "base64"}, ""),
    "openai-dimensions": (EMBEDDINGS, {"input": "hello", "dimensions": 4}, ""),
    "openai-token-ids": (EMBEDDINGS, {"input": [[101, 7592, 102]]}, ""),
    "openai-unknown-model": (EMBEDDINGS, {"input": "x", "model": "gpt-nothing"}, ""),
    "openai-empty-list": (EMBEDDINGS, {"input": []}, ""),
    "openai-wrong-type": (EMBEDDINGS, {"input": 5}, ""),
    "openai-bad-dimensions": (EMBEDDINGS, {"input": "x", "dimensions": 0}, ""),
    "openai-unknown-prompt": (EMBEDDINGS, {"input": "x", "prompt_name": "nope"}, ""),
    "openai-bad-priority": (EMBEDDINGS, {"input": "x"}, "X-Kembed-Priority: urgent\r\n"),
    "openai-malformed-json": (EMBEDDINGS, b'{"input": "x"', ""),
    "tei-embed": ("/embed", {"inputs": ["one", "two"], "normalize": False}, ""),
    "tei-embed-too-many": ("/embed", {"inputs": ["a"] * 600}, ""),
    "tei-embed-bad-truncate": ("/embed", {"inputs": "x", "truncate": "yes"}, ""),
    "tei-embed-id-past-vocabulary": ("/embed", {"inputs": [[10**9]]}, ""),
}


def payload(body: dict | bytes) -> bytes:
    return body if isinstance(body, bytes) else json.dumps(body).encode()


def split(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    fields = {
        name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])
    }
    return int(lines[0].split()[1]), fields, body


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
async def test_the_edge_answers_as_the_asgi_path_does(case):
    path, body, extra = CASES[case]
    async with edge(FakeEmbedder()) as (port, app):
        status, fields, content = split(await exchange(port, request(path, payload(body), extra)))
        assert app.state.hot_path.num_requests == 1
        headers = dict(line.split(": ", 1) for line in extra.strip().split("\r\n") if line)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as client:
            reference = await client.post(
                path, content=payload(body), headers={"content-type": "application/json", **headers}
            )
    assert status == reference.status_code
    assert fields["content-type"] == reference.headers["content-type"]
    assert int(fields["content-length"]) == len(content)
    assert json.loads(content) == reference.json()
    assert "date" in fields and fields.get("connection") != "close"


async def test_keep_alive_requests_on_one_connection_are_answered_in_turn_and_timed():
    async with edge(FakeEmbedder()) as (port, app):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for i in range(20):
            writer.write(request(EMBEDDINGS, payload({"input": f"query {i}"})))
            status, _, body = split(await asyncio.wait_for(read_response(reader), 10))
            assert status == 200 and json.loads(body)["data"][0]["index"] == 0
        writer.close()
        text, _ = app.state.metrics.render()
        assert app.state.hot_path.num_requests == 20  # the edge served them, not the ASGI app
    assert b'kembed_gateway_request_duration_seconds_count{code="200",route="/v1/embeddings"} 20.0' in text
    assert b"kembed_gateway_inflight_requests 0.0" in text


async def test_two_pipelined_requests_are_both_answered_in_order():
    async with edge(FakeEmbedder()) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        first, second = (request(EMBEDDINGS, payload({"input": [[101, i, 102]]})) for i in (5, 6))
        writer.write(first + second)
        answers = [split(await asyncio.wait_for(read_response(reader), 10)) for _ in range(2)]
        writer.close()
    assert [status for status, _, _ in answers] == [200, 200]
    assert [json.loads(body)["usage"]["prompt_tokens"] for _, _, body in answers] == [3, 3]


async def test_a_request_asking_to_continue_is_answered_through_the_asgi_path():
    async with edge(FakeEmbedder()) as (port, app):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        body = payload({"input": "hello"})
        writer.write(
            f"POST {EMBEDDINGS} HTTP/1.1\r\nHost: g\r\nContent-Type: application/json\r\n"
            f"Expect: 100-continue\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        )
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        writer.write(body)
        status, _, content = split(await asyncio.wait_for(read_response(reader), 10))
        writer.close()
        assert app.state.hot_path.num_requests == 0
    assert interim.startswith(b"HTTP/1.1 100")
    assert status == 200 and json.loads(content)["object"] == "list"


async def test_an_http_1_0_request_is_answered_and_its_connection_closed():
    async with edge(FakeEmbedder()) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        body = payload({"input": "hello"})
        writer.write(
            f"POST {EMBEDDINGS} HTTP/1.0\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        everything = await asyncio.wait_for(reader.read(), 10)  # until the server closes
        writer.close()
    status, fields, content = split(everything)
    assert status == 200 and fields["connection"] == "close" and json.loads(content)["object"] == "list"


@pytest.mark.parametrize("declared", [True, False], ids=["declared-length", "chunked"])
async def test_a_body_over_the_cap_is_refused_as_it_arrives_and_the_connection_closed(declared):
    async with edge(FakeEmbedder(), max_request_bytes=1000) as (port, app):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head = f"POST {EMBEDDINGS} HTTP/1.1\r\nHost: g\r\nContent-Type: application/json\r\n"
        if declared:
            writer.write(f"{head}Content-Length: 5000\r\n\r\n".encode())  # nothing of the body sent
        else:
            chunk = b'{"input": "' + b"x" * 2000 + b'"}'
            writer.write(
                f"{head}Transfer-Encoding: chunked\r\n\r\n{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
            )
        everything = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        closed = app.state.metrics.connections_closed.labels("body_too_large")._value.get()
    status, fields, content = split(everything)
    assert status == 413 and fields["connection"] == "close"
    assert "larger than the limit of 1000 bytes" in json.loads(content)["error"]["message"]
    assert closed == 1


async def test_a_client_that_leaves_cancels_its_request_in_the_worker_and_is_recorded_as_499():
    fake = FakeEmbedder(delay_s=10.0)  # holds every request
    async with edge(fake) as (port, app):
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request(EMBEDDINGS, payload({"input": ["a", "b"]})))
        for _ in range(200):
            if fake.num_received:
                break
            await asyncio.sleep(0.01)
        writer.close()  # gone before the answer
        for _ in range(300):  # the cancel reaches the worker well before its 10 s answer
            if fake.cancels:
                break
            await asyncio.sleep(0.01)
        text, _ = app.state.metrics.render()
    assert fake.cancels == 1
    assert b'kembed_gateway_request_duration_seconds_count{code="499",route="/v1/embeddings"} 1.0' in text


async def test_the_api_key_is_asked_for_on_the_hot_routes():
    async with edge(FakeEmbedder(), api_key="s3cret") as (port, _):
        refused = split(await exchange(port, request(EMBEDDINGS, payload({"input": "x"}))))
        wrong = split(
            await exchange(port, request(EMBEDDINGS, payload({"input": "x"}), "Authorization: Bearer no\r\n"))
        )
        served = split(
            await exchange(
                port, request(EMBEDDINGS, payload({"input": "x"}), "Authorization: bearer s3cret\r\n")
            )
        )
    assert refused[0] == 401 and refused[1]["www-authenticate"] == "Bearer"
    assert json.loads(refused[2])["error"]["code"] == "invalid_api_key"
    assert wrong[0] == 401
    assert served[0] == 200
