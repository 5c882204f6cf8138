"""An HTTP/2 upgrade offer (`Upgrade: h2c`) on a plain-HTTP request is answered as the HTTP/1.1
request it is, body and all (connections.py): curl's `--http2`, Spring's RestClient and Ktor clients
send one on every such request, and httptools alone would hand the app an empty body (a 400). Real
uvicorn server as the gateway serves, raw sockets."""

import asyncio
import json
import shutil
import subprocess

import pytest
from test_connection_limits import BODY, edge, read_response, request

from kembed.gateway.edge.connections import without_upgrade

OFFER = "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n"


def chunked(body: bytes) -> bytes:
    return (
        b"".join(f"{len(part):x}\r\n".encode() + part + b"\r\n" for part in (body[:7], body[7:]))
        + b"0\r\n\r\n"
    )


def embeddings_of(response: bytes) -> list:
    assert response.startswith(b"HTTP/1.1 200 "), response[:300]
    return json.loads(response.split(b"\r\n\r\n", 1)[1])["data"]


def test_without_upgrade_drops_only_the_upgrade_field():
    head = (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: g\r\nUPGRADE :  h2c\r\nX-Upgrade: keep\r\n"
        b"Content-Length: 2\r\n\r\n"
    )
    assert without_upgrade(head) == (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: g\r\nX-Upgrade: keep\r\nContent-Length: 2\r\n\r\n"
    )
    assert without_upgrade(b"GET / HTTP/1.1\r\nHost: g\r\n\r\n") == b"GET / HTTP/1.1\r\nHost: g\r\n\r\n"


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
@pytest.mark.parametrize("writes", ["one write", "head then body", "a byte at a time"])
async def test_a_request_offering_h2c_gets_its_answer_and_the_connection_serves_on(framing, writes):
    if framing == "chunked":
        head = (
            "POST /v1/embeddings HTTP/1.1\r\nHost: g\r\nContent-Type: application/json\r\n"
            f"{OFFER}Transfer-Encoding: chunked\r\n\r\n"
        ).encode()
        body = chunked(BODY)
    else:
        whole = request(extra=OFFER)
        head, body = whole[: whole.index(b"\r\n\r\n") + 4], whole[whole.index(b"\r\n\r\n") + 4 :]
    async with edge() as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        if writes == "one write":
            writer.write(head + body)
        elif writes == "head then body":
            writer.write(head)
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(body)
        else:
            for byte in head + body:
                writer.write(bytes([byte]))
                await writer.drain()
        assert len(embeddings_of(await asyncio.wait_for(read_response(reader), 10))) == 1
        writer.write(request(body=json.dumps({"input": ["a", "b"]}).encode()))  # the same connection
        assert len(embeddings_of(await asyncio.wait_for(read_response(reader), 10))) == 2
        writer.close()


async def test_curl_http2_on_plain_http_gets_embeddings():
    curl = shutil.which("curl")
    assert curl is not None, "curl is part of the development machine's image"
    async with edge() as (port, _):
        result = await asyncio.to_thread(
            subprocess.run,
            [
                curl,
                "-sS",
                "--http2",
                "-H",
                "Content-Type: application/json",
                "-d",
                '{"input": ["hello"]}',
                f"http://127.0.0.1:{port}/v1/embeddings",
            ],
            capture_output=True,
            timeout=30,
        )
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)["data"]) == 1
