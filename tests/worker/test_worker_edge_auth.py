"""The worker's edge against callers without the shared token: real grpc.aio server and client, real
TCP to the data port, a stand-in engine. Admin RPCs always need the token once one is set, data RPCs
and the data port while `auth_data` is on; both health services stay open."""

import asyncio
import struct

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from test_stream_server import as_frame, as_responses

from kembed.proto import embedder_pb2 as pb
from kembed.proto import embedder_pb2_grpc as pb_grpc
from kembed.worker.edge.frames import MAX_AUTH_FRAME_BYTES, FrameService, serve_frames
from kembed.worker.edge.server import EmbedderService, build_server
from kembed.worker.info import ModelInfo
from kembed.worker.scheduling.scheduler import Scheduler

TOKEN = "s3cret-token"
INFO = ModelInfo(
    model_name="stand-in", model_type="bert", task="embed", dimensions=3, max_sequence_length=512,
    vocab_size=1000, pooling="mean", normalize=False, dtype="float32", device="cpu", attention_backend="sdpa",
)  # fmt: skip


class _Rows:
    def __init__(self, rows: np.ndarray) -> None:
        self._rows = rows

    def wait(self) -> np.ndarray:
        return self._rows


class StandIn:
    """Row i is [first id, length, 0]; admin calls answer at once."""

    info = INFO
    buckets = None  # no bucket table: admin calls take any batch shape

    def pack(self, token_ids, lengths):
        return token_ids.copy(), lengths.copy()

    def step(self, packed):
        token_ids, lengths = packed
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        return _Rows(np.stack([token_ids[starts], lengths, np.zeros(len(lengths))], 1).astype(np.float32))

    def can_launch_inline(self, packed) -> bool:
        return False  # as an engine without CUDA graphs: every step goes through the launcher thread

    def capture_deferred(self, max_seconds: float) -> int:
        return 0  # nothing to capture

    def captured_buckets(self):
        return []

    def bucket_stats(self):
        return []

    def prewarm(self, buckets):
        return list(buckets)

    def smoke_test(self, buckets, min_cosine, seed):
        return []


@pytest.fixture
async def worker():
    """start(token, auth_data) -> (stub, data_port); everything started is stopped after the test."""
    started = []

    async def start(token: str, auth_data: bool = True):
        scheduler = Scheduler(StandIn(), max_batch_tokens=64, max_queued_tokens=4096)
        service = EmbedderService(StandIn(), scheduler, 64, revision="r1")
        server, port = build_server(service, "127.0.0.1", 0, token, auth_data)
        frames, data_port = await serve_frames(
            FrameService(scheduler, INFO), "127.0.0.1", 0, 1 << 20, token if auth_data else ""
        )
        scheduler.start()
        await server.start()
        await service.set_serving()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        started.append((server, frames, scheduler, channel))
        return channel, data_port

    yield start
    for server, frames, scheduler, channel in started:
        await channel.close()
        frames.close()
        await server.stop(None)
        await scheduler.close()


def embed_request(*first_ids: int) -> pb.EmbedRequest:
    ids = np.array([[i, 7] for i in first_ids], "<i4").ravel()
    return pb.EmbedRequest(batch=pb.TokenBatch(token_ids=ids.tobytes(), lengths=[2] * len(first_ids)))


def bearer(token: str, scheme: str = "Bearer") -> tuple[tuple[str, str], ...]:
    return (("authorization", f"{scheme} {token}"),)


ADMIN_CALLS = {
    "BucketStats": lambda stub, md: stub.BucketStats(pb.BucketStatsRequest(), metadata=md, timeout=5),
    "Prewarm": lambda stub, md: stub.Prewarm(pb.PrewarmRequest(), metadata=md, timeout=5),
    "SmokeTest": lambda stub, md: stub.SmokeTest(pb.SmokeTestRequest(), metadata=md, timeout=5),
}


async def _stream_embed(stub, md):
    call = stub.Stream(metadata=md, timeout=5)
    await call.write(pb.StreamRequest(id=1, embed=embed_request(5)))
    return await call.read()


DATA_CALLS = {
    "Embed": lambda stub, md: stub.Embed(embed_request(5), metadata=md, timeout=5),
    "Score": lambda stub, md: stub.Score(
        pb.ScoreRequest(batch=embed_request(5).batch), metadata=md, timeout=5
    ),
    "Info": lambda stub, md: stub.Info(pb.InfoRequest(), metadata=md, timeout=5),
    "Stream": _stream_embed,
}
LET_IN = {"Score": grpc.StatusCode.UNIMPLEMENTED}  # past the token: the stand-in is an embedder
NO_TOKEN, WRONG_TOKEN = (), bearer("s3cret-tokeN")


async def _code(call) -> grpc.StatusCode:
    try:
        await call
    except grpc.aio.AioRpcError as error:
        return error.code()
    return grpc.StatusCode.OK


@pytest.mark.parametrize("method", sorted(ADMIN_CALLS), ids=str)
@pytest.mark.parametrize("auth_data", [True, False], ids=["data-too", "admin-only"])
async def test_admin_rpcs_refuse_a_missing_or_wrong_token_and_take_the_right_one(worker, method, auth_data):
    channel, _ = await worker(TOKEN, auth_data)
    stub = pb_grpc.EmbedderStub(channel)
    call = ADMIN_CALLS[method]
    assert await _code(call(stub, NO_TOKEN)) == grpc.StatusCode.UNAUTHENTICATED
    assert await _code(call(stub, WRONG_TOKEN)) == grpc.StatusCode.UNAUTHENTICATED
    assert await _code(call(stub, (("authorization", TOKEN),))) == grpc.StatusCode.UNAUTHENTICATED
    assert await _code(call(stub, bearer(TOKEN))) == grpc.StatusCode.OK
    assert await _code(call(stub, bearer(TOKEN, "bearer"))) == grpc.StatusCode.OK  # scheme: any case


@pytest.mark.parametrize("method", sorted(DATA_CALLS), ids=str)
async def test_data_rpcs_need_the_token_while_auth_data_is_on(worker, method):
    channel, _ = await worker(TOKEN, auth_data=True)
    stub = pb_grpc.EmbedderStub(channel)
    call = DATA_CALLS[method]
    assert await _code(call(stub, NO_TOKEN)) == grpc.StatusCode.UNAUTHENTICATED
    assert await _code(call(stub, WRONG_TOKEN)) == grpc.StatusCode.UNAUTHENTICATED
    assert await _code(call(stub, bearer(TOKEN))) == LET_IN.get(method, grpc.StatusCode.OK)


@pytest.mark.parametrize("method", sorted(DATA_CALLS), ids=str)
async def test_data_rpcs_are_open_when_only_admin_calls_need_the_token(worker, method):
    channel, _ = await worker(TOKEN, auth_data=False)
    code = await _code(DATA_CALLS[method](pb_grpc.EmbedderStub(channel), NO_TOKEN))
    assert code == LET_IN.get(method, grpc.StatusCode.OK)


async def test_health_services_stay_open_with_a_token(worker):
    channel, _ = await worker(TOKEN, auth_data=True)
    health = await pb_grpc.EmbedderStub(channel).Health(pb.HealthRequest(), timeout=5)
    assert health.status == pb.HealthResponse.SERVING
    check = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert check.status == health_pb2.HealthCheckResponse.SERVING


async def test_a_token_sent_to_a_worker_without_one_is_ignored(worker):
    channel, data_port = await worker("")
    stub = pb_grpc.EmbedderStub(channel)
    assert await _code(ADMIN_CALLS["Prewarm"](stub, bearer(TOKEN))) == grpc.StatusCode.OK
    assert await _code(DATA_CALLS["Stream"](stub, bearer(TOKEN))) == grpc.StatusCode.OK
    reader, writer = await asyncio.open_connection("127.0.0.1", data_port)
    await send(writer, pb.StreamRequest(auth_token=TOKEN), pb.StreamRequest(id=3, embed=embed_request(9)))
    answer = await read(reader)  # the token frame got no answer of its own
    assert answer.id == 3 and answer.WhichOneof("result") == "embed"
    writer.close()


# --- the data port ------------------------------------------------------------------------------


async def send(writer: asyncio.StreamWriter, *messages: pb.StreamRequest | bytes) -> None:
    """All `messages` as RequestFrames (a request each) in one write, so the worker reads them in
    one piece."""
    data = b""
    for message in messages:
        body = message if isinstance(message, bytes) else as_frame(message).SerializeToString()
        data += struct.pack("<I", len(body)) + body
    writer.write(data)
    await writer.drain()


async def read(reader: asyncio.StreamReader) -> pb.StreamResponse | None:
    """The first answer of the next ResultFrame, or None when the worker closed the connection."""
    try:
        (length,) = struct.unpack("<I", await asyncio.wait_for(reader.readexactly(4), 5))
        return as_responses(pb.ResultFrame.FromString(await reader.readexactly(length)))[0]
    except (asyncio.IncompleteReadError, ConnectionResetError):
        return None


@pytest.mark.parametrize(
    "first",
    [
        pb.StreamRequest(id=1, embed=embed_request(5)),
        pb.StreamRequest(auth_token="wrong"),
        pb.StreamRequest(auth_token=TOKEN, id=1, embed=embed_request(5)),  # a token frame holds nothing else
        b"\xff" * 16,
        pb.StreamRequest(auth_token="x" * MAX_AUTH_FRAME_BYTES),  # over the first frame's limit
    ],
    ids=["no-token", "wrong-token", "token-with-a-request", "garbage", "oversized"],
)
async def test_data_port_closes_a_connection_whose_first_frame_is_not_the_token(worker, first):
    _, data_port = await worker(TOKEN)
    reader, writer = await asyncio.open_connection("127.0.0.1", data_port)
    await send(writer, first, pb.StreamRequest(id=2, embed=embed_request(5)))
    assert await read(reader) is None
    writer.close()


async def test_data_port_serves_a_connection_that_shows_the_token_first(worker):
    _, data_port = await worker(TOKEN)
    reader, writer = await asyncio.open_connection("127.0.0.1", data_port)
    # the token and a large request in one piece: the request is read under the full frame limit
    large = pb.StreamRequest(id=1, embed=embed_request(*range(1, 800)))
    assert large.ByteSize() > MAX_AUTH_FRAME_BYTES
    await send(writer, pb.StreamRequest(auth_token=TOKEN), large)
    answer = await read(reader)
    assert answer.id == 1 and answer.embed.num_sequences == 799
    await send(writer, pb.StreamRequest(id=2, embed=embed_request(42)))
    answer = await read(reader)
    rows = np.frombuffer(answer.embed.embeddings, "<f4")
    assert answer.id == 2 and rows[0] == 42
    writer.close()
