"""The gateway's data path to a replica: its data port (frames carrying many requests each way, one
connection per replica), or unary gRPC calls where it has none or it cannot be reached; chosen when
the replica's Info is read. Sharing a frame, a replica dying with requests in flight, deadlines,
cancellation and errors per request, the frame window."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from dataclasses import dataclass, field

import grpc
import numpy as np
import pytest
import transformers
from gateway_fakes import BUNDLED_MODEL_DIR, FakeEmbedder, fake_vector, serving, unpack

from kembed.gateway.pool.batches import Part
from kembed.gateway.pool.transports import FrameTransport
from kembed.proto import embedder_pb2 as pb


@pytest.fixture(params=["frames", "unary"])
def transport(request) -> str:
    return request.param


def fake_for(transport: str, **kwargs) -> FakeEmbedder:
    return FakeEmbedder(has_data_port=transport == "frames", **kwargs)


def expected(sequences: list[list[int]]) -> np.ndarray:
    raw = np.stack([fake_vector(np.array(s)) for s in sequences])
    return raw / np.linalg.norm(raw, axis=1, keepdims=True)


async def transports_of(client) -> list[str]:
    return [w["transport"] for w in (await client.get("/info")).json()["workers"]]


async def test_concurrent_requests_share_frames_of_one_connection_and_reach_their_callers(
    gateway_with, transport
):
    fake = fake_for(transport, delay_s=0.002)
    inputs = [[[i + 1, (i * 31) % 997 + 1, i % 7 + 1]] for i in range(64)]
    async with gateway_with(fake) as client:
        responses = await asyncio.gather(*(client.post("/embed", json={"inputs": x}) for x in inputs))
        assert await transports_of(client) == [transport]
    assert [r.status_code for r in responses] == [200] * 64
    for sequences, response in zip(inputs, responses, strict=True):
        np.testing.assert_allclose(response.json(), expected(sequences), rtol=1e-6)
    if transport == "frames":
        assert fake.frame_connections == 1 and fake.frame_requests == 64
        assert sum(fake.frames) == 64 and max(fake.frames) > 1  # requests of one turn shared a frame
    else:
        assert fake.frame_requests == 0 and len(fake.batches) == 64  # a call each


async def test_a_replica_dying_with_requests_in_flight_loses_none(gateway_with, transport):
    healthy, doomed = fake_for(transport), fake_for(transport, delay_s=5.0)  # doomed holds them all
    async with contextlib.AsyncExitStack() as stack:
        dying = serving(doomed)
        address = await dying.__aenter__()
        client = await stack.enter_async_context(gateway_with(address, healthy, max_chunk_sequences=1))
        sequences = [[i + 1, 2, 3] for i in range(24)]
        request = asyncio.create_task(client.post("/embed", json={"inputs": sequences}))
        for _ in range(200):  # until the doomed replica holds some of the chunks
            if doomed.num_received and healthy.batches:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        await dying.__aexit__(None, None, None)  # killed: its connection breaks with chunks in flight
        response = await asyncio.wait_for(request, 10)
    assert response.status_code == 200
    np.testing.assert_allclose(response.json(), expected(sequences), rtol=1e-6)
    assert doomed.num_received  # it held chunks when it died
    assert len(healthy.sequences) == 24  # it answered none: all were retried on the other


async def test_a_deadline_passing_cancels_the_request_in_the_worker_and_the_connection_carries_on(
    gateway_with,
):
    fake = FakeEmbedder(delay_s=2.0)
    async with gateway_with(fake, request_timeout_s=0.3) as client:
        slow = await client.post("/embed", json={"inputs": "slow"})
        assert slow.status_code == 504
        fake.delay_s = 0.0
        fast = await client.post("/embed", json={"inputs": "fast"})
        assert fast.status_code == 200
        for _ in range(100):  # the timed-out request was cancelled in the worker
            if fake.cancels:
                break
            await asyncio.sleep(0.01)
    assert fake.cancels == 1
    assert fake.frame_connections == 1


async def test_a_caller_giving_up_sends_its_id_to_cancel():
    fake = FakeEmbedder(delay_s=5.0)
    async with serving(fake):
        frames = FrameTransport(
            "fake", "127.0.0.1", fake.data_port, max_frame_bytes=1 << 20, connect_timeout_s=5
        )
        part = Part(
            "r1", [np.array([5, 6], np.int32)], None, 2, deadline=asyncio.get_running_loop().time() + 30
        )
        waiting = asyncio.create_task(frames.request("embed", part, 30))
        await asyncio.sleep(0.1)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        for _ in range(100):
            if fake.cancels:
                break
            await asyncio.sleep(0.01)
        assert fake.cancels == 1
        await frames.close()


async def test_the_configured_unary_transport_is_used_even_with_a_data_port(gateway_with):
    fake = FakeEmbedder()
    async with gateway_with(fake, worker_transport="unary") as client:
        assert (await client.post("/embed", json={"inputs": ["a", "b"]})).status_code == 200
        assert await transports_of(client) == ["unary"]
    assert fake.frame_connections == 0 and len(fake.batches) == 1


async def test_an_unreachable_data_port_is_replaced_by_unary_calls_at_connect(gateway_with):
    """Info advertises a data port where nothing listens (a network policy, a worker going away):
    the replica is served by unary calls from the start, every request answered."""
    fake = FakeEmbedder(has_data_port=False)
    with socket.socket() as closed:  # a port bound and not listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        fake.data_port = closed.getsockname()[1]
        async with gateway_with(fake) as client:
            responses = await asyncio.gather(
                *(client.post("/embed", json={"inputs": f"q {i}"}) for i in range(8))
            )
            assert await transports_of(client) == ["unary"]
    assert [r.status_code for r in responses] == [200] * 8
    assert len(fake.batches) == 8


async def test_the_data_port_connection_is_open_before_the_first_request(gateway_with):
    fake = FakeEmbedder()
    async with gateway_with(fake) as client:
        assert fake.frame_connections == 1 and fake.frame_requests == 0  # opened when Info was read
        assert (await client.post("/embed", json={"inputs": "first"})).status_code == 200
    assert fake.frame_connections == 1


@dataclass
class PickyEmbedder(FakeEmbedder):
    """Refuses, as a worker would an id past its vocabulary, any request holding token id 999."""

    num_refused: int = 0

    async def Embed(self, request: pb.EmbedRequest, context: grpc.aio.ServicerContext) -> pb.EmbedResponse:
        if 999 in np.frombuffer(request.batch.token_ids, dtype="<i4"):
            self.num_refused += 1
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "token id 999 is out of range")
        return await super().Embed(request, context)


async def test_a_request_the_worker_refuses_fails_alone_in_its_frame(gateway_with):
    fake = PickyEmbedder(delay_s=0.02)
    async with gateway_with(fake) as client:
        refused, accepted = await asyncio.gather(
            client.post("/embed", json={"inputs": [[999, 1]]}),
            client.post("/embed", json={"inputs": [[5, 6]]}),
        )
    assert refused.status_code == 422 and "999" in refused.json()["error"]
    assert accepted.status_code == 200
    np.testing.assert_allclose(accepted.json(), expected([[5, 6]]), rtol=1e-6)
    assert fake.frames == [2] and fake.num_refused == 1  # one frame, and only the culprit refused


async def test_with_a_frame_window_chunks_wait_and_share_the_next_frame(gateway_with):
    fake = FakeEmbedder(delay_s=0.05)
    sequences = [[i + 1, i + 2, i + 3] for i in range(12)]
    async with gateway_with(fake, max_inflight_frames=1) as client:
        first = asyncio.create_task(client.post("/embed", json={"inputs": [[40, 41]]}))
        await asyncio.sleep(0.02)  # its frame is out: the window is full
        responses = await asyncio.gather(*(client.post("/embed", json={"inputs": [s]}) for s in sequences))
        assert (await first).status_code == 200
    for sequence, response in zip(sequences, responses, strict=True):
        np.testing.assert_allclose(response.json(), expected([sequence]), rtol=1e-6)
    assert fake.frames[0] == 1 and sum(fake.frames) == 13
    assert len(fake.frames) <= 3  # the twelve waited for the first frame's answer, then went together


@dataclass
class SlowScorer(FakeEmbedder):
    """A cross-encoder double whose logit depends on every id and token type of the pair."""

    task: str = "score"
    num_labels: int = 1
    batch_sizes: list[int] = field(default_factory=list)

    async def Score(self, request: pb.ScoreRequest, context: grpc.aio.ServicerContext) -> pb.ScoreResponse:
        await asyncio.sleep(0.05)
        ids = unpack(request.batch)
        types = unpack(pb.TokenBatch(token_ids=request.batch.token_type_ids, lengths=request.batch.lengths))
        self.batch_sizes.append(len(ids))
        logits = np.array([[pair_logit(i, t)] for i, t in zip(ids, types, strict=True)], dtype="<f4")
        return pb.ScoreResponse(scores=logits.tobytes(), num_sequences=len(ids), num_labels=1)


def pair_logit(ids: np.ndarray, types: np.ndarray) -> float:
    return float(int((ids.astype(np.int64) * (types.astype(np.int64) + 1)).sum()) % 997) / 100 - 5


async def test_concurrent_reranks_sharing_frames_keep_each_pairs_token_types(gateway_with):
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(BUNDLED_MODEL_DIR))
    query, docs = "which city is the capital?", [f"document {i} about city number {i}" for i in range(10)]
    fake = SlowScorer()
    async with gateway_with(fake) as client:
        responses = await asyncio.gather(
            *(
                client.post("/rerank", json={"query": query, "texts": [doc], "raw_scores": True})
                for doc in docs
            )
        )
    for doc, response in zip(docs, responses, strict=True):
        encoded = tokenizer(query, doc)
        want = pair_logit(np.array(encoded["input_ids"]), np.array(encoded["token_type_ids"]))
        assert response.json()[0]["score"] == pytest.approx(want, rel=1e-6)
    assert max(fake.frames) > 1  # some frames carried several requests' pairs


async def test_each_bulk_request_travels_in_frames_of_its_own(gateway_with):
    """The worker takes turns between frames: two indexing requests sent at once are served in turn,
    not one after the other, and queries still share a frame."""
    fake = FakeEmbedder()
    bulk = {"X-Kembed-Priority": "bulk"}
    async with gateway_with(fake, max_chunk_sequences=2) as client:
        responses = await asyncio.gather(
            *(
                client.post("/embed", json={"inputs": [[i, j] for j in range(1, 7)]}, headers=bulk)
                for i in (1, 2)
            )
        )
        assert [r.status_code for r in responses] == [200, 200]
        assert sorted(fake.frames) == [3, 3]  # three chunks each, a frame each
        fake.frames.clear()
        queries = await asyncio.gather(*(client.post("/embed", json={"inputs": [[i, 9]]}) for i in (1, 2)))
        assert [r.status_code for r in queries] == [200, 200]
        assert fake.frames == [2]
