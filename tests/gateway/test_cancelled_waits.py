"""Every place a request can wait in the gateway ends it as its own outcome when its client leaves
(499) or its deadline passes (504), never as a 500: in the answer, in the request metrics (by
status) and in the errors counter. A real uvicorn server configured as the gateway serves (the
connection edge and its hot routes), fake workers, raw sockets that close. Each case checks, at
the moment of the outcome, that the request was still waiting where the case says."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
import uvicorn
from gateway_fakes import BUNDLED_MODEL_DIR, FakeEmbedder, serving
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kembed.gateway.config import GatewayConfig
from kembed.gateway.edge.app import create_app
from kembed.gateway.edge.processes import uvicorn_config
from kembed.gateway.errors import WorkerFailed
from kembed.gateway.pool.fanout import gather_all
from kembed.proto import embedder_pb2 as pb

LEAVE_AFTER_S = 0.4  # the client closes its connection this long after sending
DEADLINE_S = 0.6  # request_timeout_s of the deadline cases


@dataclass
class Case:
    """Where a request waits: the fakes, the gateway's settings, the body, and what shows it is
    still waiting there when it ends (read from the app and the fakes)."""

    fakes: Callable[[], list[FakeEmbedder]]
    overrides: dict[str, Any]
    body: Callable[[], dict]
    is_waiting: Callable[[Any, list[FakeEmbedder]], bool]
    headers: dict[str, str] = field(default_factory=dict)
    path: str = "/v1/embeddings"
    filler: dict | None = None  # a request sent first that holds what the case waits behind


def _cjk(num_texts: int, num_chars: int) -> list[str]:
    """Texts without whitespace (about a token a character), each different."""
    return [
        "".join(chr(0x4E00 + (i * 7919 + j * 31) % 20000) for j in range(num_chars)) for i in range(num_texts)
    ]


def _texts(num_texts: int, words: int = 8) -> list[str]:
    return [" ".join(f"w{i}x{j}" for j in range(words)) for i in range(num_texts)]


def _not_sent(_: Any, fakes: list[FakeEmbedder]) -> bool:
    return fakes[0].num_received == 0  # still tokenizing: a tokenized request goes to the worker at once


def _held_by_fakes(_: Any, fakes: list[FakeEmbedder]) -> bool:
    return all(fake.queued_tokens > 0 for fake in fakes)


class GoneAfterOneAnswer(FakeEmbedder):
    """A worker whose data connection fails its first chunk UNAVAILABLE and which answers its
    probes NOT_SERVING from then on (it went): a chunk sent once waits for a replica to serve again."""

    async def Embed(self, request, context):
        self.num_received += 1
        if self.delay_s or self.fail_with:  # until the test lets it recover
            self.status = pb.HealthResponse.NOT_SERVING
            await context.abort(grpc.StatusCode.UNAVAILABLE, "fake: gone")
        self.status = pb.HealthResponse.SERVING
        return await super()._embed(request, context)


CASES = {
    # one request in flight under a cap of one: its slot is given back whatever its outcome
    "concurrency-cap": Case(
        fakes=lambda: [FakeEmbedder(delay_s=30.0)],
        overrides={"max_concurrent_requests": 1},
        body=lambda: {"input": ["a query"]},
        is_waiting=_held_by_fakes,
    ),
    # the request's tokens held by the admission (a queue of 64 tokens): given back too
    "token-admission": Case(
        fakes=lambda: [FakeEmbedder(delay_s=30.0, max_queued_tokens=64)],
        overrides={},
        body=lambda: {"input": _texts(4)},
        is_waiting=_held_by_fakes,
    ),
    # 2048 texts of 1,250 CJK characters (7.7 MB): seconds on the tokenization threads
    "tokenizing-threads": Case(
        fakes=lambda: [FakeEmbedder()],
        overrides={"max_queue_wait_s": 60.0},
        body=lambda: {"input": _cjk(2048, 1250)},
        is_waiting=_not_sent,
    ),
    # the same, classed bulk, in the bulk tokenization process
    "tokenizing-processes": Case(
        fakes=lambda: [FakeEmbedder()],
        overrides={"bulk_tokenization_processes": 1, "max_queue_wait_s": 60.0},
        body=lambda: {"input": _cjk(2048, 1250)},
        headers={"X-Kembed-Priority": "bulk"},
        is_waiting=_not_sent,
    ),
    # chunks of 16 tokens behind a window of one chunk: all but the first wait in pacing.Window
    "pacing-window": Case(
        fakes=lambda: [FakeEmbedder(delay_s=30.0, max_queued_tokens=32)],
        overrides={"chunk_tokens": 16, "max_chunk_sequences": 1},
        body=lambda: {"input": _texts(3, words=2)},
        is_waiting=lambda _, fakes: fakes[0].num_received == 1,
    ),
    # every chunk refused for a full queue: tried again after growing pauses (pacing.paced)
    "paced-retries": Case(
        fakes=lambda: [FakeEmbedder(fail_with=grpc.StatusCode.RESOURCE_EXHAUSTED)],
        overrides={"chunk_tokens": 16, "max_chunk_sequences": 1, "max_queue_wait_s": 30.0},
        body=lambda: {"input": _texts(2, words=2)},
        is_waiting=lambda _, fakes: fakes[0].num_received >= 3,
    ),
    # a chunk hedged on a second replica (both slow): two attempts waited on
    "attempts-and-hedges": Case(
        fakes=lambda: [FakeEmbedder(delay_s=30.0), FakeEmbedder(delay_s=30.0)],
        overrides={"hedge_after_s": 0.1, "health_timeout_s": 5.0},
        body=lambda: {"input": ["a query"]},
        is_waiting=lambda _, fakes: sum(f.num_received for f in fakes) == 2,
    ),
    # an answer awaited from a unary Embed call
    "unary-transport": Case(
        fakes=lambda: [FakeEmbedder(delay_s=30.0, has_data_port=False)],
        overrides={"hedge_after_s": 0.0},
        body=lambda: {"input": ["a query"]},
        is_waiting=_held_by_fakes,
    ),
    # an answer awaited on the data port
    "frame-transport": Case(
        fakes=lambda: [FakeEmbedder(delay_s=30.0)],
        overrides={"hedge_after_s": 0.0},
        body=lambda: {"input": ["a query"]},
        is_waiting=_held_by_fakes,
    ),
    # its replica gone (UNAVAILABLE, then NOT_SERVING): the chunk waits for one to serve again
    "rejoin-wait": Case(
        fakes=lambda: [GoneAfterOneAnswer(delay_s=30.0)],
        overrides={"hedge_after_s": 0.0, "max_rejoin_wait_s": 30.0},
        body=lambda: {"input": ["a query"]},
        is_waiting=lambda _, fakes: (
            fakes[0].num_received == 1 and fakes[0].status != pb.HealthResponse.SERVING
        ),
    ),
    # an ASGI route (Cohere's v2 embed: not one of the edge's hot routes), its answer awaited
    "asgi-route": Case(
        fakes=lambda: [FakeEmbedder(delay_s=30.0)],
        overrides={"hedge_after_s": 0.0},
        body=lambda: {"texts": ["a query"], "input_type": "search_query", "embedding_types": ["float"]},
        is_waiting=_held_by_fakes,
        path="/v2/embed",
    ),
    # a chunk held in the gateway behind an unanswered frame (max_inflight_frames 1)
    "frame-window": Case(
        fakes=lambda: [FakeEmbedder(delay_s=30.0)],
        overrides={"hedge_after_s": 0.0, "max_inflight_frames": 1},
        body=lambda: {"input": ["the second query"]},
        is_waiting=lambda _, fakes: fakes[0].num_received == 1,
        filler={"input": ["the first query"]},
    ),
}


@contextlib.asynccontextmanager
async def edge(fakes: list[FakeEmbedder], **overrides: Any) -> AsyncIterator[tuple[int, Any]]:
    async with contextlib.AsyncExitStack() as stack:
        addresses = [await stack.enter_async_context(serving(fake)) for fake in fakes]
        config = dataclasses.replace(
            GatewayConfig(model_dir=BUNDLED_MODEL_DIR, worker_addresses=tuple(addresses)), **overrides
        )
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        app = create_app(config)
        server = uvicorn.Server(uvicorn_config(config, app, port=port, loop="asyncio", log_level="warning"))
        task = asyncio.create_task(server.serve())
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 20
            while not server.started or app.state.routes.service.pool.num_serving() < len(fakes):
                assert loop.time() < deadline, "the gateway never saw its workers serving"
                await asyncio.sleep(0.02)
            yield port, app
        finally:
            server.should_exit = True
            await task


async def _send(port: int, path: str, body: dict, headers: dict[str, str]) -> tuple[Any, Any]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    payload = json.dumps(body, ensure_ascii=False).encode()
    extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: g\r\nContent-Type: application/json\r\n{extra}"
        f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    await writer.drain()
    return reader, writer


async def _status(reader: asyncio.StreamReader, timeout_s: float) -> int:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout_s)
    return int(head.split(b" ", 2)[1])


async def _until(what: str, holds: Callable[[], bool], timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not holds():
        assert loop.time() < deadline, f"not seen within {timeout_s} s: {what}"
        await asyncio.sleep(0.01)


def _samples(app: Any, name: str, label: str) -> dict[str, float]:
    """`name`'s samples by the value of `label`, summed over the others (zeros left out)."""
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(generate_latest(app.state.metrics.registry).decode()):
        for sample in family.samples:
            if sample.name == name and sample.value:
                key = sample.labels[label]
                counts[key] = counts.get(key, 0.0) + sample.value
    return counts


def _codes(app: Any) -> dict[str, float]:
    return _samples(app, "kembed_gateway_request_duration_seconds_count", "code")


def _errors(app: Any) -> dict[str, float]:
    return _samples(app, "kembed_gateway_errors_total", "reason")


@pytest.mark.parametrize("outcome", ["client-left", "deadline"])
@pytest.mark.parametrize("place", list(CASES))
async def test_a_wait_ends_as_499_or_504_never_500(place, outcome):
    case = CASES[place]
    fakes = case.fakes()
    overrides = dict(case.overrides)
    if outcome == "deadline":
        overrides["request_timeout_s"] = DEADLINE_S
    async with edge(fakes, **overrides) as (port, app):
        fillers = []
        if case.filler is not None:
            fillers.append(await _send(port, case.path, case.filler, case.headers))
            await _until("the filler reached the worker", lambda: fakes[0].num_received == 1)
        reader, writer = await _send(port, case.path, case.body(), case.headers)
        loop = asyncio.get_running_loop()
        started = loop.time()
        if outcome == "client-left":
            await asyncio.sleep(LEAVE_AFTER_S)
            assert case.is_waiting(app, fakes), f"the request was not waiting at the {place}"
            writer.close()
            await _until("the request recorded", lambda: sum(_codes(app).values()) == 1)
            assert _codes(app) == {"499": 1}, (_codes(app), _errors(app))
            assert _errors(app) == {}
        else:
            await asyncio.sleep(DEADLINE_S - 0.15)
            assert case.is_waiting(app, fakes), f"the request was not waiting at the {place}"
            status = await _status(reader, timeout_s=10.0)
            writer.close()
            assert status == 504, f"answered {status} at its deadline"
            assert loop.time() - started < DEADLINE_S + 2.0
            await _until("the request recorded", lambda: sum(_codes(app).values()) == 1 + len(fillers))
            assert _codes(app) == {"504": 1 + len(fillers)}, (_codes(app), _errors(app))
            assert _errors(app) == {"timeout": 1 + len(fillers)}
        for _, filler in fillers:
            filler.close()
        await _until("the filler recorded", lambda: sum(_codes(app).values()) == 1 + len(fillers))
        assert "500" not in _codes(app), _codes(app)
        # what the request held is given back: the next one is served (a cap or an admission that
        # kept it would refuse it 429)
        for fake in fakes:
            fake.delay_s, fake.fail_with, fake.status = 0.0, None, pb.HealthResponse.SERVING
        pool = app.state.routes.service.pool
        await _until("the workers serving again", lambda: pool.num_serving() == len(fakes))
        body = {"texts": ["afterwards"]} if case.path == "/v2/embed" else {"input": ["afterwards"]}
        reader, writer = await _send(port, case.path, body, {})
        status = await _status(reader, timeout_s=10.0)
        writer.close()
        assert status == 200, f"the request after it was answered {status}"


async def test_a_request_cancelled_as_one_of_its_chunks_fails_ends_cancelled():
    """A TaskGroup gives a child's error priority over its parent's cancel: a request of several
    chunks whose deadline passed (or whose client left) just as a chunk failed, or whose chunk failed
    in its own cancellation (the pacing window's ValueError), was answered as that error (a 500 for
    an error of the gateway's own) instead of 504 or 499."""

    async def fails_as_it_is_cancelled() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            raise WorkerFailed("a chunk failed as it was cancelled") from None

    async def waits() -> None:
        await asyncio.sleep(30)

    with pytest.raises(TimeoutError):  # the deadline's own outcome: 504
        async with asyncio.timeout(0.05):
            await gather_all([fails_as_it_is_cancelled(), waits()])
    request = asyncio.ensure_future(gather_all([waits(), fails_as_it_is_cancelled()]))
    await asyncio.sleep(0.05)
    request.cancel()  # the client left: 499
    with pytest.raises(asyncio.CancelledError):
        await request
    with pytest.raises(WorkerFailed):  # a chunk failing alone still fails its request as itself
        await gather_all([fails_as_it_is_cancelled(), _raises(WorkerFailed("failed"))])


async def _raises(error: Exception) -> None:
    raise error
