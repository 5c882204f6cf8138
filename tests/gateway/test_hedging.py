"""A chunk that runs long on one replica is hedged on another (bounded, the loser cancelled); a
replica that stops answering is found stalled, its chunks move, and it rejoins once it answers."""

from __future__ import annotations

import asyncio
import time

import numpy as np
from gateway_fakes import FakeEmbedder, fake_vector
from test_gateway_metrics import scrape

from kembed.gateway.config import GatewayConfig
from kembed.gateway.pool.attempts import MAX_HEDGE_CREDIT, Hedging
from kembed.gateway.pool.batches import Part
from kembed.proto import embedder_pb2 as pb


def _expected(ids: list[int]) -> list[float]:
    raw = fake_vector(np.array(ids))
    return (raw / np.linalg.norm(raw)).tolist()


async def _workers(client) -> list[dict]:
    return (await client.get("/info")).json()["workers"]


async def test_a_slow_attempt_is_hedged_on_another_replica_and_the_loser_cancelled(gateway_with):
    slow, fast = FakeEmbedder(delay_s=5.0), FakeEmbedder()
    # A budget well past what the fast replica takes on a loaded 2-core machine (at 0.1 s a fast
    # attempt was once hedged there, and lost), well short of the slow replica's 5 s.
    async with gateway_with(slow, fast, hedge_after_s=0.75, health_interval_s=30.0) as client:
        for i in range(6):  # idle replicas take turns: about half go to the slow one first
            ids = [i + 1, i + 2]
            started = time.monotonic()
            response = await client.post("/embed", json={"inputs": [ids]})
            assert response.status_code == 200
            assert time.monotonic() - started < 3.0  # not the slow replica's 5 s
            np.testing.assert_allclose(response.json(), [_expected(ids)], rtol=1e-6)
        await asyncio.sleep(0.1)  # the losers' cancels reach the slow fake
        samples = await scrape(client)
        workers = await _workers(client)
    hedges = samples["kembed_gateway_hedges_total{}"]
    assert hedges >= 1
    assert samples["kembed_gateway_hedge_wins_total{}"] == hedges
    assert slow.num_received == hedges  # every chunk sent to the slow replica was hedged ...
    assert slow.cancels == hedges  # ... and its attempt there cancelled
    assert fast.num_received == 6  # each chunk ran on at most two replicas: once on the fast one
    assert [w["outstanding_tokens"] for w in workers] == [0, 0]
    assert [w["serving"] for w in workers] == [True, True]  # slow, not stalled: its probes answer


async def test_hedges_are_throttled_to_their_share_of_chunks():
    config = GatewayConfig(model_dir=".", hedge_after_s=0.1, max_hedge_share=0.02)  # type: ignore[arg-type]
    hedging = Hedging(config)
    sent = 0
    for _ in range(1000):
        hedging.earn()
        sent += hedging.spend()  # a hedge wanted for every chunk
    assert sent <= MAX_HEDGE_CREDIT + 0.02 * 1000 + 1
    assert sent >= 0.02 * 1000  # the share is granted, not starved
    assert not Hedging(GatewayConfig(model_dir=".", max_hedge_share=0.0)).is_enabled  # type: ignore[arg-type]


def test_the_budget_grows_with_the_work_ahead_at_the_replicas_rate():
    config = GatewayConfig(model_dir=".", hedge_after_s=0.25, bulk_hedge_after_s=2.0, hedge_multiple=4.0)  # type: ignore[arg-type]
    hedging = Hedging(config)

    class Replica:
        tokens_per_s = 10_000.0

    query = Part("q", [np.ones(16, np.int32)], None, 16, deadline=0.0, priority=pb.PRIORITY_INTERACTIVE)
    bulk = Part("b", [np.ones(4096, np.int32)], None, 4096, deadline=0.0, priority=pb.PRIORITY_BULK)
    assert hedging.budget_s(Replica(), query, ahead_tokens=0) == 0.25  # the floor
    assert hedging.budget_s(Replica(), query, ahead_tokens=20_000) == 4.0 * 20_016 / 10_000
    assert hedging.budget_s(Replica(), bulk, ahead_tokens=0) == 2.0
    Replica.tokens_per_s = 0.0  # not known yet: the floor only
    assert hedging.budget_s(Replica(), bulk, ahead_tokens=10**6) == 2.0


async def test_a_stalled_replica_is_marked_down_its_chunks_move_and_it_rejoins(gateway_with):
    """Hedging off: what moves the chunk is the stall check, which is not throttled. The stalled
    fake answers neither its chunk nor its probes (as a SIGSTOPped worker), then recovers."""
    stalled, healthy = FakeEmbedder(), FakeEmbedder()
    async with gateway_with(
        stalled, healthy, hedge_after_s=0.1, max_hedge_share=0.0, health_timeout_s=0.3, health_interval_s=0.2
    ) as client:
        stalled.delay_s, stalled.health_delays = 30.0, [5.0] * 100
        for _ in range(2):  # idle replicas take turns: one of two requests is sent to the stalled one
            started = time.monotonic()
            response = await client.post("/embed", json={"inputs": [[1, 2]]})
            assert response.status_code == 200
            np.testing.assert_allclose(response.json(), [_expected([1, 2])], rtol=1e-6)
            # moved after its budget (0.1 s) and one missed probe (0.3 s), not after the fake's 30 s
            assert time.monotonic() - started < 2.0
        assert stalled.num_received == 1
        workers = await _workers(client)
        assert workers[0]["serving"] is False and workers[0]["stalls"] >= 1
        assert "stalled" in workers[0]["last_error"]
        assert (await client.get("/ready")).status_code == 200  # the other one serves
        stalled.health_delays, stalled.delay_s = [], 0.0  # it recovers
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5.0
        while not (await _workers(client))[0]["serving"]:
            assert loop.time() < deadline, "the recovered replica never rejoined"
            await asyncio.sleep(0.05)
        samples = await scrape(client)
    assert samples["kembed_gateway_hedges_total{}"] == 0
    assert samples["kembed_gateway_upstream_retries_total{}"] >= 1
    assert stalled.cancels >= 1  # the moved attempt was cancelled there


async def test_the_only_replica_is_not_marked_down_for_being_slow(gateway_with):
    """With nowhere else to go, a slow or unanswering replica keeps its work: a request waits for it
    (up to its deadline) rather than failing at once with 503."""
    lone = FakeEmbedder(delay_s=0.6)
    async with gateway_with(lone, hedge_after_s=0.1, health_timeout_s=0.2, health_interval_s=30.0) as client:
        lone.health_delays = [0.5] * 3  # its probes miss their deadline from now on
        response = await client.post("/embed", json={"inputs": [[3, 4]]})
        assert response.status_code == 200
        assert (await _workers(client))[0]["serving"] is True


async def test_the_only_replica_saying_it_is_stalled_keeps_serving_and_a_second_takes_over(gateway_with):
    """A worker cannot always tell a slow device from a stuck one; with nowhere else to go its work
    waits for it (answered once it runs again) rather than failing 503. Beside a replica that
    serves, the same answer marks it down and its work moves."""
    stalled = "stalled: a device step of ~64 tokens has run 1.6 s (74.1 ms expected; limit 1.0 s)"
    lone = FakeEmbedder(delay_s=0.5)
    async with gateway_with(lone, hedge_after_s=0.1, health_timeout_s=0.3, health_interval_s=0.1) as client:
        lone.status, lone.health_reason = pb.HealthResponse.NOT_SERVING, stalled
        for _ in range(3):  # each request probes it (suspect past 0.1 s): NOT_SERVING, stalled
            response = await client.post("/embed", json={"inputs": [[3, 4]]})
            assert response.status_code == 200, response.text
        worker = (await _workers(client))[0]
        assert worker["serving"] is True and "stalled" in worker["last_error"]
        assert (await client.get("/ready")).status_code == 200
    slow, other = FakeEmbedder(delay_s=30.0), FakeEmbedder()
    async with gateway_with(
        slow, other, hedge_after_s=0.1, max_hedge_share=0.0, health_timeout_s=0.3, health_interval_s=0.1
    ) as client:
        slow.status, slow.health_reason = pb.HealthResponse.NOT_SERVING, stalled
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5.0
        while (await _workers(client))[0]["serving"]:
            assert loop.time() < deadline, "a stalled replica beside a serving one was kept"
            await asyncio.sleep(0.05)
        response = await client.post("/embed", json={"inputs": [[3, 4]]})
        assert response.status_code == 200
        assert other.num_received >= 1
