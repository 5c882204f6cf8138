"""Overload: many clients sending large requests to one worker, far more than it can serve.

Starts a real worker (the bundled MiniLM, CPU unless a GPU is present) and gateway, measures the
capacity first (a few clients, requests served one after another without refusals), then runs
`--clients` closed-loop clients for `--seconds`: each posts `--texts` texts of ~200 words, and on a
429 waits the `Retry-After` it was given before trying again, as a well-behaved client does. Prints
what the clients saw: answers by status, latency of answered and refused requests (exact, per
request), and goodput against the capacity. Not part of `make test` (minutes of a whole machine).

    .venv/bin/python -P tests/bench/overload.py --clients 256 --seconds 60
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `python -P` adds no script folder
from timing import percentile as quantile

SENTENCE = (
    "semantic search over dense vector embeddings lets a question find passages that share its meaning "
    "rather than its exact words and ranks them by cosine similarity before a reranker looks again"
)
WORDS = SENTENCE.split(" ")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def text(i: int, num_words: int = 200) -> str:
    return " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(num_words))


async def closed_loop(
    client: httpx.AsyncClient, url: str, texts: list[str], until: float, log: list[tuple[int, float, float]]
) -> None:
    """Posts until `until`; logs (status, started, seconds) per request; honours Retry-After. The
    body is encoded once: the client's own CPU per request is then little more than the socket's."""
    body = json.dumps({"input": texts}).encode()
    headers = {"content-type": "application/json"}
    while time.perf_counter() < until:
        started = time.perf_counter()
        try:
            response = await client.post(url, content=body, headers=headers)
            status, retry_after = response.status_code, response.headers.get("retry-after")
        except httpx.HTTPError:
            status, retry_after = -1, None
        log.append((status, started, time.perf_counter() - started))
        if status == 429:
            await asyncio.sleep(float(retry_after or 1))


async def run(url: str, num_clients: int, num_texts: int, seconds: float) -> list[tuple[int, float, float]]:
    log: list[tuple[int, float, float]] = []
    limits = httpx.Limits(max_connections=num_clients, max_keepalive_connections=num_clients)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        until = time.perf_counter() + seconds
        batches = [[text(c * num_texts + i) for i in range(num_texts)] for c in range(num_clients)]
        await asyncio.gather(*(closed_loop(client, url, batches[c], until, log) for c in range(num_clients)))
    return log


def report(name: str, log: list[tuple[int, float, float]], seconds: float, num_texts: int) -> float:
    statuses = Counter(status for status, _, _ in log)
    answered = [took for status, _, took in log if status == 200]
    refused = [took for status, _, took in log if status == 429]
    goodput = len(answered) * num_texts / seconds
    print(f"\n{name}: {len(log)} requests in {seconds:.0f} s; by status {dict(sorted(statuses.items()))}")
    if answered:
        print(
            f"  answered: p50 {statistics.median(answered):.2f} s, p99 {quantile(answered, 0.99):.2f} s, "
            f"max {max(answered):.2f} s; goodput {goodput:.0f} texts/s"
        )
    if refused:
        print(
            f"  refused (429): p50 {statistics.median(refused) * 1000:.1f} ms, "
            f"p99 {quantile(refused, 0.99) * 1000:.1f} ms, max {max(refused) * 1000:.1f} ms"
        )
        first = min(started for _, started, _ in log)
        later = [took for status, started, took in log if status == 429 and started > first + 5]
        if later:  # without the first burst, when every client's first request arrives at once
            print(
                f"  refused after the first 5 s: p50 {statistics.median(later) * 1000:.1f} ms, "
                f"p99 {quantile(later, 0.99) * 1000:.1f} ms, max {max(later) * 1000:.1f} ms"
            )
    return goodput


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=256)
    parser.add_argument("--texts", type=int, default=64, help="texts of ~200 words per request")
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--capacity-clients", type=int, default=2)
    parser.add_argument("--capacity-seconds", type=float, default=30)
    parser.add_argument(
        "--separate-cores",
        action="store_true",
        help="pin the worker to the first half of the cores and the gateway to the rest (taskset), as "
        "separate pods would run; without it they share every core and the gateway's tokenizing of "
        "requests it then refuses takes CPU from the worker",
    )
    args = parser.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    half = max(1, len(cores) // 2)
    pin = {
        "worker": ["taskset", "-c", ",".join(map(str, cores[:half]))] if args.separate_cores else [],
        "gateway": ["taskset", "-c", ",".join(map(str, cores[half:] or cores))]
        if args.separate_cores
        else [],
    }
    worker_port, metrics_port, gateway_port = free_port(), free_port(), free_port()
    python = [sys.executable, "-P", "-m"]
    logs = Path(os.environ.get("TMPDIR", "/tmp"))
    procs = [
        subprocess.Popen(
            [
                *pin["worker"],
                *python,
                "kembed.worker",
                "--port",
                str(worker_port),
                "--metrics-port",
                str(metrics_port),
            ],
            stdout=(logs / "overload-worker.log").open("w"),
            stderr=subprocess.STDOUT,
        ),
        subprocess.Popen(
            [
                *pin["gateway"],
                *python,
                "kembed.gateway",
                "--port",
                str(gateway_port),
                "--worker",
                f"127.0.0.1:{worker_port}",
            ],
            stdout=(logs / "overload-gateway.log").open("w"),
            stderr=subprocess.STDOUT,
        ),
    ]
    base = f"http://127.0.0.1:{gateway_port}"
    try:
        for _ in range(480):
            try:
                if httpx.get(f"{base}/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        url = f"{base}/v1/embeddings"
        asyncio.run(run(url, args.capacity_clients, args.texts, 5))  # warm up
        capacity_log = asyncio.run(run(url, args.capacity_clients, args.texts, args.capacity_seconds))
        capacity = report(
            f"capacity ({args.capacity_clients} clients)", capacity_log, args.capacity_seconds, args.texts
        )
        log = asyncio.run(run(url, args.clients, args.texts, args.seconds))
        # Requests still running at the end count in the time they took, so the span is the last end.
        span = max(started + took for _, started, took in log) - min(started for _, started, _ in log)
        goodput = report(f"overload ({args.clients} clients)", log, span, args.texts)
        print(f"  goodput {goodput / capacity:.0%} of capacity")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)


if __name__ == "__main__":
    main()
