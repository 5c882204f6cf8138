"""The worker's gRPC edge in-process: real grpc.aio server, real engine, status codes for bad input."""

import asyncio
import threading

import grpc
import numpy as np
import pytest

from kembed.proto import embedder_pb2 as pb
from kembed.proto import embedder_pb2_grpc as pb_grpc
from kembed.worker.config import WorkerConfig, bundled_model_dir
from kembed.worker.engine import load_engine
from kembed.worker.scheduler import Scheduler
from kembed.worker.server import EmbedderService, build_server


@pytest.fixture(scope="module")
def engine():
    return load_engine(WorkerConfig(model=bundled_model_dir(), device="cpu"))


async def _serve(runner, **scheduler_kwargs):
    scheduler = Scheduler(runner, **scheduler_kwargs)
    service = EmbedderService(runner, scheduler, scheduler.max_batch_tokens, revision="r1")
    server, port = build_server(service, "127.0.0.1", 0)
    scheduler.start()
    await server.start()
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


async def test_a_bucket_that_is_no_batch_shape_is_invalid(stub):
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Prewarm(pb.PrewarmRequest(buckets=[pb.Bucket(num_sequences=8, num_tokens=4)]))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


class _GatedRunner:
    """Holds every batch until `release` is set, so the queue stays full while the test probes it."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.info = engine.info
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
