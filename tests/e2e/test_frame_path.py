"""The data path end to end, real gateway and worker processes: many concurrent queries share the
worker's frames and come back to their own callers with the vectors each gets alone, a wrong one
among them fails alone, and the worker's counters show the frames carried several at once."""

import asyncio
import re

import httpx
import numpy as np


def admitted(worker_metrics_url: str) -> tuple[float, float]:
    text = httpx.get(worker_metrics_url, timeout=10).text
    requests = float(re.search(r"^kembed_worker_admitted_requests_total (\S+)", text, re.M).group(1))
    groups = float(re.search(r"^kembed_worker_admitted_groups_total (\S+)", text, re.M).group(1))
    return requests, groups


def test_concurrent_queries_share_frames_and_get_their_own_vectors(stack, client):
    texts = [f"query number {i} about frames and batches" for i in range(48)]
    alone = [
        client.post("/v1/embeddings", json={"input": text}).json()["data"][0]["embedding"] for text in texts
    ]
    metrics = [f"http://127.0.0.1:{port}/metrics" for port in stack.worker_metrics_ports]
    before = [admitted(url) for url in metrics]

    async def all_at_once() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=stack.url, timeout=60) as http:
            bad = http.post("/embed", json={"inputs": [[10**6]]})  # an id past the vocabulary
            return await asyncio.gather(bad, *(http.post("/v1/embeddings", json={"input": t}) for t in texts))

    bad, *responses = asyncio.run(all_at_once())
    assert bad.status_code == 422 and "outside" in bad.json()["error"]
    for text, response, vector in zip(texts, responses, alone, strict=True):
        assert response.status_code == 200, text
        np.testing.assert_allclose(response.json()["data"][0]["embedding"], vector, rtol=1e-4, atol=1e-6)
    after = [admitted(url) for url in metrics]
    requests = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
    groups = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
    assert requests >= len(texts)  # the bad one is refused before admission, or fails alone after it
    assert groups < requests  # some frames carried several queries
