"""The gateway's data path, one connection per replica (the worker's data port, or a gRPC stream where
it has none): multiplexing, a replica dying mid-stream, deadlines and cancellation per request, and
the fallbacks."""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import numpy as np
import pytest
from gateway_fakes import FakeEmbedder, fake_vector, serving, unused_address

from kembed.gateway.streams import WorkerStream
from kembed.proto import embedder_pb2 as pb
from kembed.proto import embedder_pb2_grpc as pb_grpc


@pytest.fixture(params=["frames", "stream"])
def transport(request) -> str:
    return request.param


def fake_for(transport: str, **kwargs) -> FakeEmbedder:
    return FakeEmbedder(has_data_port=transport == "frames", **kwargs)


def connections(fake: FakeEmbedder) -> int:
    return fake.frame_connections if fake.has_data_port else fake.streams_opened


def requests_received(fake: FakeEmbedder) -> int:
    return fake.frame_requests if fake.has_data_port else fake.stream_requests


def expected(sequences: list[list[int]]) -> np.ndarray:
    raw = np.stack([fake_vector(np.array(s)) for s in sequences])
    return raw / np.linalg.norm(raw, axis=1, keepdims=True)


async def test_concurrent_requests_share_one_connection_and_reach_their_callers(gateway_with, transport):
    fake = fake_for(transport, delay_s=0.002)
    inputs = [[[i + 1, (i * 31) % 997 + 1, i % 7 + 1]] for i in range(64)]
    async with gateway_with(fake, max_inflight_rpcs=0) as client:  # every chunk its own request
        responses = await asyncio.gather(*(client.post("/embed", json={"inputs": x}) for x in inputs))
    assert [r.status_code for r in responses] == [200] * 64
    for sequences, response in zip(inputs, responses, strict=True):
        np.testing.assert_allclose(response.json(), expected(sequences), rtol=1e-6)
    assert connections(fake) == 1
    assert len(fake.batches) == 64 == requests_received(fake)  # each its own request on that one


async def test_a_replica_dying_mid_stream_loses_no_request(gateway_with, transport):
    healthy, doomed = fake_for(transport), fake_for(transport, delay_s=5.0)  # doomed holds them all
    async with contextlib.AsyncExitStack() as stack:
        dying = serving(doomed)
        address = await dying.__aenter__()
        client = await stack.enter_async_context(
            gateway_with(address, healthy, max_inflight_rpcs=0, max_chunk_sequences=1)
        )
        sequences = [[i + 1, 2, 3] for i in range(24)]
        request = asyncio.create_task(client.post("/embed", json={"inputs": sequences}))
        for _ in range(200):  # until the doomed replica holds some of the chunks
            if requests_received(doomed) and healthy.batches:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        await dying.__aexit__(None, None, None)  # killed: its connection breaks with chunks in flight
        response = await asyncio.wait_for(request, 10)
    assert response.status_code == 200
    np.testing.assert_allclose(response.json(), expected(sequences), rtol=1e-6)
    assert requests_received(doomed) > 0  # it held chunks when it died
    assert len(healthy.sequences) == 24  # it answered none: all were retried on the other


async def test_a_deadline_expires_per_request_and_the_connection_carries_on(gateway_with, transport):
    fake = fake_for(transport, delay_s=2.0)
    async with gateway_with(fake, request_timeout_s=0.3, max_inflight_rpcs=0) as client:
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
    assert connections(fake) == 1


async def test_a_caller_giving_up_sends_a_cancel():
    fake = FakeEmbedder(delay_s=5.0, has_data_port=False)
    async with serving(fake) as address:
        channel = grpc.aio.insecure_channel(address)
        stream = WorkerStream(pb_grpc.EmbedderStub(channel), address)
        batch = pb.TokenBatch(token_ids=np.array([5, 6], "<i4").tobytes(), lengths=[2])
        waiting = asyncio.create_task(stream.request("embed", pb.EmbedRequest(batch=batch), timeout_s=30))
        await asyncio.sleep(0.1)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        for _ in range(100):
            if fake.cancels:
                break
            await asyncio.sleep(0.01)
        assert fake.cancels == 1
        await stream.close()
        await channel.close()


async def test_a_worker_without_stream_is_served_by_unary_calls(gateway_with):
    old = FakeEmbedder(has_stream=False, has_data_port=False)
    async with gateway_with(old) as client:
        for text in ("one", "two"):
            response = await client.post("/v1/embeddings", json={"input": text})
            assert response.status_code == 200
    assert len(old.batches) == 2


@pytest.mark.parametrize("configured", ["unary", "stream"])
async def test_the_configured_transport_is_used(gateway_with, configured):
    fake = FakeEmbedder()  # offers all three
    async with gateway_with(fake, worker_transport=configured) as client:
        assert (await client.post("/embed", json={"inputs": ["a", "b"]})).status_code == 200
        assert [w["transport"] for w in (await client.get("/info")).json()["workers"]] == [configured]
    assert fake.frame_connections == 0 and len(fake.batches) == 1
    assert fake.streams_opened == (1 if configured == "stream" else 0)


async def test_an_unreachable_data_port_falls_back_to_the_grpc_stream(gateway_with):
    fake = FakeEmbedder()
    async with serving(fake) as address:
        fake.data_port = int(unused_address().rpartition(":")[2])  # advertised, but nothing listens
        async with gateway_with(address) as client:
            assert [w["transport"] for w in (await client.get("/info")).json()["workers"]] == ["frames"]
            for text in ("one", "two"):
                assert (await client.post("/embed", json={"inputs": text})).status_code == 200
            assert [w["transport"] for w in (await client.get("/info")).json()["workers"]] == ["stream"]
    assert fake.frame_requests == 0 and fake.stream_requests == 2


async def test_the_data_port_connection_is_open_before_the_first_request(gateway_with):
    fake = FakeEmbedder()
    async with gateway_with(fake) as client:
        for _ in range(100):  # opened once the worker's Info has been read, not by a request
            if fake.frame_connections:
                break
            await asyncio.sleep(0.01)
        assert fake.frame_connections == 1 and fake.frame_requests == 0
        assert (await client.post("/embed", json={"inputs": "first"})).status_code == 200
    assert fake.frame_connections == 1


async def test_requests_that_find_the_data_port_gone_at_once_all_go_over_grpc(gateway_with):
    """Info advertises a data port where nothing listens (a worker going away, a network policy):
    concurrent requests all fail to connect, and every one is answered over gRPC (the first to come
    back drops the port; none trips over that)."""
    import socket

    fake = FakeEmbedder(has_data_port=False)
    with socket.socket() as closed:  # a port bound and not listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        fake.data_port = closed.getsockname()[1]
        async with gateway_with(fake) as client:
            responses = await asyncio.gather(
                *(client.post("/embed", json={"inputs": f"query {i}"}) for i in range(8))
            )
            workers = (await client.get("/info")).json()["workers"]
    assert [r.status_code for r in responses] == [200] * 8
    assert workers[0]["transport"] in ("stream", "unary")
