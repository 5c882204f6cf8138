"""Chunks go to the least loaded serving replica, are retried elsewhere, and come back in order."""

from __future__ import annotations

import asyncio
import time

import grpc
import numpy as np
import pytest
from gateway_fakes import FakeEmbedder, fake_vector, serving, unused_address

from kembed.gateway.errors import Overloaded
from kembed.gateway.pool.fanout import gather_all


def expected_vectors(sequences: list[list[int]]) -> np.ndarray:
    raw = np.stack([fake_vector(np.array(s)) for s in sequences])
    return raw / np.linalg.norm(raw, axis=1, keepdims=True)


async def chunks_served(client) -> list[int]:
    info = (await client.get("/info")).json()
    return [worker["num_chunks_served"] for worker in info["workers"]]


async def test_chunks_go_to_the_replica_with_fewest_outstanding_tokens(gateway_with):
    # One sequence per chunk: 100 tokens, then three of 10. Round-robin would split them 2/2; counting
    # outstanding tokens sends the three small ones to the replica not busy with the large one.
    first, second = FakeEmbedder(delay_s=0.05), FakeEmbedder(delay_s=0.05)
    sequences = [[1] * 100, [2] * 10, [3] * 10, [4] * 10]
    async with gateway_with(first, second, max_chunk_sequences=1) as client:
        response = await client.post("/embed", json={"inputs": sequences})
        assert response.status_code == 200
        np.testing.assert_allclose(response.json(), expected_vectors(sequences), rtol=1e-6)
        assert await chunks_served(client) == [1, 3]
        info = (await client.get("/info")).json()
    assert sorted(first.batches + second.batches) == [[10], [10], [10], [100]]
    assert [w["outstanding_tokens"] for w in info["workers"]] == [0, 0]


async def test_idle_replicas_share_sequential_requests(gateway_with):
    async with gateway_with(FakeEmbedder(), FakeEmbedder()) as client:
        for _ in range(4):
            assert (await client.post("/embed", json={"inputs": "hello"})).status_code == 200
        assert await chunks_served(client) == [2, 2]


@pytest.mark.parametrize(
    ("num_inputs", "max_chunk_sequences"),
    [(300, 7), (64, 64), (5, 1)],
    ids=["many-chunks", "one-chunk", "one-per-chunk"],
)
async def test_vectors_reassemble_in_input_order_across_replicas(
    gateway_with, num_inputs, max_chunk_sequences
):
    sequences = [[(i * 7) % 30000 + 1] * (i % 13 + 1) + [i + 1] for i in range(num_inputs)]
    async with gateway_with(
        FakeEmbedder(), FakeEmbedder(), chunk_tokens=64, max_chunk_sequences=max_chunk_sequences
    ) as client:
        response = await client.post("/v1/embeddings", json={"input": sequences})
        assert response.status_code == 200
        body = response.json()
        assert [item["index"] for item in body["data"]] == list(range(num_inputs))
        vectors = [item["embedding"] for item in body["data"]]
        np.testing.assert_allclose(vectors, expected_vectors(sequences), rtol=1e-6)
        assert body["usage"]["prompt_tokens"] == sum(len(s) for s in sequences)
        if num_inputs > max_chunk_sequences:
            assert all(count > 0 for count in await chunks_served(client))


async def test_chunk_is_retried_on_another_replica_when_one_is_unavailable(gateway_with):
    down, up = FakeEmbedder(fail_with=grpc.StatusCode.UNAVAILABLE), FakeEmbedder()
    sequences = [[i + 1, i + 2] for i in range(10)]
    async with gateway_with(down, up, max_chunk_sequences=2) as client:
        response = await client.post("/embed", json={"inputs": sequences})
        assert response.status_code == 200
        np.testing.assert_allclose(response.json(), expected_vectors(sequences), rtol=1e-6)
        workers = (await client.get("/info")).json()["workers"]
    assert [w["num_chunks_served"] for w in workers] == [0, 5]
    assert workers[0]["serving"] is False and "UNAVAILABLE" in workers[0]["last_error"]


async def test_every_replica_full_answers_429_with_retry_after(gateway_with):
    full = grpc.StatusCode.RESOURCE_EXHAUSTED
    async with gateway_with(FakeEmbedder(fail_with=full), FakeEmbedder(fail_with=full)) as client:
        response = await client.post("/v1/embeddings", json={"input": "hello"})
    assert response.status_code == 429
    assert response.headers["retry-after"] == "1"
    assert response.json()["error"]["type"] == "rate_limit_error"


async def test_one_full_replica_is_skipped(gateway_with):
    async with gateway_with(
        FakeEmbedder(fail_with=grpc.StatusCode.RESOURCE_EXHAUSTED), FakeEmbedder()
    ) as client:
        for _ in range(3):
            assert (await client.post("/embed", json={"inputs": "hello"})).status_code == 200
        assert await chunks_served(client) == [0, 3]


async def test_no_reachable_worker_answers_503_fast(gateway_with):
    async with gateway_with(unused_address(), health_timeout_s=0.5) as client:
        started = time.monotonic()
        response = await client.post("/v1/embeddings", json={"input": "hello"})
        assert time.monotonic() - started < 1.0
        assert response.status_code == 503
        ready = await client.get("/ready")
        assert ready.status_code == 503
        assert ready.json() == {  # counts only: no address
            "status": "not ready",
            "serving_workers": 0,
            "workers": 1,
            "refused_workers": 0,
        }
        assert (await client.get("/health")).status_code == 200


async def test_slow_worker_times_out_with_504(gateway_with):
    async with gateway_with(FakeEmbedder(delay_s=2.0), request_timeout_s=0.2) as client:
        started = time.monotonic()
        response = await client.post("/embed", json={"inputs": ["a", "b"]})
        assert time.monotonic() - started < 1.0
        assert response.status_code == 504
        assert response.json()["error_type"] == "Backend"  # TEI has no timeout type
        assert [w["outstanding_tokens"] for w in (await client.get("/info")).json()["workers"]] == [0]


async def test_cancelled_request_releases_its_chunks(gateway_with):
    async with gateway_with(
        FakeEmbedder(delay_s=5.0), FakeEmbedder(delay_s=5.0), max_chunk_sequences=1
    ) as client:
        request = asyncio.create_task(client.post("/embed", json={"inputs": ["a", "b", "c"]}))
        await asyncio.sleep(0.2)
        workers = (await client.get("/info")).json()["workers"]
        assert sum(w["outstanding_tokens"] for w in workers) == 9
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        workers = (await client.get("/info")).json()["workers"]
        assert [w["outstanding_tokens"] for w in workers] == [0, 0]


async def test_replica_joins_once_its_probe_says_serving(gateway_with):
    starting = FakeEmbedder(status=2)  # NOT_SERVING
    async with gateway_with(starting, health_interval_s=0.05) as client:
        assert (await client.get("/ready")).status_code == 503
        assert (await client.post("/embed", json={"inputs": "hi"})).status_code == 503
        starting.status = 1  # SERVING
        await asyncio.sleep(0.3)
        assert (await client.get("/ready")).status_code == 200
        assert (await client.post("/embed", json={"inputs": "hi"})).status_code == 200


async def test_a_first_probe_that_misses_its_deadline_is_retried_soon_not_an_interval_later(gateway_with):
    """On a loaded machine the gateway's first probe of a serving worker can miss its deadline. It
    then answered 503 (/ready and every request) for a whole health interval; now it probes again
    within a fraction of a second while no replica serves, and the interval applies once one does."""
    slow_first = FakeEmbedder(health_delays=[0.5])  # past the probe's 0.2 s deadline, once
    async with (
        serving(slow_first) as address,  # by address: gateway_with would wait for /ready
        gateway_with(address, health_timeout_s=0.2, health_interval_s=30.0) as client,
    ):
        assert (await client.get("/ready")).status_code == 503  # the start-up probe timed out
        loop = asyncio.get_running_loop()
        started = loop.time()
        while (await client.get("/ready")).status_code != 200:
            assert loop.time() - started < 3.0, "still not ready: the next probe waits an interval"
            await asyncio.sleep(0.02)
        response = await client.post("/rerank", json={"query": "q", "texts": ["a"]})
        assert response.status_code == 501, response.text  # an embedding model: known, not 503


async def test_first_failure_cancels_sibling_chunks():
    cancelled = []

    async def slow() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def failing() -> None:
        raise Overloaded("full")

    with pytest.raises(Overloaded):
        await gather_all([slow(), failing(), slow()])
    assert cancelled == [True, True]


async def test_requests_over_the_concurrency_cap_are_refused_at_once(gateway_with):
    async with gateway_with(FakeEmbedder(delay_s=0.3), max_concurrent_requests=1) as client:
        first = asyncio.create_task(client.post("/embed", json={"inputs": "a"}))
        await asyncio.sleep(0.1)
        refused = await client.post("/v1/embeddings", json={"input": "b"})
        assert (await first).status_code == 200
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert "its limit" in refused.json()["error"]["message"]


async def test_the_gateway_says_what_it_waits_for_and_when_it_serves(gateway_with, caplog):
    fake = FakeEmbedder(status=2)  # NOT_SERVING: still loading its model
    caplog.set_level("INFO", logger="kembed.gateway.pool.workers")
    async with gateway_with(fake, health_interval_s=0.05) as client:
        assert any("waiting for a worker to serve (127.0.0.1:" in r.message for r in caplog.records)
        fake.status = 1  # SERVING
        for _ in range(200):
            if (await client.get("/ready")).status_code == 200:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
    messages = [r.message for r in caplog.records]
    assert "serving: 1 of 1 worker(s) ready" in messages
    assert sum(m.startswith("waiting for a worker") for m in messages) == 1  # said once, not per probe
