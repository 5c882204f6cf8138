"""The gateway decides each request's class (interactive or bulk) and sends it to the workers with
every chunk: the X-Kembed-Priority header, else by size; queries are not held behind bulk RPCs in
the gateway's windows, and bulk is refused first when the workers' queues fill."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from gateway_fakes import FakeEmbedder

from kembed.gateway.service.admission import Admission
from kembed.proto import embedder_pb2 as pb

INTERACTIVE, BULK = pb.PRIORITY_INTERACTIVE, pb.PRIORITY_BULK


async def _until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    for _ in range(int(timeout_s / 0.005)):
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("timed out waiting")


@pytest.mark.parametrize(
    ("inputs", "header", "expected"),
    [
        (["what is the capital of france"], None, INTERACTIVE),
        (["a query"] * 8, None, INTERACTIVE),
        (["a document"] * 9, None, BULK),
        (["word " * 100], None, BULK),  # 102 tokens, past interactive_max_tokens=64 here
        (["a query"], "bulk", BULK),
        (["a document"] * 50, "interactive", INTERACTIVE),
        (["a query"], " Bulk ", BULK),
    ],
    ids=[
        "one-query",
        "eight-inputs",
        "nine-inputs",
        "many-tokens",
        "said-bulk",
        "said-interactive",
        "spacing",
    ],
)
async def test_each_chunk_carries_the_request_class(gateway_with, inputs, header, expected):
    fake = FakeEmbedder()
    headers = {} if header is None else {"X-Kembed-Priority": header}
    async with gateway_with(fake, max_chunk_sequences=4, interactive_max_tokens=64) as client:
        response = await client.post("/v1/embeddings", json={"input": inputs}, headers=headers)
        assert response.status_code == 200, response.text
        metrics = (await client.get("/metrics")).text
    assert fake.priorities and set(fake.priorities) == {expected}
    label = "bulk" if expected == BULK else "interactive"
    assert f'kembed_gateway_class_requests_total{{class="{label}"}} 1.0' in metrics


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/embeddings", {"input": "hello"}),
        ("/embed", {"inputs": "hello"}),
        ("/v2/embed", {"texts": ["hello"], "input_type": "search_query", "embedding_types": ["float"]}),
        ("/", {"inputs": "hello"}),
        ("/v1/contextualizedembeddings", {"input": [["hello", "world"]]}),
    ],
    ids=["openai", "tei", "cohere", "tei-root", "perplexity-contextualized"],
)
async def test_every_embedding_route_takes_the_header(gateway_with, path, body):
    fake = FakeEmbedder()
    async with gateway_with(fake) as client:
        response = await client.post(path, json=body, headers={"X-Kembed-Priority": "bulk"})
        if "contextualized" not in path:  # the fake worker has no span pooling: 500 there
            assert response.status_code == 200, response.text
        refused = await client.post(path, json=body, headers={"X-Kembed-Priority": "urgent"})
    assert fake.priorities == [BULK]  # the refused request reached no worker
    assert 400 <= refused.status_code < 500
    assert "X-Kembed-Priority" in refused.text and "urgent" in refused.text


async def test_a_query_is_not_held_behind_bulk_frames_in_the_gateway(gateway_with):
    """One frame unanswered per replica and class: a bulk request whose frame the worker holds does
    not keep a query's chunk waiting in the gateway's window."""
    gate = asyncio.Event()
    fake = FakeEmbedder(bulk_gate=gate)
    async with gateway_with(fake, max_inflight_frames=1, max_chunk_sequences=2) as client:
        bulk = asyncio.create_task(client.post("/embed", json={"inputs": ["indexing this"] * 20}))
        await _until(lambda: BULK in fake.priorities)
        query = await asyncio.wait_for(client.post("/embed", json={"inputs": "a question"}), 5)
        assert query.status_code == 200
        assert not bulk.done()  # still held by the worker
        gate.set()
        assert (await bulk).status_code == 200
    assert fake.priorities.count(INTERACTIVE) == 1


def test_bulk_is_refused_before_interactive_work():
    admission = Admission(max_queue_wait_s=10.0, quantum_tokens=100, bulk_share=0.5)
    admission.admit(400, is_bulk=True)
    # a bulk request waits behind the bulk served in turn with it: 400 + 400 > 1000 * 0.5
    assert "bulk" in (admission.refusal(400, capacity_tokens=1000, is_bulk=True) or "")
    # a query of the same size waits behind interactive work only, and may use the whole queue
    assert admission.ahead(400) == 0
    assert admission.refusal(400, capacity_tokens=1000) is None
    admission.admit(300)
    # interactive work is ahead of bulk whole, bulk in turn: 300 + min(400, 100) + 50 <= 500
    assert admission.ahead(50, is_bulk=True) == 300 + 100
    assert admission.refusal(50, capacity_tokens=1000, is_bulk=True) is None
    assert admission.refusal(150, capacity_tokens=1000, is_bulk=True) is not None  # 300 + 150 + 150
    admission.resize(300, 250, was_bulk=False, is_bulk=True)  # tokenized: bulk after all
    assert admission.ahead(10) == 0 and admission.outstanding_tokens == 650
    admission.release(250, is_bulk=True)
    admission.release(400, is_bulk=True)
    assert admission.outstanding_tokens == 0


async def test_under_a_bulk_flood_queries_are_admitted_and_bulk_is_refused(gateway_with):
    """Bulk fills its share of the worker's queue; a further bulk request gets 429, a query still
    gets through."""
    gate = asyncio.Event()
    fake = FakeEmbedder(bulk_gate=gate, max_queued_tokens=200)
    async with gateway_with(fake, bulk_queue_share=0.5, max_chunk_sequences=64) as client:
        await asyncio.sleep(0.05)
        flood = asyncio.create_task(client.post("/embed", json={"inputs": ["indexing this text"] * 20}))
        await _until(lambda: BULK in fake.priorities)
        refused = await client.post("/embed", json={"inputs": ["more of the same text"] * 20})
        query = await client.post("/embed", json={"inputs": "a question"})
        gate.set()
        assert (await flood).status_code == 200
    assert refused.status_code == 429, refused.text
    assert "bulk" in refused.json()["error"]  # TEI's error shape
    assert refused.headers.get("retry-after")
    assert query.status_code == 200


async def test_a_query_goes_to_a_free_replica_not_one_busy_with_bulk(gateway_with):
    gate = asyncio.Event()
    busy, free = FakeEmbedder(bulk_gate=gate), FakeEmbedder(bulk_gate=gate)
    async with gateway_with(busy, free, max_chunk_sequences=64) as client:
        flood = asyncio.create_task(client.post("/embed", json={"inputs": ["indexing this text"] * 20}))
        await _until(lambda: BULK in busy.priorities + free.priorities)
        loaded, idle = (busy, free) if BULK in busy.priorities else (free, busy)
        for _ in range(4):
            assert (await client.post("/embed", json={"inputs": "a question"})).status_code == 200
        gate.set()
        assert (await flood).status_code == 200
    assert idle.priorities == [INTERACTIVE] * 4 and loaded.priorities == [BULK]


@pytest.mark.parametrize(
    ("priority", "header", "expected"),
    [(None, None, INTERACTIVE), (0, None, INTERACTIVE), (3, None, BULK), (3, "interactive", INTERACTIVE)],
    ids=["absent", "cohere-highest", "cohere-lower", "header-wins"],
)
async def test_cohere_priority_above_zero_is_bulk(gateway_with, priority, header, expected):
    fake = FakeEmbedder()
    body = {"texts": ["a query"], "input_type": "search_query", "embedding_types": ["float"]}
    if priority is not None:
        body["priority"] = priority
    headers = {} if header is None else {"X-Kembed-Priority": header}
    async with gateway_with(fake) as client:
        response = await client.post("/v2/embed", json=body, headers=headers)
    assert response.status_code == 200, response.text
    assert fake.priorities == [expected]


async def test_with_the_classes_off_every_request_goes_as_interactive(gateway_with):
    fake = FakeEmbedder()
    async with gateway_with(fake, priority_classes=False, max_chunk_sequences=64) as client:
        for headers in ({}, {"X-Kembed-Priority": "bulk"}):
            response = await client.post("/embed", json={"inputs": ["a document"] * 20}, headers=headers)
            assert response.status_code == 200
    assert fake.priorities == [INTERACTIVE, INTERACTIVE]
