"""`make bench-path`: the request path alone, on any machine: 1-16 concurrent single-query clients
through a real gateway and a real worker process whose engine is a stand-in (standin_worker.py).

Each client keeps one HTTP/1.1 connection and posts one 12-word query at a time to /v1/embeddings
(base64, as the OpenAI SDK does), waiting for each answer; latency is measured at the client. The
clients are raw asyncio sockets on uvloop so that, on a small machine, they take as little CPU from
the gateway and worker as possible. The stand-in engine answers after `--step-ms` of emulated device
time (default 0: what remains is HTTP, JSON, tokenization, gRPC and the worker's scheduling).

Besides latency it reports the CPU time the gateway (all its processes) and the worker spend per
request, read from /proc: on a machine with few cores that is what limits throughput. Each level runs
`--rounds` times and each figure is the median round's, the worst in brackets; a round during which
other processes loaded the machine is run again. `--profile DIR` records py-spy profiles (collapsed
stacks) of the gateway and worker under 16 clients. Prints a markdown table. A benchmark, not a
test: nothing asserts speed.
"""

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `python -P` adds no script folder
from timing import cell, percentile, table_header, table_row

HERE = Path(__file__).resolve().parent
WORDS = ["what", "is", "the", "fastest", "way", "to", "serve", "text", "embeddings", "for", "semantic",
         "search", "at", "scale"]  # fmt: skip


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spawn(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-P", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )


def request_bytes(port: int, text: str) -> bytes:
    body = json.dumps({"input": text, "encoding_format": "base64"}).encode()
    head = (
        f"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def post(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> None:
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = head[9:12]
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    body = await reader.readexactly(length)
    if status != b"200":
        raise SystemExit(f"HTTP {status.decode()}: {body[:300]!r}")


async def clients(port: int, concurrency: int, requests_each: int) -> tuple[list[float], float]:
    """Latencies in ms of every request, and the wall time of the whole run in s."""
    latencies: list[float] = []

    async def client(index: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        queries = [
            request_bytes(port, " ".join(WORDS[(index + i + k) % len(WORDS)] for k in range(12)))
            for i in range(len(WORDS))
        ]
        try:
            for i in range(requests_each):
                started = time.perf_counter()
                await post(reader, writer, queries[i % len(queries)])
                latencies.append((time.perf_counter() - started) * 1e3)
        finally:
            writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(concurrency)))
    return latencies, time.perf_counter() - started


def wait_ready(port: int, processes: list[subprocess.Popen], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in processes):
            raise SystemExit("a process exited before the gateway was ready (see the logs)")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                sock.sendall(f"GET /ready HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
                if sock.recv(64).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"gateway on port {port} not ready after {timeout_s}s")


def cpu_seconds(pid: int, with_children: bool = True) -> float:
    """User + system CPU time of a process, all its threads, and of its live child processes (several
    gateway processes) unless told not to (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        children = [
            int(child)
            for task in Path(f"/proc/{pid}/task").iterdir()
            for child in (task / "children").read_text().split()
            if with_children
        ]
    except OSError:
        return 0.0
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return own + sum(cpu_seconds(child) for child in children)


def machine_busy_seconds() -> float:
    """CPU time spent by everything on this machine, all cores (Linux /proc; 0 elsewhere)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]]
    except OSError:
        return 0.0
    idle, iowait = fields[3], fields[4]
    return (sum(fields) - idle - iowait) / os.sysconf("SC_CLK_TCK")


def measure(
    port: int, processes: list[subprocess.Popen], concurrency: int, requests_each: int, max_other_load: float
) -> tuple[float, float, float, float, float]:
    """(p50 ms, p99 ms, requests/s, gateway CPU µs per request, worker CPU µs per request).

    On a shared machine a round during which other processes used more than `max_other_load` of a
    core is run again (up to 20 times): their load would show up as our latency."""

    def ours() -> list[float]:  # gateway, worker, these clients
        return [cpu_seconds(p.pid) for p in processes] + [cpu_seconds(os.getpid(), with_children=False)]

    for _ in range(20):
        own_before, busy_before = ours(), machine_busy_seconds()
        latencies, wall_s = uvloop.run(clients(port, concurrency, requests_each))
        own = [after - before for after, before in zip(ours(), own_before, strict=True)]
        other_load = (machine_busy_seconds() - busy_before - sum(own)) / wall_s
        if other_load <= max_other_load:
            break
        print(f"(other processes used {other_load:.0%} of a core: round run again)", file=sys.stderr)
        time.sleep(2)
    latencies.sort()
    return (
        statistics.median(latencies),
        percentile(latencies, 0.99),
        len(latencies) / wall_s,
        own[0] * 1e6 / len(latencies),
        own[1] * 1e6 / len(latencies),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="per client and concurrency level")
    parser.add_argument(
        "--rounds", type=int, default=3, help="runs per level; each figure: the median round (worst)"
    )
    parser.add_argument(
        "--max-other-load", type=float, default=0.15, help="cores other processes may use during a round"
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--step-ms", type=float, default=0.0, help="emulated device time per batch")
    parser.add_argument("--dimensions", type=int, default=1024)
    parser.add_argument("--gateway-arg", action="append", default=[], help="extra gateway flag (repeat)")
    parser.add_argument("--worker-arg", action="append", default=[], help="extra worker flag (repeat)")
    parser.add_argument("--profile", type=Path, help="write py-spy profiles here")
    parser.add_argument("--profile-s", type=float, default=8.0)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kembed-bench-path-"))
    worker_port, gateway_port = free_port(), free_port()
    worker = spawn(
        [
            str(HERE / "standin_worker.py"),
            f"--step-ms={args.step_ms}",
            f"--dimensions={args.dimensions}",
            f"--port={worker_port}",
            "--metrics-port=0",
            "--log-level=WARNING",
            *args.worker_arg,
        ],
        tmp / "worker.log",
    )
    gateway = spawn(
        [
            "-m",
            "kembed.gateway",
            f"--worker=127.0.0.1:{worker_port}",
            f"--port={gateway_port}",
            "--log-level=warning",
            *args.gateway_arg,
        ],
        tmp / "gateway.log",
    )
    processes = [gateway, worker]
    try:
        wait_ready(gateway_port, processes)
        uvloop.run(clients(gateway_port, 16, 100))  # warm-up: connections, caches, lazy imports
        print(f"step {args.step_ms} ms; gateway {' '.join(args.gateway_arg) or '(defaults)'}; "
              f"worker {' '.join(args.worker_arg) or '(defaults)'}", flush=True)  # fmt: skip
        print("\n" + table_header("concurrent clients", "p50 ms", "p99 ms", "requests/s",
                                   "gateway CPU µs/request", "worker CPU µs/request"))  # fmt: skip
        for concurrency in args.concurrency:
            rounds = [
                measure(gateway_port, processes, concurrency, args.requests, args.max_other_load)
                for _ in range(args.rounds)
            ]
            # each cell: the median round, and in brackets the worst (for requests/s, the lowest)
            cells = [
                cell(values, "{:.2f}" if column < 2 else "{:.0f}", is_higher_better=column == 2)
                for column, values in enumerate(zip(*rounds, strict=True))
            ]
            print(table_row(concurrency, *cells), flush=True)
        if args.profile:
            profile(args, gateway_port, {"gateway": gateway, "worker": worker})
    finally:
        for proc in processes:
            proc.send_signal(signal.SIGTERM)
        for proc in processes:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        for log in ("worker.log", "gateway.log"):
            text = (tmp / log).read_text()
            if "Traceback" in text or "Error" in text:
                print(f"--- {log}\n{text[-3000:]}")


def profile(args: argparse.Namespace, port: int, processes: dict[str, subprocess.Popen]) -> None:
    """py-spy on each process (all its threads, idle time left out) while 16 clients post."""
    args.profile.mkdir(parents=True, exist_ok=True)
    spies = []
    for name, proc in processes.items():
        out = args.profile / f"{name}.txt"  # collapsed stacks, one line per stack with its count
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        command = [py_spy, "record", "--pid", str(proc.pid), "--rate", "250", "--threads", "--subprocesses",
                   "--nonblocking", "--duration", str(int(args.profile_s)), "--format", "raw",
                   "--output", str(out)]  # fmt: skip
        spies.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
    deadline = time.perf_counter() + args.profile_s + 1

    async def load() -> None:
        while time.perf_counter() < deadline:
            await clients(port, 16, 50)

    uvloop.run(load())
    for spy in spies:
        spy.wait(60)
    print(f"profiles in {args.profile}")


if __name__ == "__main__":
    main()
