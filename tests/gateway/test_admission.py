"""Admission by tokens: refused at once what the workers cannot take in time, never what was admitted."""

import asyncio
import math

from gateway_fakes import FakeEmbedder

from kembed.gateway.service.admission import Admission, DrainRate, estimate_tokens
from kembed.gateway.tokenizing.tokenization import Tokenization


def test_an_idle_gateway_admits_any_request():
    assert Admission(max_queue_wait_s=1.0).refusal(10**9, capacity_tokens=100) is None


def test_past_the_workers_queues_a_request_is_refused():
    admission = Admission(max_queue_wait_s=10.0, quantum_tokens=4096)
    admission.admit(150)
    assert admission.refusal(50, capacity_tokens=200) is None
    reason = admission.refusal(51, capacity_tokens=200)
    assert reason is not None and "would pass the 200 the workers' queues hold" in reason
    assert admission.refusal(10**6, capacity_tokens=0) is None  # capacity unknown: no cap


def test_a_request_that_would_wait_past_the_limit_at_the_drain_rate_is_refused():
    admission = Admission(max_queue_wait_s=2.0, quantum_tokens=4096)
    admission.admit(1000)
    now = 100.0
    for _ in range(50):  # 100 tokens every 0.1 s, with work outstanding all along: 1000 tokens/s
        admission.admit(100)
        now += 0.1
        admission.drained(100, now=now)
        admission.release(100)
    assert math.isclose(admission.rate.tokens_per_s, 1000, rel_tol=0.25)
    assert admission.refusal(900, capacity_tokens=0) is None  # 1.9 s of work
    reason = admission.refusal(1100, capacity_tokens=0)  # 2.1 s
    assert reason is not None and "would take 2.1 s" in reason and "past 2 s" in reason


def test_before_a_drain_rate_is_measured_the_workers_device_rate_bounds_the_wait():
    """A burst at a gateway that has measured no drain rate yet (none is, before a busy window of
    0.5 s and a chunk's worth of tokens) was admitted by the queues' capacity alone: 63 requests of
    1,032 tokens by a 65,536-token queue, 20-40 s of a CPU worker against a 10 s bound."""
    admission = Admission(max_queue_wait_s=10.0, quantum_tokens=4096)
    admitted = 0
    while admission.refusal(1032, capacity_tokens=65536, device_rate=3000.0) is None:
        admission.admit(1032)
        admitted += 1
    assert admitted == 29  # 30,000 tokens: 10 s at the device's 3,000 tokens/s
    reason = admission.refusal(1032, capacity_tokens=65536, device_rate=3000.0)
    assert reason is not None and "devices' 3000 tokens/s" in reason and "past 10 s" in reason
    assert admission.retry_after_s(1032, device_rate=3000.0) == 1
    assert admission.refusal(1032, capacity_tokens=65536) is None  # no rate at all: the capacity only
    admission.rate.tokens_per_s = 6000.0  # once measured, the drain rate is what counts
    assert admission.refusal(1032, capacity_tokens=65536, device_rate=3000.0) is None


def test_a_request_is_not_admitted_past_its_own_deadline():
    admission = Admission(max_queue_wait_s=10.0, quantum_tokens=4096)
    admission.rate.tokens_per_s = 1000.0
    admission.admit(3000)
    assert admission.refusal(1000, capacity_tokens=0) is None  # 4 s of work, 10 s allowed
    reason = admission.refusal(1000, capacity_tokens=0, deadline_s=3.0)  # its deadline is sooner
    assert reason is not None and "past 3 s" in reason


def test_a_small_request_is_admitted_behind_a_large_one_that_fills_the_queues():
    """Served in turn, a query waits for one chunk of a 2048-text request, not all of it; a second
    large request would wait for all of the first (up to its own size) and is refused."""
    admission = Admission(max_queue_wait_s=10.0, quantum_tokens=4096)
    assert admission.refusal(100_000, capacity_tokens=65536) is None  # idle: any size
    admission.admit(100_000)
    assert admission.ahead(7) == 4096
    assert admission.refusal(7, capacity_tokens=65536) is None
    admission.admit(7)
    assert admission.ahead(60_000) == 60_007
    reason = admission.refusal(60_000, capacity_tokens=65536)
    assert reason is not None and "would pass the 65536" in reason
    admission.release(100_000)
    assert admission.ahead(60_000) == 7 and admission.refusal(60_000, capacity_tokens=65536) is None


def test_a_window_in_which_only_small_chunks_finish_does_not_read_as_a_collapse():
    """Large chunks (4096 tokens) finish every 2 s, queries (10 tokens) every 0.05 s: 2098 tokens/s.
    Windows of 0.5 s alone would mostly see queries only (~200 tokens/s)."""
    rate = DrainRate(window_s=0.5, alpha=0.5, min_tokens=4096)
    now = 0.0
    rate.finished(10, now)
    lowest = math.inf
    for step in range(1, 401):  # 20 s
        now = step * 0.05
        rate.finished(10, now)
        if step % 40 == 0:
            rate.finished(4096, now)
        if not math.isnan(rate.tokens_per_s):
            lowest = min(lowest, rate.tokens_per_s)
    assert lowest > 0.8 * (4096 / 2 + 10 / 0.05)


def test_idle_time_does_not_count_against_the_rate_and_a_failed_request_drains_nothing():
    rate = DrainRate(window_s=0.5, alpha=0.5)
    rate.finished(100, now=0.0)  # opens the window
    rate.finished(100, now=0.6)
    assert math.isclose(rate.tokens_per_s, 100 / 0.6)
    rate.idle()
    rate.finished(100, now=100.0)  # after a long idle gap: a new window, not 100 tokens in 99.4 s
    rate.finished(100, now=100.5)
    assert math.isclose(rate.tokens_per_s, 0.5 * (100 / 0.5) + 0.5 * (100 / 0.6))
    admission = Admission(max_queue_wait_s=1.0)
    admission.admit(50)
    admission.release(50)  # not answered: nothing drained
    assert admission.outstanding_tokens == 0 and math.isnan(admission.rate.tokens_per_s)


async def test_overload_is_refused_at_once_and_what_was_admitted_completes(gateway_with):
    # A worker whose queue holds 64 tokens and answers after 0.5 s: of 24 concurrent requests of
    # ~10 tokens, those that fit are admitted and answered; the others are refused before any answer.
    fake = FakeEmbedder(delay_s=0.5, max_queued_tokens=64)
    finished: list[int] = []
    async with gateway_with(fake) as client:

        async def post(i: int) -> int:
            response = await client.post("/v1/embeddings", json={"input": f"query number {i} about things"})
            finished.append(response.status_code)
            if response.status_code == 429:
                assert response.headers["Retry-After"] == "1"
                assert "the workers are at capacity" in response.json()["error"]["message"]
            return response.status_code

        statuses = await asyncio.gather(*(post(i) for i in range(24)))
    assert set(statuses) == {200, 429}
    assert finished.index(200) == statuses.count(429)  # every refusal came before the first answer
    assert statuses.count(200) == len(fake.sequences)  # admitted ones all reached the worker


def test_an_estimate_is_replaced_by_the_count_and_truncation_caps_it():
    assert estimate_tokens([400, 40], max_length=None) == (100 + 2) + (10 + 2)
    assert estimate_tokens([8_000_000], max_length=256) == 256  # a megabyte text truncated
    admission = Admission(max_queue_wait_s=10.0, quantum_tokens=4096)
    admission.admit(500)
    admission.resize(500, 120)
    assert admission.outstanding_tokens == 120 and admission.ahead(10**6) == 120
    admission.release(120)
    assert admission.outstanding_tokens == 0 and admission.ahead(10**6) == 0


async def test_a_refused_request_is_never_tokenized(gateway_with, monkeypatch):
    """Admission comes first, on an estimate from the characters: under overload the gateway
    refuses without spending CPU on tokenizing what it refuses."""
    tokenized: list[int] = []
    encode = Tokenization.encode

    async def counting(self, inputs, **kwargs):
        tokenized.append(len(inputs))
        return await encode(self, inputs, **kwargs)

    monkeypatch.setattr(Tokenization, "encode", counting)
    fake = FakeEmbedder(delay_s=0.5, max_queued_tokens=64)
    async with gateway_with(fake) as client:
        statuses = await asyncio.gather(
            *(
                client.post("/v1/embeddings", json={"input": f"query number {i} about things"})
                for i in range(24)
            )
        )
    codes = [response.status_code for response in statuses]
    assert codes.count(429) > 0 and codes.count(200) > 0
    assert len(tokenized) == codes.count(200)


def test_work_that_can_never_fit_its_deadline_is_named_with_the_rate_and_what_fits():
    assert Admission.infeasible(10**9, tokens_per_s=0.0, deadline_s=60) is None  # rate not known
    assert Admission.infeasible(60_000, tokens_per_s=1000.0, deadline_s=60) is None
    reason = Admission.infeasible(60_001, tokens_per_s=1000.0, deadline_s=60)
    assert reason is not None and "1000 tokens/s" in reason and "at most ~30000 tokens" in reason
    assert Admission.infeasible(80_000, tokens_per_s=1000.0, deadline_s=60, share=0.75) is None
    reason = Admission.infeasible(80_001, tokens_per_s=1000.0, deadline_s=60, share=0.75)
    assert reason is not None and "holds ~80001 tokens" in reason


def test_a_refusal_says_when_the_work_ahead_should_have_drained():
    admission = Admission(max_queue_wait_s=2.0, quantum_tokens=4096)
    assert admission.retry_after_s(100) is None  # no rate yet: the configured Retry-After
    admission.rate.tokens_per_s = 1000.0
    admission.admit(5000)
    assert admission.retry_after_s(1000) == 4  # 6 s of work, 2 of which it may wait
    assert admission.retry_after_s(10**9) == 60


async def test_a_request_the_workers_cannot_finish_in_time_is_refused_413_at_once(gateway_with):
    """An idle gateway too: at 1000 tokens/s a 1 s deadline fits ~1000 tokens. Refused on the
    estimate when even three quarters of it cannot fit (not tokenized), else once counted; never run."""
    fake = FakeEmbedder(tokens_per_s=1000.0)
    async with gateway_with(fake, request_timeout_s=1.0, health_interval_s=0.05) as client:
        long_text = "word " * 400  # 256 tokens once truncated, ~256 estimated
        loop = asyncio.get_running_loop()
        for count in (10, 4):  # ~2570 estimated (3/4 past 1000), then ~1030 (3/4 fits; counted: not)
            started = loop.time()
            response = await client.post("/embed", json={"inputs": [long_text] * count})
            assert response.status_code == 413, response.text
            assert loop.time() - started < 0.5
            assert "1000 tokens/s" in response.json()["error"]
        assert fake.num_received == 0  # nothing was sent to the worker
        response = await client.post("/embed", json={"inputs": [long_text] * 3})  # 768 tokens: fits
        assert response.status_code == 200


async def test_token_id_inputs_are_counted_as_truncated_as_texts_are(gateway_with):
    """One input of 100,000 token ids is run as its first 256 (the model's limit) and admitted as
    that many: counted whole it would pass the worker's 65,536-token queue beside a query in
    flight (it was refused 429 with 6 tokens in flight)."""
    fake = FakeEmbedder(delay_s=0.3)  # its Info: 65,536 queued tokens at most
    async with gateway_with(fake) as client:
        query = asyncio.create_task(client.post("/v1/embeddings", json={"input": "a query"}))
        for _ in range(200):  # until the query is in flight
            if fake.num_received:
                break
            await asyncio.sleep(0.01)
        response = await client.post("/v1/embeddings", json={"input": [[1000] * 100_000]})
        assert (await query).status_code == 200
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["prompt_tokens"] == 256
    assert len(fake.sequences[-1]) == 256
