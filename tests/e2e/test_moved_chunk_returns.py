"""A chunk moved off a stopped worker (SIGSTOP) whose second replica then dies (SIGKILL) goes back to
the first once it runs again: a lost replica never fails a request another replica can still answer.
Issue 43's case: two CPU workers, 400 texts of 200 words, worker 0 stopped at 1 s and resumed at
4 s, worker 1 killed at 6.5 s: 3 of 3 answered 503 "no worker replica is serving" (a replica once
tried was never tried again). Here the same steps wait on what the gateway shows instead of a clock,
on a smaller request that is still in flight when worker 1 dies. Real processes, real sockets."""

import asyncio
import os
import random
import signal
import time

import httpx
import numpy as np
import pytest
from processes import Stack, start_stack

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex"


def _texts(num_texts: int) -> list[str]:
    rng, words = random.Random(43), WORDS.split()
    return [" ".join(rng.choice(words) for _ in range(200)) for _ in range(num_texts)]  # 256 tokens each


async def _until(http: httpx.AsyncClient, what: str, holds, timeout_s: float = 15.0) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        workers = (await http.get("/info")).json()["workers"]
        if holds(workers):
            return workers
        await asyncio.sleep(0.05)
    pytest.fail(f"not seen within {timeout_s} s: {what}")


def _run(stack: Stack, num_texts: int, faults) -> httpx.Response:
    async def main() -> httpx.Response:
        async with httpx.AsyncClient(base_url=stack.url, timeout=90) as http:
            request = asyncio.create_task(http.post("/v1/embeddings", json={"input": _texts(num_texts)}))
            await _until(http, "both hold chunks", lambda ws: all(w["outstanding_tokens"] for w in ws))
            await faults(http, request)
            return await request

    return asyncio.run(main())


@pytest.mark.parametrize(
    "resumed_before_the_kill",
    [True, False],
    ids=["resumed-then-other-killed", "other-killed-while-stopped"],
)
def test_a_moved_chunk_goes_back_to_a_replica_that_serves_again(log_dir, resumed_before_the_kill):
    stack = start_stack(log_dir, num_workers=2)
    stopped, killed = stack.processes[0], stack.processes[1]

    async def faults(http: httpx.AsyncClient, request: asyncio.Task) -> None:
        os.kill(stopped.popen.pid, signal.SIGSTOP)
        await _until(http, "worker 0 marked not serving", lambda ws: not ws[0]["serving"])
        if resumed_before_the_kill:  # the order: resumed, serving again, then the other dies
            os.kill(stopped.popen.pid, signal.SIGCONT)
            await _until(http, "worker 0 serving again", lambda ws: ws[0]["serving"])
        workers = (await http.get("/info")).json()["workers"]
        assert not request.done() and workers[1]["outstanding_tokens"], "the request ended too soon"
        killed.popen.kill()
        if not resumed_before_the_kill:  # nothing serves for a second: the chunks wait for worker 0
            await asyncio.sleep(1.0)
            assert not request.done(), f"failed while worker 0 was stopped: {request.result().text}"
            os.kill(stopped.popen.pid, signal.SIGCONT)

    num_texts = 128 if resumed_before_the_kill else 64
    try:
        started = time.monotonic()
        response = _run(stack, num_texts, faults)
        took = time.monotonic() - started
    finally:
        os.kill(stopped.popen.pid, signal.SIGCONT)
        for proc in stack.processes:
            proc.stop()
    assert response.status_code == 200, response.text
    rows = np.array([d["embedding"] for d in response.json()["data"]])
    assert rows.shape[0] == num_texts
    assert np.allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-4)
    print(f"answered in {took:.1f} s")
