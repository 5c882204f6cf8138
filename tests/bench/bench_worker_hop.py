"""The gateway→worker hop alone: the gateway's own transports (its data port's frames, unary gRPC)
against a real worker process around a stand-in engine (standin_worker.py), query-sized requests
(16 token ids in, one 1024-float row out). `python -P tests/bench/bench_worker_hop.py`.

Loads: one caller with an idle gap between requests (every wake-up is cold), then C concurrent
callers back to back on one connection, as one gateway process's requests. With frames, the
callers' requests of one turn of the loop share a frame, and the worker answers a frame per batch.
Reports p50/p99 µs per request and the worker's CPU per request (its process, all threads, over
the timed requests), the median of the rounds and the worst in brackets; the transports alternate
round by round, so drift on a shared host hits both. `--step-ms` emulates device time per batch.
A benchmark, not a test.
"""

import argparse
import asyncio
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import numpy as np
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gateway_path import cpu_seconds
from timing import cell, percentile, table_row

from kembed.gateway.pool.batches import Part
from kembed.gateway.pool.transports import FrameTransport, UnaryTransport
from kembed.proto import embedder_pb2 as pb
from kembed.proto.embedder_pb2_grpc import EmbedderStub

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def measure(
    transport: str,
    address: str,
    worker_pid: int,
    callers: int,
    requests_each: int,
    gap_s: float,
    window: int = 0,
) -> tuple[list[float], float]:
    """Sorted latencies (µs) and the worker's CPU µs per request."""
    channel = grpc.aio.insecure_channel(address)
    stub = EmbedderStub(channel)
    info = await stub.Info(pb.InfoRequest())
    if transport == "frames":
        hop = FrameTransport(
            address, "127.0.0.1", info.frame_port, max_frame_bytes=64 << 20, connect_timeout_s=5
        )
    else:
        hop = UnaryTransport(stub, ())
    loop = asyncio.get_running_loop()
    latencies: list[float] = []

    async def call(first: int) -> None:
        ids = [np.arange(first, first + 16, dtype=np.int32)]
        part = Part("hop", ids, None, 16, deadline=loop.time() + 10)
        await hop.request("embed", part, 10.0)

    async def caller(index: int) -> None:
        for i in range(requests_each):
            started = time.perf_counter()
            await call(100 + (index * 7 + i) % 1000)
            latencies.append((time.perf_counter() - started) * 1e6)
            if gap_s:
                await asyncio.sleep(gap_s)

    await asyncio.gather(*(call(100 + i) for i in range(50)))  # warm: connection, code paths
    cpu_before = cpu_seconds(worker_pid)
    await asyncio.gather(*(caller(c) for c in range(callers)))
    worker_cpu = cpu_seconds(worker_pid) - cpu_before
    await hop.close()
    await channel.close()
    return sorted(latencies), worker_cpu * 1e6 / len(latencies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=2000, help="requests per round and load, all callers")
    parser.add_argument("--gap-ms", type=float, default=2.5, help="idle gap of the lone caller")
    parser.add_argument("--callers", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--step-ms", type=float, default=0.0, help="emulated device time per batch")
    parser.add_argument("--transports", nargs="+", default=["unary", "frames"])
    parser.add_argument("--max-inflight-frames", type=int, default=0, help="the frame window (gateway flag)")
    args = parser.parse_args()
    port = free_port()
    log = Path(tempfile.mkdtemp()) / "worker.log"
    with log.open("w") as out:
        worker = subprocess.Popen(
            [sys.executable, "-P", str(HERE / "standin_worker.py"), "--step-ms", str(args.step_ms),
             "--port", str(port), "--metrics-port", "0", "--model", str(HERE)],  # the stand-in reads no model
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        address = f"127.0.0.1:{port}"
        for _ in range(600):  # the port opens once the worker is ready
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                time.sleep(0.1)
        else:
            raise SystemExit(f"the worker did not open its port in 60 s:\n{log.read_text()[-2000:]}")
        loads = [("1 caller, idle gaps", 1, args.gap_ms / 1e3)]
        loads += [(f"{c} callers", c, 0.0) for c in args.callers]

        async def every_round() -> dict[tuple[str, str], list[tuple[float, float, float]]]:
            # one event loop for all: grpc.aio binds its completion-queue poller to the first
            results: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
            for _ in range(args.rounds):
                for label, callers, gap in loads:
                    each = max(1, (args.requests // 4 if gap else args.requests) // callers)
                    for transport in args.transports:
                        lat, cpu = await measure(
                            transport, address, worker.pid, callers, each, gap, args.max_inflight_frames
                        )
                        row = (statistics.median(lat), percentile(lat, 0.99), cpu)
                        results.setdefault((label, transport), []).append(row)
            return results

        results = uvloop.run(every_round())
        print(f"step {args.step_ms} ms\n")
        print("| load | transport | p50 µs | p99 µs | worker CPU µs/request |\n|---|---|---:|---:|---:|")
        for (label, transport), rounds in results.items():
            cells = [cell([r[column] for r in rounds], "{:.0f}") for column in range(3)]
            print(table_row(label, transport, *cells))
    finally:
        worker.terminate()
        worker.wait(20)
        if "Traceback" in log.read_text():
            print(log.read_text()[-2000:])


if __name__ == "__main__":
    main()
