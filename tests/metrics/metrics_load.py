"""A short, bounded load on a local gateway, in phases of rising and falling concurrency, with a mix
of what users send: OpenAI and TEI embeddings of 1 to 16 texts, /tokenize, a /rerank the embedding
model refuses (501), an empty input (400, as OpenAI answers); beside it, a trickle of embeddings to a
gateway that has no worker (each 503). Only 127.0.0.1 is ever addressed."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass

import httpx

WORDS = (
    "embedding", "vector", "search", "query", "document", "passage", "ranking", "gateway", "worker", "batch",
    "token", "budget", "graph", "capture", "replay", "pinned", "memory", "latency", "rollout", "model",
)  # fmt: skip


@dataclass(frozen=True)
class Phase:
    seconds: float
    concurrency: int


# Quiet, busy, quiet: the panels show latency and queue depth rise with concurrency and fall back.
PHASES = (Phase(5, 1), Phase(10, 8), Phase(5, 2))


def texts(rng: random.Random) -> list[str]:
    return [" ".join(rng.choices(WORDS, k=rng.randint(3, 40))) for _ in range(rng.randint(1, 16))]


def request(rng: random.Random, i: int) -> tuple[str, dict]:
    """The i-th request of one client: mostly OpenAI embeddings, now and then something else."""
    batch = texts(rng)
    if i % 20 == 9:
        return "/v1/embeddings", {"input": []}
    if i % 10 == 3:
        return "/embed", {"inputs": batch}
    if i % 10 == 5:
        return "/tokenize", {"inputs": batch[:2]}
    if i % 10 == 7:
        return "/rerank", {"query": batch[0], "texts": batch}
    return "/v1/embeddings", {"input": batch, "encoding_format": "base64"}


async def client(http: httpx.AsyncClient, seed: int, deadline: float, statuses: Counter) -> None:
    rng = random.Random(seed)
    i = 0
    while time.monotonic() < deadline:
        path, body = request(rng, i)
        response = await http.post(path, json=body)
        statuses[(path, response.status_code)] += 1
        i += 1


async def load(url: str, phases: tuple[Phase, ...] = PHASES) -> Counter:
    """Run the phases one after another; (path, status) -> count."""
    statuses: Counter = Counter()
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        for number, phase in enumerate(phases):
            deadline = time.monotonic() + phase.seconds
            seeds = range(number * 100, number * 100 + phase.concurrency)
            await asyncio.gather(*(client(http, seed, deadline, statuses) for seed in seeds))
    return statuses


async def trickle(url: str, seconds: float, every_s: float = 0.1) -> Counter:
    """An embedding request every `every_s` for `seconds`, one at a time; (path, status) -> count."""
    statuses: Counter = Counter()
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        while time.monotonic() < deadline:
            response = await http.post("/v1/embeddings", json={"input": "hello"})
            statuses[("/v1/embeddings", response.status_code)] += 1
            await asyncio.sleep(every_s)
    return statuses


async def load_beside_outage(url: str, lost_url: str) -> tuple[Counter, Counter]:
    """`load(url)` with a `trickle` to `lost_url` for as long."""
    seconds = sum(phase.seconds for phase in PHASES)
    statuses, lost = await asyncio.gather(load(url), trickle(lost_url, seconds))
    return statuses, lost
