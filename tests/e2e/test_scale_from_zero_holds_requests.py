"""A model at zero workers stays routable: the gateway holds its requests (the demand shows as
`kembed_gateway_held_requests`), answers every one once a worker starts and serves, none lost, and
refuses past its bounds (count, bytes, the wake deadline) with 503 and Retry-After. Real processes:
a gateway started before any worker of its model exists."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from processes import Process, free_port, spawn, wait_ready

pytestmark = pytest.mark.slow

TEXTS = ["what is the capital of France?", "a held request", "scale from zero"]


def start_gateway(log_dir, worker: str, *flags: str) -> tuple[str, Process]:
    port = free_port()
    args = ["kembed.gateway", "--port", str(port), "--worker", worker, *flags]
    gateway = spawn(f"gateway-{port}", args, log_dir)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, [gateway])  # ready at zero workers: it holds, so its Service keeps it
    return url, gateway


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    assert found, f"{name} not in /metrics"
    return float(found.group(1))


def test_requests_sent_at_zero_are_answered_once_a_worker_serves(log_dir, reference):
    worker_port = free_port()
    url, gateway = start_gateway(log_dir, f"127.0.0.1:{worker_port}", "--max-held-requests", "4")
    worker = None
    try:
        with ThreadPoolExecutor(4) as pool:
            held = [
                pool.submit(httpx.post, f"{url}/v1/embeddings", json={"input": [text]}, timeout=120)
                for text in [*TEXTS, TEXTS[0]]
            ]
            deadline = time.monotonic() + 10
            while metric(url, "kembed_gateway_held_requests") < 4 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert metric(url, "kembed_gateway_held_requests") == 4  # the demand that wakes the model
            full = httpx.post(f"{url}/embed", json={"inputs": "one too many"}, timeout=10)
            assert full.status_code == 503 and int(full.headers["retry-after"]) >= 1, full.text
            assert all(not f.done() for f in held)
            worker = spawn(
                f"worker-{worker_port}",
                ["kembed.worker", "--port", str(worker_port), "--metrics-port", "0", "--device", "cpu"],
                log_dir,
            )
            answers = [f.result(timeout=120) for f in held]
        assert [a.status_code for a in answers] == [200] * 4, [a.text for a in answers]
        rows = np.array([a.json()["data"][0]["embedding"] for a in answers], np.float32)
        want = reference.encode([*TEXTS, TEXTS[0]])
        cosines = (rows * want).sum(1) / (np.linalg.norm(rows, axis=1) * np.linalg.norm(want, axis=1))
        assert cosines.min() >= 0.999
        assert metric(url, "kembed_gateway_held_requests") == 0
        assert metric(url, "kembed_gateway_holds_total") == 4
        assert metric(url, 'kembed_gateway_hold_refusals_total{reason="full"}') == 1
    finally:
        for proc in (gateway, worker):
            if proc is not None:
                proc.stop()


def test_past_the_wake_deadline_or_the_bytes_bound_the_answer_is_503_with_retry_after(log_dir):
    url, gateway = start_gateway(
        log_dir, f"127.0.0.1:{free_port()}", "--max-held-requests", "8", "--max-held-bytes", "1000",
        "--wake-timeout-s", "1",
    )  # fmt: skip
    try:
        started = time.monotonic()
        expired = httpx.post(f"{url}/v1/embeddings", json={"input": "nobody wakes"}, timeout=30)
        assert 1 <= time.monotonic() - started < 5
        assert expired.status_code == 503 and expired.headers["retry-after"] == "1", expired.text
        assert "none served within 1 s" in expired.json()["error"]["message"]
        started = time.monotonic()
        large = httpx.post(f"{url}/v1/embeddings", json={"input": "x" * 2000}, timeout=30)
        assert large.status_code == 503 and "retry-after" in large.headers, large.text
        assert time.monotonic() - started < 0.5  # refused at once, never held
        assert metric(url, 'kembed_gateway_hold_refusals_total{reason="expired"}') == 1
        assert metric(url, 'kembed_gateway_hold_refusals_total{reason="full"}') == 1
        tokenized = httpx.post(f"{url}/tokenize", json={"inputs": "no worker needed"}, timeout=10)
        assert tokenized.status_code == 200  # what the gateway answers itself is never held
    finally:
        gateway.stop()
