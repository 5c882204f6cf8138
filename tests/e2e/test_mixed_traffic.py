"""Interactive queries beside a bulk flood, through a real gateway and one real CPU worker: each query
is answered in a fraction of what waiting behind the flood would take, each bulk request with all its
vectors, in order and right, nothing lost or answered twice; the gateway counts both classes."""

import asyncio
import time

import httpx
import numpy as np
import pytest
from corpus import mixed_lengths
from processes import start_stack

NUM_BULK_CLIENTS = 3
NUM_BULK_EACH = 3  # requests per bulk client, one after another
NUM_BULK_TEXTS = 64  # > 8 inputs: bulk by the gateway's size rule, no header needed
MAX_BULK_ATTEMPTS = 10
QUERIES = [
    "how do I reset my password",
    "cheapest flight to lisbon",
    "what is a vector index",
    "tokyo weather",
]
CHECKED_ROWS = (0, 21, 42, NUM_BULK_TEXTS - 1)  # of each bulk request, against the same text embedded alone


def vectors(response: httpx.Response, num_inputs: int) -> np.ndarray:
    """The response's rows, after checking it has one per input, in input order."""
    assert response.status_code == 200, response.text
    data = response.json()["data"]
    assert [d["index"] for d in data] == list(range(num_inputs))  # each once, in order
    return np.array([d["embedding"] for d in data], dtype=np.float32)


def class_requests(metrics: str, name: str) -> float:
    prefix = f'kembed_gateway_class_requests_total{{class="{name}"}}'
    return sum(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith(prefix))


@pytest.mark.serial  # its bound is a bulk request's time alone: tests beside it would move both
@pytest.mark.slow
def test_queries_beside_a_bulk_flood_are_served_first_and_bulk_is_answered_whole(log_dir):
    stack = start_stack(log_dir, num_workers=1)
    bulks = [
        mixed_lengths(NUM_BULK_TEXTS, seed=100 + r, max_words=200)
        for r in range(NUM_BULK_CLIENTS * NUM_BULK_EACH)
    ]
    flat = [text for texts in bulks for text in texts]
    assert len(set(flat)) == len(flat)  # distinct inputs: a swapped or repeated row cannot pass by luck
    try:
        with httpx.Client(base_url=stack.url, timeout=60) as http:

            def embed(texts: list[str] | str) -> np.ndarray:
                inputs = [texts] if isinstance(texts, str) else texts
                return vectors(http.post("/v1/embeddings", json={"input": texts}), len(inputs))

            # References, each text alone (a single input: interactive), before any flood.
            query_alone = {query: embed(query)[0] for query in QUERIES}
            rows_alone = {(r, i): embed(bulks[r][i])[0] for r in range(len(bulks)) for i in CHECKED_ROWS}
            embed(bulks[0])  # warm-up: the worker's first large batches
            started = time.perf_counter()
            embed(bulks[0])
            bulk_alone_s = time.perf_counter() - started

        async def flood_and_queries() -> tuple[list[httpx.Response], list[tuple[str, float, httpx.Response]]]:
            async with httpx.AsyncClient(base_url=stack.url, timeout=60) as http:
                flood_done = asyncio.Event()

                async def bulk_client(c: int) -> list[httpx.Response]:
                    """Its requests one after another; a refused one (429: the gateway's estimate of
                    the wait passed its limit) again after Retry-After, as an indexing client does."""
                    responses = []
                    for k in range(NUM_BULK_EACH):
                        texts = bulks[c * NUM_BULK_EACH + k]
                        for _ in range(MAX_BULK_ATTEMPTS):
                            response = await http.post("/v1/embeddings", json={"input": texts})
                            if response.status_code != 429:
                                break
                            await asyncio.sleep(float(response.headers.get("retry-after", "1")))
                        responses.append(response)
                    return responses

                async def flood() -> list[httpx.Response]:
                    try:
                        per_client = await asyncio.gather(*(bulk_client(c) for c in range(NUM_BULK_CLIENTS)))
                    finally:
                        flood_done.set()
                    return [response for responses in per_client for response in responses]

                async def queries() -> list[tuple[str, float, httpx.Response]]:
                    await asyncio.sleep(0.5)  # the flood is in the worker's queue
                    answered = []
                    while not flood_done.is_set():
                        query = QUERIES[len(answered) % len(QUERIES)]
                        started = time.perf_counter()
                        response = await http.post("/v1/embeddings", json={"input": query})
                        answered.append((query, time.perf_counter() - started, response))
                    return answered

                return await asyncio.gather(flood(), queries())

        flood_started = time.perf_counter()
        bulk_responses, answered = asyncio.run(flood_and_queries())
        flood_s = time.perf_counter() - flood_started

        # Every bulk request: all its vectors, in order, each its own text's.
        assert len(bulk_responses) == len(bulks)
        for r, response in enumerate(bulk_responses):  # gathered in the order the requests were made
            got = vectors(response, NUM_BULK_TEXTS)
            assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-4)
            for i in CHECKED_ROWS:
                assert float(got[i] @ rows_alone[r, i]) >= 0.999, (r, i)

        # Queries: many sent while the flood lasted, each right and answered in a fraction of the time
        # it took. Behind the flood in flight (three bulk requests, ~3x one alone) a query would wait
        # well over one bulk request's time alone; served first, it waits for the batches in flight.
        latencies = [seconds for _, seconds, _ in answered]
        assert len(answered) >= 5, f"{len(answered)} queries during a {flood_s:.1f} s flood"
        for query, _, response in answered:
            assert float(vectors(response, 1)[0] @ query_alone[query]) >= 0.999
        bound_s = 1.5 * bulk_alone_s
        assert max(latencies) < bound_s, (
            f"slowest query {max(latencies):.2f} s (median {np.median(latencies):.2f}) beside a flood of "
            f"{flood_s:.1f} s; one bulk request alone took {bulk_alone_s:.2f} s"
        )

        # The gateway classed each request by its size: the bulk ones, and every single-text one.
        metrics = httpx.get(f"{stack.url}/metrics", timeout=10).text
        num_single = len(QUERIES) + len(rows_alone) + len(answered)
        assert class_requests(metrics, "bulk") == len(bulks) + 2
        assert class_requests(metrics, "interactive") == num_single
    finally:
        for proc in stack.processes:
            proc.stop()
