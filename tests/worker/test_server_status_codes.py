"""The worker's gRPC edge in-process: real grpc.aio server, real engine, status codes for bad input."""

import asyncio
import logging
import threading

import grpc
import numpy as np
import pytest

from kembed.proto import embedder_pb2 as pb
from kembed.proto import embedder_pb2_grpc as pb_grpc
from kembed.worker.config import WorkerConfig, bundled_model_dir
from kembed.worker.edge.server import EmbedderService, build_server
from kembed.worker.engine import load_engine
from kembed.worker.scheduling.scheduler import Scheduler


@pytest.fixture(scope="module")
def engine():
    return load_engine(WorkerConfig(model=bundled_model_dir(), device="cpu"))


async def _serve(runner, **scheduler_kwargs):
    scheduler = Scheduler(runner, **scheduler_kwargs)
    service = EmbedderService(runner, scheduler, scheduler.max_batch_tokens, revision="r1")
    server, port = build_server(service, "127.0.0.1", 0)
    scheduler.start()
    await server.start()
    await service.set_serving()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    return server, scheduler, channel, pb_grpc.EmbedderStub(channel)


@pytest.fixture
async def stub(engine):
    server, scheduler, channel, stub = await _serve(engine, max_batch_tokens=512, max_queued_tokens=4096)
    yield stub
    await channel.close()
    await server.stop(None)
    await scheduler.close()


def batch(*sequences: list[int]) -> pb.EmbedRequest:
    ids = np.concatenate([np.array(s, "<i4") for s in sequences]) if sequences else np.array([], "<i4")
    return pb.EmbedRequest(batch=pb.TokenBatch(token_ids=ids.tobytes(), lengths=[len(s) for s in sequences]))


async def test_embed_returns_packed_float32_rows_in_order(stub, engine):
    seqs = ([101, 7592, 2088, 102], [101, 102], [101, 2023, 2003, 1037, 3231, 102])
    response = await stub.Embed(batch(*seqs))
    rows = np.frombuffer(response.embeddings, "<f4").reshape(response.num_sequences, response.dimensions)
    assert rows.shape == (3, 384)
    for seq, row in zip(seqs, rows, strict=True):  # each row equals that sequence run on its own
        alone = engine.step(engine.pack(np.array(seq, np.int32), np.array([len(seq)], np.int32))).wait()[0]
        np.testing.assert_allclose(row, alone, rtol=1e-4, atol=1e-5)


async def test_info_reports_the_model_and_the_resolved_engine(stub):
    info = await stub.Info(pb.InfoRequest())
    assert (info.dimensions, info.vocab_size, info.pooling, info.normalize) == (384, 30522, "mean", True)
    assert info.attention_backend == "sdpa" and info.device == "cpu" and info.revision == "r1"
    health = await stub.Health(pb.HealthRequest())
    assert health.status == pb.HealthResponse.SERVING


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (batch(), "no sequences"),
        (batch([101, 102], []), "sequence 1 is empty"),
        (batch([101, 30522, 102]), "token id 30522"),
        (batch([101, -1, 102]), "token id -1"),
        (batch(list(range(1000, 1513))), "at most 512"),
        (pb.EmbedRequest(batch=pb.TokenBatch(token_ids=b"\x01\x02\x03", lengths=[1])), "whole number"),
        (pb.EmbedRequest(batch=pb.TokenBatch(token_ids=b"\x00" * 8, lengths=[3])), "add up to 3"),
    ],
    ids=[
        "empty-batch",
        "empty-sequence",
        "id-past-vocab",
        "negative-id",
        "too-long",
        "ragged-bytes",
        "lengths-mismatch",
    ],
)
async def test_bad_batches_are_invalid_argument_with_the_reason(stub, request_, message):
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Embed(request_)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in caught.value.details()
    assert (await stub.Embed(batch([101, 102]))).num_sequences == 1  # still serving


async def test_an_embedder_answers_unimplemented_for_score(stub):
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Score(pb.ScoreRequest(batch=batch([101, 102]).batch))
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_bucket_stats_count_hits_and_prewarm_then_smoke_test_pass(stub):
    for _ in range(3):
        await stub.Embed(batch([101, 7592, 102], [101, 102]))  # 2 sequences, 5 tokens: bucket 2x64
    stats = {
        (s.bucket.num_sequences, s.bucket.num_tokens): s
        for s in (await stub.BucketStats(pb.BucketStatsRequest())).buckets
    }
    assert stats[(2, 64)].hits >= 3
    wanted = [pb.Bucket(num_sequences=4, num_tokens=256), pb.Bucket(num_sequences=1, num_tokens=512)]
    prewarmed = await stub.Prewarm(pb.PrewarmRequest(buckets=wanted))
    assert list(prewarmed.captured) == wanted and not prewarmed.errors
    report = await stub.SmokeTest(pb.SmokeTestRequest(seed=7))
    assert report.passed and {(r.bucket.num_sequences, r.bucket.num_tokens) for r in report.results} >= {
        (4, 256),
        (1, 512),
    }
    assert all(r.min_cosine >= 0.999 and not r.has_nonfinite for r in report.results)


@pytest.mark.parametrize(
    ("buckets", "message"),
    [
        ([(8, 4)], "bucket 8x4 is not one of this worker's"),
        ([(2**31, 2**31)], "bucket 2147483648x2147483648 is not one of this worker's"),
        ([(256, 65536)], "bucket 256x65536 is not one of this worker's"),
        ([(1, 64)] * 100_000, "100000 buckets asked for; this worker has"),
    ],
    ids=["no-batch-shape", "huge", "past-the-token-budget", "too-many"],
)
@pytest.mark.parametrize("rpc", ["Prewarm", "SmokeTest"])
async def test_admin_calls_take_only_this_workers_buckets(stub, buckets, message, rpc):
    request_type = pb.PrewarmRequest if rpc == "Prewarm" else pb.SmokeTestRequest
    request = request_type(buckets=[pb.Bucket(num_sequences=s, num_tokens=t) for s, t in buckets])
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await getattr(stub, rpc)(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in caught.value.details()


class _GatedRunner:
    """`engine`, but every batch is held until `release` is set, so the queue stays full while the
    test probes it. Admin calls go to the engine."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.info = engine.info
        self.buckets = engine.buckets
        self.release = threading.Event()

    def pack(self, token_ids, lengths):
        return self.engine.pack(token_ids, lengths)

    def step(self, packed):
        result = self.engine.step(packed)
        release = self.release

        class Held:
            def wait(self):
                assert release.wait(10)
                return result.wait()

        return Held()

    def can_launch_inline(self, packed) -> bool:
        return False  # a held step must not be polled for on the event loop

    def capture_deferred(self, max_seconds: float) -> int:
        return self.engine.capture_deferred(max_seconds)

    def captured_buckets(self):
        return self.engine.captured_buckets()

    def bucket_stats(self):
        return self.engine.bucket_stats()

    def prewarm(self, buckets):
        return self.engine.prewarm(buckets)

    def smoke_test(self, buckets, min_cosine, seed):
        return self.engine.smoke_test(buckets, min_cosine, seed)


async def test_overload_is_resource_exhausted_at_once_and_the_held_request_still_completes(engine):
    runner = _GatedRunner(engine)
    server, scheduler, channel, stub = await _serve(runner, max_batch_tokens=64, max_queued_tokens=100)
    try:
        held = asyncio.ensure_future(stub.Embed(batch(list(range(1000, 1080)))))
        for _ in range(500):  # until the held request is admitted
            if scheduler.queued_tokens:
                break
            await asyncio.sleep(0.01)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await asyncio.wait_for(stub.Embed(batch(list(range(1000, 1030)))), 5)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "queue full" in caught.value.details()
        runner.release.set()
        assert (await held).num_sequences == 1
    finally:
        runner.release.set()
        await channel.close()
        await server.stop(None)
        await scheduler.close()


async def test_prewarm_skips_hot_buckets_the_target_cannot_form(engine, capsys):
    # A rollout that lowers the batch budget: the serving revision's hottest bucket is not one of the
    # candidate's, and its prewarm Job must not fail for it.
    from kembed.worker.tools.admin import main as admin_main

    small = load_engine(
        WorkerConfig(model=bundled_model_dir(), device="cpu", max_batch_tokens=256, max_queued_tokens=4096)
    )
    started = []
    for runner, budget in ((engine, 2048), (small, 256)):
        scheduler = Scheduler(runner, max_batch_tokens=budget, max_queued_tokens=8192)
        server, port = build_server(EmbedderService(runner, scheduler, budget, revision="r"), "127.0.0.1", 0)
        scheduler.start()
        await server.start()
        started.append((server, scheduler, f"127.0.0.1:{port}"))
    (_, _, big), (_, _, candidate) = started
    try:
        async with grpc.aio.insecure_channel(big) as channel:
            await pb_grpc.EmbedderStub(channel).Embed(batch(*[[101] + [7592] * 100 + [102]] * 4))  # 4x448
        code = await asyncio.to_thread(
            admin_main, ["prewarm", "--target", candidate, "--hot-from", big, "--buckets", "1x64"]
        )
        out = capsys.readouterr().out
    finally:
        for server, scheduler, _ in started:
            await server.stop(None)
            await scheduler.close()
    assert code == 0, out
    assert "skipped hot bucket 4x448: bucket 4x448 is not one of this worker's" in out
    assert "captured 1x64" in out


async def test_a_malformed_message_is_invalid_argument_without_a_traceback(engine, caplog):
    server, scheduler, channel, _ = await _serve(engine, max_batch_tokens=512, max_queued_tokens=4096)
    embed = channel.unary_unary("/kembed.v1.Embedder/Embed")  # raw bytes, no serializer
    try:
        with caplog.at_level(logging.ERROR), pytest.raises(grpc.aio.AioRpcError) as caught:
            await embed(b"\xff\xff\xff\xff")
    finally:
        await channel.close()
        await server.stop(None)
        await scheduler.close()
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed request message" in caught.value.details()
    assert not [r for r in caplog.records if r.exc_info]
