"""Multiplexed requests in the worker, over both carriers: a gRPC `Stream` call (real grpc.aio server
and client) and a connection to the data port (real TCP, length-prefixed RequestFrames and
ResultFrames, here one request to a frame; frame_port tests cover many)."""

import asyncio
import struct
import threading
from dataclasses import dataclass

import grpc
import numpy as np
import pytest

from kembed.proto import embedder_pb2 as pb
from kembed.proto import embedder_pb2_grpc as pb_grpc
from kembed.worker.edge.frames import FrameService, serve_frames
from kembed.worker.edge.server import EmbedderService, build_server
from kembed.worker.info import ModelInfo
from kembed.worker.scheduling.scheduler import Scheduler

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
    """Row i is [first id, length, 0]; with `gate`, every batch waits for it to open. Admin calls
    answer at once."""

    info = INFO
    buckets = None  # no bucket table: admin calls take any batch shape

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

    def can_launch_inline(self, packed) -> bool:
        return False  # as an engine without CUDA graphs: every step goes through the launcher thread

    def capture_deferred(self, max_seconds: float) -> int:
        return 0  # nothing to capture

    def captured_buckets(self) -> list:
        return []

    def bucket_stats(self) -> list:
        return []

    def prewarm(self, buckets: list) -> list:
        return list(buckets)

    def smoke_test(self, buckets: list, min_cosine: float, seed: int) -> list:
        return []


class Ended(Exception):
    """The worker ended the connection: UNAVAILABLE on gRPC, end of file on frames."""


class GrpcClient:
    def __init__(self, stub) -> None:
        self._call = stub.Stream()

    async def send(self, message: pb.StreamRequest) -> None:
        await self._call.write(message)

    async def read(self) -> pb.StreamResponse:
        try:
            response = await asyncio.wait_for(self._call.read(), 5)
        except grpc.aio.AioRpcError as error:
            assert error.code() == grpc.StatusCode.UNAVAILABLE
            raise Ended from None
        if response is grpc.aio.EOF:
            raise Ended
        return response

    async def close(self) -> None:
        self._call.cancel()


class FrameClient:
    """The data port spoken one request per frame, its answers read back as the StreamResponses a
    gRPC Stream would give (a ResultFrame may answer several)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self._answers: list[pb.StreamResponse] = []

    async def send(self, message: pb.StreamRequest | bytes) -> None:
        body = message if isinstance(message, bytes) else as_frame(message).SerializeToString()
        self._writer.write(struct.pack("<I", len(body)) + body)
        await self._writer.drain()

    async def read(self) -> pb.StreamResponse:
        while not self._answers:
            try:
                (length,) = struct.unpack("<I", await asyncio.wait_for(self._reader.readexactly(4), 5))
                body = await self._reader.readexactly(length)
            except asyncio.IncompleteReadError:
                raise Ended from None
            self._answers += as_responses(pb.ResultFrame.FromString(body))
        return self._answers.pop(0)

    async def close(self) -> None:
        self._writer.close()
        await self._writer.wait_closed()


def as_frame(message: pb.StreamRequest) -> pb.RequestFrame:
    """A StreamRequest as a frame of one request (or one cancel, or a token alone)."""
    ids = np.array([message.id], "<u8").tobytes()
    kind = message.WhichOneof("kind")
    if kind is None:
        return pb.RequestFrame(auth_token=message.auth_token)
    if kind == "cancel":
        return pb.RequestFrame(cancel_ids=ids, auth_token=message.auth_token)
    batch = message.embed.batch
    return pb.RequestFrame(
        auth_token=message.auth_token,
        kind=pb.FRAME_KIND_EMBED,
        ids=ids,
        timeouts_ms=np.array([message.timeout_ms], "<u4").tobytes(),
        num_sequences=np.array([len(batch.lengths)], "<u4").tobytes(),
        lengths=np.array(batch.lengths, "<u4").tobytes(),
        token_ids=batch.token_ids,
    )


def as_responses(frame: pb.ResultFrame) -> list[pb.StreamResponse]:
    ids = np.frombuffer(frame.ids, "<u8")
    counts = np.frombuffer(frame.num_rows, "<u4")
    rows = np.frombuffer(frame.rows, "<f4").reshape(-1, frame.width or 1)
    out, at = [], 0
    for request_id, count in zip(ids.tolist(), counts.tolist(), strict=True):
        own = rows[at : at + count]
        at += count
        embedded = pb.EmbedResponse(embeddings=own.tobytes(), num_sequences=count, dimensions=frame.width)
        out.append(pb.StreamResponse(id=request_id, embed=embedded))
    for error in frame.errors:
        for request_id in np.frombuffer(error.ids, "<u8").tolist():
            failure = pb.StreamError(code=error.code, message=error.message)
            out.append(pb.StreamResponse(id=request_id, error=failure))
    return out


@dataclass
class Worker:
    service: EmbedderService
    frame_service: FrameService
    scheduler: Scheduler
    stub: pb_grpc.EmbedderStub
    carrier: str
    data_port: int
    clients: list

    async def drain(self, timeout_s: float) -> None:
        """The carrier's drain, as the worker's shutdown runs it."""
        if self.carrier == "grpc":
            await self.service.streams.drain(timeout_s)
        else:
            await self.frame_service.drain(timeout_s)

    async def open(self):
        if self.carrier == "grpc":
            client = GrpcClient(self.stub)
        else:
            client = FrameClient(*await asyncio.open_connection("127.0.0.1", self.data_port))
        self.clients.append(client)
        return client


@pytest.fixture(params=["grpc", "frames"])
async def served(request):
    started = []

    async def start(runner, **kwargs):
        scheduler = Scheduler(runner, max_batch_tokens=64, max_queued_tokens=4096, **kwargs)
        service = EmbedderService(runner, scheduler, scheduler.max_batch_tokens, revision="r1")
        server, port = build_server(service, "127.0.0.1", 0)
        frame_service = FrameService(scheduler, runner.info)
        frames, data_port = await serve_frames(frame_service, "127.0.0.1", 0, 1 << 20)
        scheduler.start()
        await server.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        stub = pb_grpc.EmbedderStub(channel)
        worker = Worker(service, frame_service, scheduler, stub, request.param, data_port, [])
        started.append((worker, server, frames, channel))
        return worker

    yield start
    for worker, server, frames, channel in started:
        for client in worker.clients:
            await client.close()
        frames.close()
        await channel.close()
        await server.stop(None)
        await worker.scheduler.close()


def embed(request_id: int, first: int, length: int, timeout_ms: int = 0) -> pb.StreamRequest:
    ids = np.arange(first, first + length, dtype="<i4")
    batch = pb.TokenBatch(token_ids=ids.tobytes(), lengths=[length])
    return pb.StreamRequest(id=request_id, embed=pb.EmbedRequest(batch=batch), timeout_ms=timeout_ms)


def rows_of(response: pb.StreamResponse) -> np.ndarray:
    e = response.embed
    return np.frombuffer(e.embeddings, "<f4").reshape(e.num_sequences, e.dimensions)


async def until(condition, timeout_s: float = 2.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)


async def test_many_requests_on_one_connection_are_answered_to_their_ids(served):
    worker = await served(EchoRunner())
    client = await worker.open()
    for i in range(200):
        await client.send(embed(i, first=i + 1, length=1 + i % 7))
    answers = {}
    while len(answers) < 200:
        response = await client.read()
        answers[response.id] = rows_of(response)
    for i in range(200):
        np.testing.assert_array_equal(answers[i], [[i + 1, 1 + i % 7, 0]])


async def test_an_invalid_request_fails_alone_with_its_status(served):
    worker = await served(EchoRunner())
    client = await worker.open()
    await client.send(embed(1, first=5000, length=2))  # id past the vocabulary
    await client.send(embed(2, first=5, length=2))
    first, second = sorted([await client.read(), await client.read()], key=lambda r: r.id)
    assert first.WhichOneof("result") == "error"
    assert first.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "outside [0, 1000)" in first.error.message
    np.testing.assert_array_equal(rows_of(second), [[5, 2, 0]])


async def test_a_deadline_expires_per_request_and_frees_its_queue_space(served):
    gate = threading.Event()
    worker = await served(EchoRunner(gate))
    client = await worker.open()
    await client.send(embed(1, first=1, length=4))  # launched, held at the gate
    await client.send(embed(2, first=2, length=4, timeout_ms=100))  # waits behind it, times out
    response = await client.read()
    assert (response.id, response.error.code) == (2, grpc.StatusCode.DEADLINE_EXCEEDED.value[0])
    assert worker.scheduler.queued_tokens == 4  # only request 1 still holds tokens
    gate.set()
    response = await client.read()
    assert response.id == 1 and rows_of(response).shape == (1, 3)


async def test_cancel_frees_the_queue_and_sends_no_answer(served):
    gate = threading.Event()
    runner = EchoRunner(gate)
    worker = await served(runner, max_inflight_batches=1)
    client = await worker.open()
    await client.send(embed(1, first=1, length=60))  # fills a batch of 64 tokens, held
    await client.send(embed(2, first=2, length=60))  # queued behind
    await until(lambda: worker.scheduler.queued_tokens == 120)
    await client.send(pb.StreamRequest(id=2, cancel=pb.StreamCancel()))
    await until(lambda: worker.scheduler.queued_tokens == 60)
    assert worker.scheduler.queued_tokens == 60
    gate.set()
    await client.send(embed(3, first=3, length=1))
    ids = [(await client.read()).id for _ in range(2)]
    assert sorted(ids) == [1, 3]  # 2 was never answered
    assert runner.num_batches == 2  # and never ran


async def test_a_caller_leaving_cancels_its_requests(served):
    gate = threading.Event()
    worker = await served(EchoRunner(gate))
    client = await worker.open()
    await client.send(embed(1, first=1, length=60))
    await client.send(embed(2, first=2, length=60))
    await until(lambda: worker.scheduler.queued_tokens == 120)
    await client.close()
    worker.clients.remove(client)
    await until(lambda: worker.scheduler.queued_tokens == 0)
    gate.set()
    assert worker.scheduler.queued_tokens == 0


async def test_drain_finishes_requests_in_flight_and_refuses_new_ones(served):
    gate = threading.Event()
    worker = await served(EchoRunner(gate))
    client = await worker.open()
    await client.send(embed(1, first=1, length=4))
    await asyncio.sleep(0.05)
    draining = asyncio.create_task(worker.drain(timeout_s=5))
    await asyncio.sleep(0.05)
    await client.send(embed(2, first=2, length=4))
    refused = await client.read()
    assert (refused.id, refused.error.code) == (2, grpc.StatusCode.UNAVAILABLE.value[0])
    gate.set()
    answered = await client.read()
    assert answered.id == 1 and rows_of(answered).shape == (1, 3)
    await asyncio.wait_for(draining, 5)
    with pytest.raises(Ended):  # then the worker ends the connection
        await client.read()


async def test_unary_embed_still_works_beside_a_connection(served):
    worker = await served(EchoRunner())
    client = await worker.open()
    await client.send(embed(7, first=9, length=3))
    unary = await worker.stub.Embed(embed(0, first=4, length=2).embed)
    rows = np.frombuffer(unary.embeddings, "<f4").reshape(1, 3)
    np.testing.assert_array_equal(rows, [[4, 2, 0]])
    np.testing.assert_array_equal(rows_of(await client.read()), [[9, 3, 0]])


@pytest.mark.parametrize(
    "garbage",
    [struct.pack("<I", 2 << 20), struct.pack("<I", 5) + b"\xff\xff\xff\xff\xff"],
    ids=["frame-over-the-limit", "not-a-request-frame"],
)
@pytest.mark.parametrize("served", ["frames"], indirect=True)  # framing exists on the data port only
async def test_a_broken_frame_closes_only_its_connection(served, garbage):
    worker = await served(EchoRunner())
    bad, good = await worker.open(), await worker.open()
    bad._writer.write(garbage)
    with pytest.raises(Ended):
        await bad.read()
    await good.send(embed(1, first=3, length=2))
    np.testing.assert_array_equal(rows_of(await good.read()), [[3, 2, 0]])
