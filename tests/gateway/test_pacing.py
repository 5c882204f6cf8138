"""A request larger than the workers' queues is paced (a window of its tokens in flight) and served,
not refused 429 on an idle fleet; a chunk finding every queue full waits for room a while."""

import asyncio

import numpy as np
import pytest
from gateway_fakes import FakeEmbedder, fake_vector

from kembed.gateway.errors import Overloaded
from kembed.gateway.pool.pacing import Window, paced


async def test_a_request_of_more_tokens_than_the_queues_hold_is_served_at_their_pace(gateway_with):
    fake = FakeEmbedder(max_queued_tokens=400, enforce_queue=True, delay_s=0.01)
    sequences = [[i % 300 + 1] * 10 for i in range(300)]  # 3,000 tokens: 7.5 queues' worth
    async with gateway_with(fake, chunk_tokens=100, max_chunk_sequences=10) as client:
        response = await client.post("/embed", json={"inputs": sequences})
        assert response.status_code == 200, response.text
    raw = np.stack([fake_vector(np.array(s)) for s in sequences])
    np.testing.assert_allclose(response.json(), raw / np.linalg.norm(raw, axis=1, keepdims=True), rtol=1e-6)
    assert 0 < fake.max_held_tokens <= 400 * 0.75 / 2 + 100  # the window: half the bulk share, a chunk


async def test_the_window_takes_chunks_in_order_and_gives_back_a_cancelled_grant():
    window = Window(max_tokens=10)
    await window.acquire(6)
    second = asyncio.ensure_future(window.acquire(6))
    third = asyncio.ensure_future(window.acquire(1))  # would fit, but waits its turn behind the second
    await asyncio.sleep(0)
    assert not second.done() and not third.done()
    window.release(6)
    await asyncio.sleep(0)
    assert second.done() and third.done() and window.held == 7
    fourth = asyncio.ensure_future(window.acquire(8))
    await asyncio.sleep(0)
    fourth.cancel()
    await asyncio.gather(fourth, return_exceptions=True)
    window.release(6)
    window.release(1)
    assert window.held == 0
    await window.acquire(20)  # larger than the window: goes alone
    assert window.held == 20


async def test_a_wait_cancelled_just_before_a_release_ends_cancelled_not_in_an_error():
    """A client leaving (or a deadline passing) cancels the waiter's future at once, but its task runs
    later; a release in between drops the cancelled entry. The waiter then raised ValueError ('not
    in deque'), which the gateway answered, and counted, as a 500."""
    window = Window(max_tokens=10)
    await window.acquire(10)
    waiter = asyncio.ensure_future(window.acquire(5))
    await asyncio.sleep(0)
    waiter.cancel()
    window.release(10)  # before the cancelled task has run
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert window.held == 0
    await window.acquire(10)  # the window is whole again


async def test_a_chunk_refused_for_full_queues_is_tried_again_then_given_up():
    tries = []

    async def full_then_room() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise Overloaded("full")
        return "rows"

    assert await paced(full_then_room, 5, None, max_wait_s=1.0) == "rows"

    async def always_full() -> str:
        raise Overloaded("full")

    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(Overloaded):
        await paced(always_full, 5, Window(10), max_wait_s=0.2)
    assert 0.1 < loop.time() - started < 1.0
