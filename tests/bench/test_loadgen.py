"""The load generator (loadgen.py) against a server that answers each request after a fixed delay: its
latencies, rate and error counts must agree with what the server saw."""

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from loadgen import LoadResult, run

DELAY_S = 0.005
NUM_CONNECTIONS = 8
BODIES = [b'{"input": "hello"}', b'{"input": "a longer hello, to rotate bodies"}']


class DelayedServer:
    """HTTP/1.1 keep-alive server on its own event loop in a thread: answers each POST DELAY_S after
    it arrived (a timer, so all connections wait at once), every `fail_every`-th answer a 503."""

    def __init__(self, fail_every: int = 0) -> None:
        self.fail_every = fail_every
        self.answers: list[tuple[int, int]] = []  # (time.monotonic_ns() at the write, status)
        self.transports: set[asyncio.Transport] = set()
        self.loop = asyncio.new_event_loop()
        self.server = self.loop.run_until_complete(self.loop.create_server(self.connect, "127.0.0.1", 0))
        self.port: int = self.server.sockets[0].getsockname()[1]
        self.thread = threading.Thread(target=self.loop.run_forever)

    def connect(self) -> asyncio.Protocol:
        return DelayedAnswers(self)

    def answer(self, transport: asyncio.Transport) -> None:
        if transport.is_closing():  # the load generator hung up at the end of its run
            return
        is_failed = self.fail_every > 0 and len(self.answers) % self.fail_every == self.fail_every - 1
        status, body = (503, b'{"error": "overloaded"}') if is_failed else (200, b'{"data": []}')
        head = f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        transport.write(head.encode() + body)
        self.answers.append((time.monotonic_ns(), status))

    def answered_during(self, result: LoadResult) -> list[int]:
        end_ns = result.start_ns + int(result.duration_s * 1e9)
        return [status for at_ns, status in self.answers if result.start_ns <= at_ns < end_ns]

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.server.close()
        for transport in self.transports:
            transport.close()
        self.loop.run_until_complete(self.server.wait_closed())
        self.loop.close()


class DelayedAnswers(asyncio.Protocol):
    def __init__(self, server: DelayedServer) -> None:
        self.server, self.buffer = server, b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.server.transports.add(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.transports.discard(self.transport)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            head = self.buffer[:end].lower()
            at = head.index(b"content-length:") + 15
            length = int(head[at:].split(b"\r\n", 1)[0])
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length :]
            self.server.loop.call_later(DELAY_S, self.server.answer, self.transport)


@contextmanager
def delayed_server(fail_every: int = 0) -> Iterator[DelayedServer]:
    server = DelayedServer(fail_every)
    server.thread.start()
    try:
        yield server
    finally:
        server.close()


def run_against(server: DelayedServer) -> LoadResult:
    return run(
        server.port, BODIES, path="/v1/test", connections=NUM_CONNECTIONS, processes=2, warmup_s=0.3,
        duration_s=1.5,
    )  # fmt: skip


def test_latencies_and_rate_match_a_server_with_fixed_delay() -> None:
    with delayed_server() as server:
        result = run_against(server)
        answered = server.answered_during(result)
    assert result.num_errors == 0 and result.first_error == ""
    assert result.num_requests > 0 and len(result.latencies_ns) == result.num_requests
    assert result.latencies_ns.min() >= DELAY_S * 1e9
    assert 0.3 * NUM_CONNECTIONS / DELAY_S <= result.requests_per_s <= 1.05 * NUM_CONNECTIONS / DELAY_S
    # Only requests sent and answered within the phase count, so the server answered each of them in it.
    assert len(answered) >= result.num_requests
    assert result.p50_ms <= result.p99_ms <= result.p999_ms <= result.max_ms
    assert result.max_ms == pytest.approx(result.latencies_ns.max() / 1e6)
    end_ns = result.start_ns + result.duration_s * 1e9
    assert result.sent_ns.min() >= result.start_ns
    assert (result.sent_ns + result.latencies_ns).max() < end_ns
    assert result.num_body_bytes == result.num_requests * len(b'{"data": []}')
    assert result.loadgen_cpu_us > 0
    assert result.table().count("\n") == 2


def test_non_200_answers_count_as_errors_with_their_status() -> None:
    with delayed_server(fail_every=4) as server:
        result = run_against(server)
        answered = server.answered_during(result)
    assert result.first_error.startswith('503: {"error": "overloaded"}')
    assert set(np.unique(result.statuses)) == {200, 503}
    assert 0 < result.num_errors == np.count_nonzero(result.statuses == 503) <= answered.count(503)
    assert result.num_errors == pytest.approx(result.num_requests / 4, rel=0.1)
