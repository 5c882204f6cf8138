"""A request the workers cannot finish within its deadline is refused at once with 413 naming their
rate and what would fit, not run into a 504 while others wait: real CPU workers, whose health
reports their measured rate, behind a gateway with a 10 s deadline."""

import time

import httpx
from processes import start_stack


def test_an_infeasible_request_is_refused_at_once_and_a_query_beside_it_served(stack, log_dir):
    gateway = start_stack(
        log_dir, num_workers=0, worker_addresses=stack.workers, gateway_args=("--request-timeout-s", "10")
    )
    try:
        workers = httpx.get(f"{gateway.url}/info", timeout=10).json()["workers"]
        assert all(w["tokens_per_s"] > 0 for w in workers)  # each measured its device at start
        texts = ["lorem ipsum dolor sit amet " * 144] * 2048  # 3,900 characters each: 256 tokens kept
        started = time.monotonic()
        response = httpx.post(f"{gateway.url}/v1/embeddings", json={"input": texts}, timeout=60)
        took = time.monotonic() - started
        assert response.status_code == 413, response.text[:300]
        message = response.json()["error"]["message"]
        assert "tokens/s" in message and "deadline" in message and "at most" in message
        assert took < 5.0, f"refused after {took:.1f} s"
        query = httpx.post(f"{gateway.url}/v1/embeddings", json={"input": "a query"}, timeout=10)
        assert query.status_code == 200
    finally:
        for proc in gateway.processes:
            proc.stop()
