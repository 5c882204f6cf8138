"""The worker's `Stream`: real grpc.aio server and client, many requests multiplexed over one stream."""

import asyncio
import threading

import grpc
import numpy as np
import pytest

from kembed.proto import embedder_pb2 as pb
from kembed.proto import embedder_pb2_grpc as pb_grpc
from kembed.worker.info import ModelInfo
from kembed.worker.scheduler import Scheduler
from kembed.worker.server import EmbedderService, build_server

INFO = ModelInfo(
    model_name="stand-in", model_type="bert", task="embed", dimensions=3, max_sequence_length=512,
    vocab_size=1000, pooling="mean", normalize=False, dtype="float32", device="cpu", attention_backend="sdpa",
)  # fmt: skip


class _Rows:
    def __init__(self, rows: np.ndarray, gate: threading.Event | None) -> None:
        self._rows, self._gate = rows, gate

    def wait(self) -> np.ndarray:
        if self._gate is not None:
            assert self._gate.wait(10), "test gate never opened"
        return self._rows


class EchoRunner:
    """Row i is [first id, length, 0]; with `gate`, every batch waits for it to open."""

    info = INFO

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.gate = gate
        self.num_batches = 0

    def pack(self, token_ids, lengths):
        return token_ids.copy(), lengths.copy()

    def step(self, packed):
        token_ids, lengths = packed
        self.num_batches += 1
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        rows = np.stack([token_ids[starts], lengths, np.zeros(len(lengths))], axis=1).astype(np.float32)
        return _Rows(rows, self.gate)


async def _serve(runner, **kwargs):
    scheduler = Scheduler(runner, max_batch_tokens=64, max_queued_tokens=4096, **kwargs)
    service = EmbedderService(runner, scheduler, scheduler.max_batch_tokens, revision="r1")
    server, port = build_server(service, "127.0.0.1", 0)
    scheduler.start()
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    return service, server, scheduler, channel, pb_grpc.EmbedderStub(channel)


@pytest.fixture
async def served():
    runners = []

    async def start(runner, **kwargs):
        parts = await _serve(runner, **kwargs)
        runners.append(parts)
        return parts

    yield start
    for _service, server, scheduler, channel, _ in runners:
        await channel.close()
        await server.stop(None)
        await scheduler.close()


def embed(request_id: int, first: int, length: int, timeout_ms: int = 0) -> pb.StreamRequest:
    ids = np.arange(first, first + length, dtype="<i4")
    batch = pb.TokenBatch(token_ids=ids.tobytes(), lengths=[length])
    return pb.StreamRequest(id=request_id, embed=pb.EmbedRequest(batch=batch), timeout_ms=timeout_ms)


def rows_of(response: pb.StreamResponse) -> np.ndarray:
    e = response.embed
    return np.frombuffer(e.embeddings, "<f4").reshape(e.num_sequences, e.dimensions)


async def test_many_requests_on_one_stream_are_answered_to_their_ids(served):
    _, _, _, _, stub = await served(EchoRunner())
    call = stub.Stream()
    for i in range(200):
        await call.write(embed(i, first=i + 1, length=1 + i % 7))
    answers = {}
    while len(answers) < 200:
        response = await call.read()
        answers[response.id] = rows_of(response)
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF
    for i in range(200):
        np.testing.assert_array_equal(answers[i], [[i + 1, 1 + i % 7, 0]])


async def test_an_invalid_request_fails_alone_with_its_status(served):
    _, _, _, _, stub = await served(EchoRunner())
    call = stub.Stream()
    await call.write(embed(1, first=5000, length=2))  # id past the vocabulary
    await call.write(embed(2, first=5, length=2))
    first, second = sorted([await call.read(), await call.read()], key=lambda r: r.id)
    assert first.WhichOneof("result") == "error"
    assert first.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "outside [0, 1000)" in first.error.message
    np.testing.assert_array_equal(rows_of(second), [[5, 2, 0]])
    call.cancel()


async def test_a_deadline_expires_per_request_and_frees_its_queue_space(served):
    gate = threading.Event()
    _, _, scheduler, _, stub = await served(EchoRunner(gate))
    call = stub.Stream()
    await call.write(embed(1, first=1, length=4))  # launched, held at the gate
    await call.write(embed(2, first=2, length=4, timeout_ms=100))  # waits behind it, times out
    response = await asyncio.wait_for(call.read(), 5)
    assert (response.id, response.error.code) == (2, grpc.StatusCode.DEADLINE_EXCEEDED.value[0])
    assert scheduler.queued_tokens == 4  # only request 1 still holds tokens
    gate.set()
    response = await asyncio.wait_for(call.read(), 5)
    assert response.id == 1 and rows_of(response).shape == (1, 3)
    call.cancel()


async def test_cancel_frees_the_queue_and_sends_no_answer(served):
    gate = threading.Event()
    runner = EchoRunner(gate)
    _, _, scheduler, _, stub = await served(runner, max_inflight_batches=1)
    call = stub.Stream()
    await call.write(embed(1, first=1, length=60))  # fills a batch of 64 tokens, held
    await call.write(embed(2, first=2, length=60))  # queued behind
    for _ in range(100):
        if scheduler.queued_tokens == 120:
            break
        await asyncio.sleep(0.01)
    await call.write(pb.StreamRequest(id=2, cancel=pb.StreamCancel()))
    for _ in range(100):
        if scheduler.queued_tokens == 60:
            break
        await asyncio.sleep(0.01)
    assert scheduler.queued_tokens == 60
    gate.set()
    await call.write(embed(3, first=3, length=1))
    ids = [(await asyncio.wait_for(call.read(), 5)).id for _ in range(2)]
    assert sorted(ids) == [1, 3]  # 2 was never answered
    assert runner.num_batches == 2  # and never ran
    call.cancel()


async def test_a_caller_leaving_cancels_its_requests(served):
    gate = threading.Event()
    _, _, scheduler, _, stub = await served(EchoRunner(gate))
    call = stub.Stream()
    await call.write(embed(1, first=1, length=60))
    await call.write(embed(2, first=2, length=60))
    for _ in range(100):
        if scheduler.queued_tokens == 120:
            break
        await asyncio.sleep(0.01)
    call.cancel()
    for _ in range(200):
        if scheduler.queued_tokens == 0:
            break
        await asyncio.sleep(0.01)
    gate.set()
    assert scheduler.queued_tokens == 0


async def test_drain_finishes_requests_in_flight_and_refuses_new_ones(served):
    gate = threading.Event()
    service, _, _, _, stub = await served(EchoRunner(gate))
    call = stub.Stream()
    await call.write(embed(1, first=1, length=4))
    await asyncio.sleep(0.05)
    draining = asyncio.create_task(service.streams.drain(timeout_s=5))
    await asyncio.sleep(0.05)
    await call.write(embed(2, first=2, length=4))
    refused = await asyncio.wait_for(call.read(), 5)
    assert (refused.id, refused.error.code) == (2, grpc.StatusCode.UNAVAILABLE.value[0])
    gate.set()
    answered = await asyncio.wait_for(call.read(), 5)
    assert answered.id == 1 and rows_of(answered).shape == (1, 3)
    await asyncio.wait_for(draining, 5)
    with pytest.raises(grpc.aio.AioRpcError) as ended:  # then the stream ends
        await asyncio.wait_for(call.read(), 5)
    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_unary_embed_still_works_beside_a_stream(served):
    _, _, _, _, stub = await served(EchoRunner())
    call = stub.Stream()
    await call.write(embed(7, first=9, length=3))
    unary = await stub.Embed(embed(0, first=4, length=2).embed)
    rows = np.frombuffer(unary.embeddings, "<f4").reshape(1, 3)
    np.testing.assert_array_equal(rows, [[4, 2, 0]])
    np.testing.assert_array_equal(rows_of(await call.read()), [[9, 3, 0]])
    call.cancel()
