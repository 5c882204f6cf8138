"""The clients of `make bench-mixed` (bench_mixed.py): raw HTTP/1.1 on kept-alive connections, each
request's start and end recorded. Bulk clients run in a process of their own (`bulk_loops`), as an
indexing job runs apart from the search front end that sends the queries, so a query's time at its
client holds no wait for the bulk clients' own work (writing ~150 kB requests, reading ~550 kB
answers) on a shared event loop."""

import asyncio
import json
import random
import re
import socket
import time
from dataclasses import dataclass

import uvloop

PROMPT_TOKENS = re.compile(rb'"prompt_tokens":\s*(\d+)')


@dataclass(frozen=True)
class Done:
    """One answered request, as its client saw it (perf_counter seconds)."""

    started: float
    finished: float
    num_tokens: int  # the response's usage.prompt_tokens


def http_request(port: int, body: dict, headers: dict[str, str]) -> bytes:
    data = json.dumps(body).encode()
    head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    return (
        f"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"{head}Content-Length: {len(data)}\r\n\r\n"
    ).encode() + data


async def post(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes):
    """(status, head, body) of one request on a kept-alive connection."""
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    return int(head[9:12]), head, await reader.readexactly(length)


def retry_after_s(head: bytes) -> float:
    for line in head.split(b"\r\n"):
        if line[:12].lower() == b"retry-after:":
            return float(line[12:])
    return 1.0


async def closed_loop(port: int, requests: list[bytes], until: float, log: list[Done], refused: list[float]):
    """Posts `requests` in turn, each after the last is answered, until `until`."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        i = 0
        while time.perf_counter() < until:
            started = time.perf_counter()
            status, head, body = await post(reader, writer, requests[i % len(requests)])
            finished = time.perf_counter()
            if status == 429:  # bulk, refused while the queue is full: back off as told, then again
                refused.append(started)
                await asyncio.sleep(min(retry_after_s(head), max(0.0, until - time.perf_counter())))
                continue
            if status != 200:
                raise SystemExit(f"HTTP {status}: {body[:300]!r}")
            match = PROMPT_TOKENS.search(body, max(0, len(body) - 200)) or PROMPT_TOKENS.search(body)
            log.append(Done(started, finished, int(match.group(1)) if match else 0))
            i += 1
    finally:
        writer.close()


async def open_loop(port: int, requests: list[list[bytes]], rate: float, until: float, log: list[Done]):
    """Queries arriving at `rate` per second (Poisson, seeded) until `until`, each sent on the first
    free one of `len(requests)` kept-alive connections (connection c posts requests[c] in turn). A
    query's time counts from its arrival, so one that waits for a free connection (or for this loop)
    waits on the clock, as a user's would: the rate is the load, whatever the latency."""
    free: asyncio.Queue[tuple[int, asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()
    for c in range(len(requests)):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        free.put_nowait((c, reader, writer))
    sent = [0] * len(requests)
    rng = random.Random(len(requests) * 7919 + int(rate))

    async def one(arrival: float) -> None:
        c, reader, writer = await free.get()
        try:
            status, _, body = await post(reader, writer, requests[c][sent[c] % len(requests[c])])
            sent[c] += 1
            if status != 200:
                raise SystemExit(f"HTTP {status}: {body[:300]!r}")
            log.append(Done(arrival, time.perf_counter(), 0))
        finally:
            free.put_nowait((c, reader, writer))

    tasks: set[asyncio.Task[None]] = set()
    arrival = time.perf_counter()
    while arrival < until:
        await asyncio.sleep(max(0.0, arrival - time.perf_counter()))
        task = asyncio.create_task(one(arrival))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        arrival += rng.expovariate(rate)
    await asyncio.gather(*tasks)
    while not free.empty():
        free.get_nowait()[2].close()


def bulk_loops(port: int, bulks: list[list[bytes]], until: float) -> tuple[list[Done], list[float], float]:
    """Run in a process of its own: one closed loop per bulk client until `until` (perf_counter, the
    same clock in every process); returns (answered, refused starts, CPU seconds it used)."""
    done: list[Done] = []
    refused: list[float] = []
    cpu = time.process_time()

    async def run() -> None:
        await asyncio.gather(*(closed_loop(port, requests, until, done, refused) for requests in bulks))

    uvloop.run(run())
    return done, refused, time.process_time() - cpu


def ready() -> bool:
    """A no-op, to start the bulk clients' process before it is timed."""
    return True
