"""The HTTP edge's bounds (connections.py), against a real uvicorn server configured as the gateway
serves (processes.uvicorn_config) and raw sockets that misbehave: silent, slow-head and slow-body
connections are closed after their timeouts, oversized heads are refused with 431 before they are
read whole, and past the connection cap an idle connection makes room or a newcomer gets 503."""

import asyncio
import contextlib
import dataclasses
import json
import logging
import time

import pytest
import uvicorn
from gateway_fakes import BUNDLED_MODEL_DIR, FakeEmbedder, serving
from local_ports import free_port

from kembed.gateway.config import GatewayConfig
from kembed.gateway.edge.app import create_app
from kembed.gateway.edge.connections import RESERVED_FDS, connection_cap
from kembed.gateway.edge.processes import uvicorn_config

BODY = json.dumps({"input": ["hello"]}).encode()


def request(path: str = "/v1/embeddings", body: bytes = BODY, extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: g\r\nContent-Type: application/json\r\n{extra}"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


@contextlib.asynccontextmanager
async def edge(fake: FakeEmbedder | None = None, **limits):
    """A gateway on a free port with `limits` over the defaults; yields (port, app)."""
    async with serving(fake or FakeEmbedder()) as address:
        config = dataclasses.replace(
            GatewayConfig(model_dir=BUNDLED_MODEL_DIR, worker_addresses=(address,)), **limits
        )
        port = free_port()
        app = create_app(config)
        server = uvicorn.Server(uvicorn_config(config, app, port=port, loop="asyncio", log_level="warning"))
        task = asyncio.create_task(server.serve())
        try:
            for _ in range(500):
                if server.started:
                    break
                await asyncio.sleep(0.01)
            for _ in range(300):  # until a worker is known: the requests below get real answers
                if (await exchange(port, b"GET /ready HTTP/1.1\r\nHost: g\r\n\r\n")).startswith(
                    b"HTTP/1.1 200"
                ):
                    break
                await asyncio.sleep(0.02)
            yield port, app
        finally:
            server.should_exit = True
            await task


async def exchange(port: int, data: bytes, timeout_s: float = 10.0) -> bytes:
    """Send `data` on a new connection; everything the server sends until it closes (or timeout)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    try:
        return await asyncio.wait_for(read_response(reader), timeout_s)
    finally:
        writer.close()


async def read_response(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        ),
        0,
    )
    return head + await reader.readexactly(length)


async def closed_after(reader: asyncio.StreamReader, timeout_s: float) -> tuple[bytes, float]:
    """What arrives until the server closes the connection, and after how long."""
    started = time.monotonic()
    data = await asyncio.wait_for(reader.read(), timeout_s)
    return data, time.monotonic() - started


def metric(app, reason: str) -> float:
    return app.state.metrics.connections_closed.labels(reason)._value.get()


async def test_a_connection_that_sends_nothing_is_closed_quietly_after_the_header_timeout():
    async with edge(header_timeout_s=0.3) as (port, app):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        data, waited = await closed_after(reader, 5)
        writer.close()
        assert data == b"" and 0.2 < waited < 3
        assert metric(app, "idle_timeout") == 1


async def test_a_head_sent_a_byte_at_a_time_gets_408_and_is_closed():
    async with edge(header_timeout_s=0.5) as (port, app):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/embeddings HTTP/1.1\r\nHost: g\r\n")

        async def trickle():
            with contextlib.suppress(ConnectionError):
                for byte in b"X-Slow: " + b"a" * 100:
                    writer.write(bytes([byte]))
                    await writer.drain()
                    await asyncio.sleep(0.05)

        trickler = asyncio.create_task(trickle())
        data, waited = await closed_after(reader, 5)
        trickler.cancel()
        writer.close()
        assert data.startswith(b"HTTP/1.1 408 ")
        error = json.loads(data.split(b"\r\n\r\n", 1)[1])["error"]  # OpenAI's shape on /v1/ routes
        assert (
            "request head did not arrive within 0.5 s" in error["message"]
            and error["code"] == "request_timeout"
        )
        assert waited < 3
        assert metric(app, "header_timeout") == 1


async def test_a_body_that_trickles_gets_408_within_the_body_timeout():
    async with edge(body_timeout_s=0.5) as (port, app):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /embed HTTP/1.1\r\nHost: g\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n" + b'{"inputs"'
        )
        data, waited = await closed_after(reader, 5)
        writer.close()
        assert data.startswith(b"HTTP/1.1 408 ")
        body = json.loads(data.split(b"\r\n\r\n", 1)[1])  # TEI's shape elsewhere
        assert body["error_type"] == "Validation" and "request body" in body["error"]
        assert waited < 3
        assert metric(app, "body_timeout") == 1


async def test_kept_alive_connections_outlive_the_header_timeout_between_requests():
    async with edge(header_timeout_s=0.3, body_timeout_s=0.3) as (port, app):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(3):
            writer.write(request())
            assert (await asyncio.wait_for(read_response(reader), 5)).startswith(b"HTTP/1.1 200")
            await asyncio.sleep(0.5)  # idle longer than either timeout, shorter than keep-alive
        writer.close()
        assert metric(app, "header_timeout") == metric(app, "idle_timeout") == 0


@pytest.mark.parametrize("pace", ["one write", "64 KiB writes"])
async def test_a_head_past_max_header_bytes_is_refused_with_431_before_it_is_all_sent(pace):
    async with edge(max_header_bytes=16 * 1024) as (port, app):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        huge = b"POST /v1/embeddings HTTP/1.1\r\nHost: g\r\nX-Big: " + b"a" * (8 * 1024 * 1024)
        sent = 0
        with contextlib.suppress(ConnectionError):
            if pace == "one write":
                writer.write(huge[: 100 * 1024] + b"\r\n\r\n")
                sent = 100 * 1024
            else:
                for start in range(0, len(huge), 64 * 1024):
                    writer.write(huge[start : start + 64 * 1024])
                    await writer.drain()
                    sent += 64 * 1024
                    if reader.at_eof() or len(reader._buffer) > 0:  # the answer is already there
                        break
                    await asyncio.sleep(0.005)
        data, _ = await closed_after(reader, 5)
        writer.close()
        assert data.startswith(b"HTTP/1.1 431 ")
        assert b"larger than 16384 bytes" in data
        assert sent < len(huge)  # refused long before 8 MB
        assert metric(app, "headers_too_large") == 1


async def test_too_many_header_fields_get_431():
    async with edge(max_headers=20) as (port, _):
        extra = "".join(f"X-H{i}: v\r\n" for i in range(30))
        data = await exchange(port, request(extra=extra))
        assert data.startswith(b"HTTP/1.1 431 ") and b"more than 20 header fields" in data


async def test_past_the_cap_an_idle_connection_makes_room_for_a_new_client():
    async with edge(max_connections=8, header_timeout_s=30) as (port, app):
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(8)]
        await asyncio.sleep(0.1)
        clients = []
        for _ in range(3):  # each new client, kept open, evicts the longest-open idle connection
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request())
            assert (await asyncio.wait_for(read_response(reader), 5)).startswith(b"HTTP/1.1 200")
            clients.append(writer)
        assert metric(app, "evicted_idle") == 3
        await asyncio.sleep(0.05)
        assert app.state.metrics.open_connections._value.get() == 8  # 5 idle and the 3 new
        closed = []
        for reader, writer in idle:
            with contextlib.suppress(TimeoutError):
                closed.append(await asyncio.wait_for(reader.read(), 0.2))
            writer.close()
        assert closed == [b"", b"", b""]  # the three longest open, closed without an answer
        for writer in clients:
            writer.close()


async def test_past_the_cap_with_every_connection_busy_a_newcomer_gets_503():
    fake = FakeEmbedder(delay_s=2.0)  # holds every request for 2 s
    async with edge(fake, max_connections=4) as (port, app):
        await asyncio.sleep(0.1)
        busy = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
        for _, writer in busy:
            writer.write(request())
        await asyncio.sleep(0.3)  # all four are being served
        data = await exchange(port, request())
        assert data.startswith(b"HTTP/1.1 503 ") and b"connections, its limit" in data
        assert metric(app, "too_many_connections") == 1
        for reader, writer in busy:  # the busy ones are answered, not evicted
            assert (await asyncio.wait_for(read_response(reader), 5)).startswith(b"HTTP/1.1 200")
            writer.close()


@pytest.mark.parametrize(
    "head",
    [b"GET /health HTTP/1.1\n\n", b"GET /health HTTP/1.1\n", b"POST /v1/embeddings HTTP/1.1\r\nHost: g\n"],
    ids=["whole", "request-line-only", "a-field"],
)
async def test_a_head_with_a_line_ended_by_lf_alone_gets_400_at_once(head):
    """Not after the header timeout (408): the edge holds a head until its CRLF CRLF, which such a
    client never sends; the parser refuses a bare LF as soon as it sees one."""
    async with edge(header_timeout_s=10.0) as (port, _):
        started = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head)
        data, _ = await closed_after(reader, 5)
        writer.close()
        assert data.startswith(b"HTTP/1.1 400 ")
        assert time.monotonic() - started < 2  # well under the 10 s header timeout


class ErrorRecords(logging.Handler):
    """Records ERROR and above logged by the gateway or uvicorn (whose loggers do not propagate)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def test_a_client_that_hangs_up_mid_body_is_counted_499_not_a_failure():
    """A head with Content-Length and part of the body, then the connection closes: on a hot route
    (served by the edge) and on an ASGI one, metrics count 499, no 5xx and no ERROR log (it was a
    500 with a traceback, reason worker_failed: anyone could fire the 5xx alerts)."""
    errors = ErrorRecords()
    loggers = [logging.getLogger(name) for name in ("", "uvicorn", "kembed")]
    for logger in loggers:
        logger.addHandler(errors)
    try:
        async with edge() as (port, _):
            for path in ("/v1/embeddings", "/tokenize"):
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(request(path, body=b'{"inputs": "x' + b"x" * 1000 + b'"}')[:-500])
                await writer.drain()
                await asyncio.sleep(0.05)
                writer.close()
            for _ in range(100):  # until both are counted
                text = (await exchange(port, b"GET /metrics HTTP/1.1\r\nHost: g\r\n\r\n")).decode()
                counts = [
                    line
                    for line in text.splitlines()
                    if line.startswith("kembed_gateway_request_duration_seconds_count")
                ]
                if sum('code="499"' in line for line in counts) == 2:
                    break
                await asyncio.sleep(0.02)
    finally:
        for logger in loggers:
            logger.removeHandler(errors)
    assert any('code="499",route="/v1/embeddings"} 1.0' in line for line in counts), counts
    assert any('code="499",route="/tokenize"} 1.0' in line for line in counts), counts
    assert not [line for line in counts if 'code="5' in line], counts
    assert "kembed_gateway_errors_total{" not in text
    assert not errors.records, [record.getMessage() for record in errors.records]


def test_the_cap_fits_the_open_file_limit():
    config = GatewayConfig(model_dir=BUNDLED_MODEL_DIR, max_connections=4096)
    assert connection_cap(config, fd_limit=1024) == 1024 - RESERVED_FDS
    assert connection_cap(config, fd_limit=1 << 20) == 4096


@pytest.mark.parametrize(
    "field",
    [
        "header_timeout_s",
        "body_timeout_s",
        "keep_alive_timeout_s",
        "max_header_bytes",
        "max_headers",
        "max_connections",
    ],
)
def test_the_limits_must_be_positive(field):
    with pytest.raises(ValueError, match=f"{field} must be positive"):
        GatewayConfig(model_dir=BUNDLED_MODEL_DIR, **{field: 0})
