"""Closed-loop HTTP/1.1 load generator: C kept-alive connections spread over P processes, each posting a
pre-built request, waiting for the whole answer, then posting the next on the same connection.

Built not to be the bottleneck of a ~20,000 requests/s benchmark on a host with many slow cores:
- Requests are built once (request line, Host, Content-Type, Content-Length, body): sending one is a
  single `transport.write` of bytes we hold. TCP_NODELAY, so Nagle never holds a request back.
- asyncio Protocols on uvloop, not StreamReader/StreamWriter: per request one `data_received` call and
  one write, no futures or coroutine frames. Answers are parsed minimally (status, Content-Length, body
  bytes counted and dropped); a chunked answer or a connection the server closes fails the run clearly.
- P spawned processes, as one Python process is one core at most (spawn: nothing of the caller's loop
  or sockets is inherited). Default P: one per 32 connections, at least 1, at most os.cpu_count() // 4
  (and at most C), which leaves most cores to the server being measured.
- Exact timestamps: each request's send and completion time is time.monotonic_ns(); CLOCK_MONOTONIC is
  system-wide on Linux, so all processes share the parent's time line. Every latency comes back
  (array('q') bytes through a Pipe); percentiles come from them with numpy, never from buckets.
- Synchronized phases: each process opens its connections and says ready; the parent then picks the
  measured phase's start `warmup_s` ahead (caches, allocators and the server's batching settle,
  unrecorded) and its end, and all start sending at once. A request counts when sent at or after the
  start and answered before the end: no latency holds warm-up time, one in flight at the end is
  dropped, and requests/s is low by at most C requests per run.
- CPU: utime+stime in /proc/PID/stat (all threads) of our processes and of each pid the caller names
  with its descendants (/proc/PID/task/*/children), read at the phase's two instants, per request.

Own cost on the 2-core AMD EPYC VM this was written on, one process against a trivial uvloop server
answering `{}` at once (25,000-50,000 requests/s), 5 s runs: 19-21 µs of CPU per request at 8
connections, 19-23 µs at 64 (up to 27 µs while other jobs shared the cores). ~5 µs of it is this
module's Python, the rest uvloop and the read/write/epoll syscalls. A plain Python loop runs ~2.7x
slower on the GPU host: budget ~55 µs there, so 20,000 requests/s costs ~1.1 cores, and each of the 2
default processes at 64 connections is ~55% busy (pass processes=4 for less queueing in our own loop).

CLI: python -P tests/bench/loadgen.py --port 8080 --connections 64 --duration-s 5 [--pid N ...]
"""

import argparse
import asyncio
import math
import multiprocessing
import os
import socket
import time
from array import array
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from functools import partial
from glob import glob
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import cast

import numpy as np
import uvloop

CLOCK_TICK_S = 1 / os.sysconf("SC_CLK_TCK")
# What a process sends back: (body bytes, first error, failure), then sent_ns, done_ns, statuses as bytes.
Report = tuple[tuple[int, str, str], bytes, bytes, bytes]


@dataclass(frozen=True, eq=False)
class LoadResult:
    """One measured phase. Rates and latencies count every answer, errors included (`statuses` says
    which were not 200); CPU is µs per recorded request, nan when none was recorded."""

    num_connections: int
    num_processes: int
    start_ns: int  # time.monotonic_ns() at the measured phase's start
    duration_s: float
    num_requests: int
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float
    num_errors: int  # answers other than 200
    first_error: str  # "" or "503: " and the first (up to 200) body bytes that came with its head
    num_body_bytes: int
    loadgen_cpu_us: float  # the load generator's processes
    pids_cpu_us: float  # the caller's pids with their descendants
    group_cpu_us: dict[str, float]  # per named group of pids (run's `groups`), with their descendants
    sent_ns: np.ndarray  # [num_requests] int64, time.monotonic_ns() at the write
    latencies_ns: np.ndarray  # [num_requests] int64
    statuses: np.ndarray  # [num_requests] uint16

    def table(self) -> str:
        """A markdown header, separator and this run's row."""
        cells = {
            "conns": self.num_connections, "procs": self.num_processes,
            "req/s": f"{self.requests_per_s:,.0f}", "p50 ms": f"{self.p50_ms:.2f}",
            "p99 ms": f"{self.p99_ms:.2f}", "p99.9 ms": f"{self.p999_ms:.2f}",
            "max ms": f"{self.max_ms:.2f}", "errors": self.num_errors,
            "loadgen CPU µs/req": f"{self.loadgen_cpu_us:.1f}", "pids CPU µs/req": f"{self.pids_cpu_us:.1f}",
        }  # fmt: skip
        rows = [list(cells), ["---"] * len(cells), [str(v) for v in cells.values()]]
        return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def build_request(body: bytes, host: str, path: str, headers: dict[str, str]) -> bytes:
    extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{extra}"
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


def default_processes(num_connections: int) -> int:
    """One process per 32 connections, at least 1, at most a quarter of the cores and at most C."""
    most = max(1, (os.cpu_count() or 1) // 4)
    return max(1, min(math.ceil(num_connections / 32), most, num_connections))


class Log:
    """What one process's connections recorded, in arrays so that they go back as plain bytes."""

    def __init__(self) -> None:
        self.start_ns = self.end_ns = 0  # the measured phase, once the parent has chosen it
        self.sent_ns, self.done_ns, self.statuses = array("q"), array("q"), array("H")
        self.num_body_bytes = 0
        self.first_error = ""
        self.failure = ""  # why a connection could not go on, which makes the run invalid


class Client(asyncio.Protocol):
    """One kept-alive connection: posts `requests` in turn, each once the previous answer is whole."""

    def __init__(self, requests: Sequence[bytes], first: int, log: Log) -> None:
        self.requests, self.next, self.log = requests, first % len(requests), log
        self.transport = cast(asyncio.Transport, None)  # set by connection_made, before any use
        self.head = b""  # the answer's head, while it is incomplete
        self.remaining = -1  # body bytes still to come; -1 while reading the head
        self.status = self.length = self.sent_ns = 0
        self.is_stopped = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no asyncio.Transport subclass
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self) -> None:
        request = self.requests[self.next]
        self.next = (self.next + 1) % len(self.requests)
        self.sent_ns = time.monotonic_ns()
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        if self.remaining < 0:
            data = self.head + data
            end = data.find(b"\r\n\r\n")
            if end < 0:
                self.head = data
                return
            self.head, head = b"", data[:end].lower()
            at = head.find(b"\r\ncontent-length:") + 17
            if at < 17:
                chunked = b"\r\ntransfer-encoding:" in head
                self.stop("chunked answers are not supported" if chunked else "no Content-Length header")
                return
            self.status, self.length = int(data[9:12]), int(head[at:].partition(b"\r")[0])
            self.remaining, data = self.length, data[end + 4 :]
            if self.status != 200 and not self.log.first_error:
                self.log.first_error = f"{self.status}: {data[:200].decode(errors='replace')}"
        self.remaining -= len(data)
        if self.remaining <= 0:
            self.complete()

    def complete(self) -> None:
        done_ns, log = time.monotonic_ns(), self.log
        if self.remaining < 0:
            self.stop("bytes after the answer (more than one answer per request?)")
            return
        self.remaining = -1
        if self.sent_ns >= log.start_ns and done_ns < log.end_ns:
            log.sent_ns.append(self.sent_ns)
            log.done_ns.append(done_ns)
            log.statuses.append(self.status)
            log.num_body_bytes += self.length
        if done_ns < log.end_ns and not self.is_stopped:
            self.send()

    def stop(self, failure: str = "") -> None:
        self.log.failure = self.log.failure or failure
        self.is_stopped = True
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.is_stopped:
            self.stop(f"the server closed a connection ({exc!r})")


async def drive(conn: Connection, host: str, port: int, requests: list[bytes], first: int, num: int) -> None:
    """One process's share: open `num` connections, say ready, run the phase the parent sends back."""
    loop, log = asyncio.get_running_loop(), Log()
    clients = [(await loop.create_connection(partial(Client, requests, first + i, log), host, port))[1]
               for i in range(num)]  # fmt: skip
    conn.send("ready")
    log.start_ns, log.end_ns = conn.recv()  # blocks the loop, which has nothing to do yet
    for client in clients:
        client.send()
    # uvloop's timers tick in whole milliseconds and may fire up to 1 ms early: stop surely after the end.
    await asyncio.sleep((log.end_ns - time.monotonic_ns()) / 1e9 + 0.002)
    for client in clients:
        client.stop()
    await asyncio.sleep(0)  # let the transports close before the loop does
    summary = (log.num_body_bytes, log.first_error, log.failure)
    conn.send((summary, log.sent_ns.tobytes(), log.done_ns.tobytes(), log.statuses.tobytes()))


def worker_main(conn: Connection, host: str, port: int, requests: list[bytes], first: int, num: int) -> None:
    try:
        uvloop.run(drive(conn, host, port, requests, first, num))
    except Exception as exc:  # the parent waits on this pipe: tell it rather than leave it hanging
        conn.send(f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it, through each of its threads' children lists."""
    found = [pid]
    for path in glob(f"/proc/{pid}/task/*/children"):
        with suppress(OSError), open(path) as f:  # OSError: the thread has exited
            found += [p for child in f.read().split() for p in descendants(int(child))]
    return found


def cpu_ticks(roots: Sequence[int]) -> dict[int, int]:
    """utime+stime (clock ticks, all threads) of each live process in the trees below `roots`."""
    ticks = {}
    for pid in (p for root in roots for p in descendants(root)):
        with suppress(OSError), open(f"/proc/{pid}/stat") as f:  # OSError: the process has exited
            fields = f.read().rpartition(")")[2].split()  # the name before ")" may hold spaces
            ticks[pid] = int(fields[11]) + int(fields[12])
    return ticks


def cpu_s(start: dict[int, int], end: dict[int, int]) -> float:
    """CPU seconds between two readings; a process born in between counts from zero, one gone is lost."""
    return sum(t - start.get(pid, 0) for pid, t in end.items()) * CLOCK_TICK_S


def receive(conn: Connection, timeout_s: float) -> object:
    if not conn.poll(timeout_s):
        raise TimeoutError(f"a load generator process said nothing for {timeout_s:.0f} s")
    if isinstance(message := conn.recv(), str) and message != "ready":
        raise RuntimeError(f"a load generator process failed: {message}")
    return message


def run(
    port: int, bodies: Sequence[bytes], *, host: str = "127.0.0.1", path: str = "/v1/embeddings",
    headers: dict[str, str] | None = None, connections: int = 64, processes: int | None = None,
    warmup_s: float = 1.0, duration_s: float = 5.0, pids: Sequence[int] = (),
    groups: dict[str, Sequence[int]] | None = None,
) -> LoadResult:  # fmt: skip
    """Closed-loop load on `connections` kept-alive connections; see the module docstring. `groups`:
    pids whose CPU is reported apart, per name (the gateway's, the worker's)."""
    num_processes = processes or default_processes(connections)
    assert 1 <= connections <= 256 and 1 <= num_processes <= connections and bodies
    requests = [build_request(body, f"{host}:{port}", path, headers or {}) for body in bodies]
    shares = [connections // num_processes + (i < connections % num_processes) for i in range(num_processes)]
    context = multiprocessing.get_context("spawn")
    pipes = [context.Pipe() for _ in shares]
    procs = [
        context.Process(target=worker_main, args=(child, host, port, requests, sum(shares[:i]), num))
        for i, ((_, child), num) in enumerate(zip(pipes, shares, strict=True))
    ]
    try:
        for proc, (_, child) in zip(procs, pipes, strict=True):
            proc.start()
            child.close()  # the child has its own copy; ours would hide its end of the pipe closing
        conns = [parent for parent, _ in pipes]
        return measure(conns, procs, connections, warmup_s, duration_s, pids, groups or {})
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
            proc.close()
        for parent, _ in pipes:
            parent.close()


def measure(
    conns: list[Connection], procs: Sequence[BaseProcess], num_connections: int, warmup_s: float,
    duration_s: float, pids: Sequence[int], groups: dict[str, Sequence[int]],
) -> LoadResult:  # fmt: skip
    """Starts the processes' traffic, reads CPU at the phase's two instants, gathers the reports."""
    for conn in conns:
        receive(conn, timeout_s=60)
    start_ns = time.monotonic_ns() + int(warmup_s * 1e9)
    end_ns = start_ns + int(duration_s * 1e9)
    for conn in conns:
        conn.send((start_ns, end_ns))
    ours = [proc.pid for proc in procs if proc.pid is not None]
    time.sleep(max(0, start_ns - time.monotonic_ns()) / 1e9)
    ours_start, theirs_start = cpu_ticks(ours), cpu_ticks(pids)
    groups_start = {name: cpu_ticks(members) for name, members in groups.items()}
    time.sleep(max(0, end_ns - time.monotonic_ns()) / 1e9)
    ours_s, theirs_s = cpu_s(ours_start, cpu_ticks(ours)), cpu_s(theirs_start, cpu_ticks(pids))
    groups_s = {name: cpu_s(groups_start[name], cpu_ticks(members)) for name, members in groups.items()}
    reports = [cast(Report, receive(conn, timeout_s=60)) for conn in conns]
    for proc in procs:
        proc.join(timeout=10)
    summaries, sent, done, status = zip(*reports, strict=True)
    if failure := next((failure for _, _, failure in summaries if failure), ""):
        raise RuntimeError(f"a load generator connection failed: {failure}")
    sent_ns = np.concatenate([np.frombuffer(b, dtype=np.int64) for b in sent])
    latencies_ns = np.concatenate([np.frombuffer(b, dtype=np.int64) for b in done]) - sent_ns
    statuses = np.concatenate([np.frombuffer(b, dtype=np.uint16) for b in status])
    num = len(latencies_ns)
    quantiles = np.percentile(latencies_ns, [50, 99, 99.9, 100]) / 1e6 if num else [math.nan] * 4
    p50, p99, p999, top = (float(q) for q in quantiles)
    per_request_us = 1e6 / num if num else math.nan
    return LoadResult(
        num_connections=num_connections, num_processes=len(procs),
        start_ns=start_ns, duration_s=duration_s, num_requests=num, requests_per_s=num / duration_s,
        p50_ms=p50, p99_ms=p99, p999_ms=p999, max_ms=top, num_errors=int(np.count_nonzero(statuses != 200)),
        first_error=next((first for _, first, _ in summaries if first), ""),
        num_body_bytes=sum(body_bytes for body_bytes, _, _ in summaries),
        loadgen_cpu_us=ours_s * per_request_us, pids_cpu_us=theirs_s * per_request_us,
        group_cpu_us={name: seconds * per_request_us for name, seconds in groups_s.items()},
        sent_ns=sent_ns, latencies_ns=latencies_ns, statuses=statuses,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--path", default="/v1/embeddings")
    parser.add_argument("--body", action="append", help="a request body; repeat it to rotate several")
    parser.add_argument("--header", action="append", default=[], help="'Name: value'; repeatable")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--processes", type=int, help="default: one per 32 connections, ≤ cores/4")
    parser.add_argument("--warmup-s", type=float, default=1.0)
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument("--pid", type=int, action="append", default=[], help="count this process tree's CPU")
    args = parser.parse_args()
    bodies = [b.encode() for b in args.body or ['{"input": "hello", "encoding_format": "base64"}']]
    headers = {name.strip(): value.strip() for name, value in (h.split(":", 1) for h in args.header)}
    result = run(args.port, bodies, host=args.host, path=args.path, headers=headers,
                 connections=args.connections, processes=args.processes, warmup_s=args.warmup_s,
                 duration_s=args.duration_s, pids=args.pid)  # fmt: skip
    print(result.table())
    if result.first_error:
        print(f"\nfirst error: {result.first_error}")


if __name__ == "__main__":
    main()
