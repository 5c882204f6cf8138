"""The gateway→worker hop alone: the gateway's own unary, gRPC-stream and frame clients against a real worker
process whose engine answers at once (standin_worker.py --step-ms 0), one query-sized request (48
token ids in, one 1024-float row out). `python -P tests/bench/bench_worker_hop.py`.

Two loads: one caller with an idle gap between requests (as a lone client: every wake-up is cold)
and 16 concurrent callers back to back. The transports alternate round by round, so drift on
a shared host hits both. Prints p50/p99 µs per transport and load (median over rounds, worst in
brackets). A benchmark, not a test.
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

from kembed.gateway.streams import FrameStream, WorkerStream
from kembed.proto import embedder_pb2 as pb
from kembed.proto.embedder_pb2_grpc import EmbedderStub

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def measure(
    transport: str, address: str, callers: int, requests_each: int, gap_s: float
) -> list[float]:
    ids = np.arange(100, 148, dtype="<i4")
    message = pb.EmbedRequest(batch=pb.TokenBatch(token_ids=ids.tobytes(), lengths=[48]))
    channel = grpc.aio.insecure_channel(address)
    stub = EmbedderStub(channel)
    info = await stub.Info(pb.InfoRequest())
    if transport == "frames":
        stream = FrameStream(address, "127.0.0.1", info.data_port, 64 << 20, 5.0)
    else:
        stream = WorkerStream(stub, address)
    latencies: list[float] = []

    async def call() -> None:
        if transport == "unary":
            await stub.Embed(message, timeout=10.0)
        else:
            await stream.request("embed", message, 10.0)

    async def caller() -> None:
        for _ in range(requests_each):
            started = time.perf_counter()
            await call()
            latencies.append((time.perf_counter() - started) * 1e6)
            if gap_s:
                await asyncio.sleep(gap_s)

    for _ in range(50):  # warm: connection, stream, code paths
        await call()
    await asyncio.gather(*(caller() for _ in range(callers)))
    await stream.close()
    await channel.close()
    return sorted(latencies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=400, help="per caller and round")
    parser.add_argument("--gap-ms", type=float, default=2.5, help="idle gap of the lone caller")
    args = parser.parse_args()
    port = free_port()
    log = Path(tempfile.mkdtemp()) / "worker.log"
    with log.open("w") as out:
        worker = subprocess.Popen(
            [sys.executable, "-P", str(HERE / "standin_worker.py"), "--step-ms", "0", "--port", str(port),
             "--metrics-port", "0", "--model", str(HERE)],  # the stand-in reads no model
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
        loads = (("1 caller, idle gaps", 1, args.gap_ms / 1e3), ("16 callers", 16, 0.0))

        async def every_round() -> dict[tuple[str, str], list[tuple[float, float]]]:
            # one event loop for all: grpc.aio binds its completion-queue poller to the first
            results: dict[tuple[str, str], list[tuple[float, float]]] = {}
            for _ in range(args.rounds):
                for label, callers, gap in loads:
                    for transport in ("unary", "stream", "frames"):
                        lat = await measure(transport, address, callers, args.requests, gap)
                        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
                        results.setdefault((label, transport), []).append((statistics.median(lat), p99))
            return results

        results = uvloop.run(every_round())
        print("| load | transport | p50 µs | p99 µs |\n|---|---|---:|---:|")
        for (label, transport), rounds in results.items():
            p50s, p99s = [r[0] for r in rounds], [r[1] for r in rounds]
            print(
                f"| {label} | {transport} | {statistics.median(p50s):.0f} ({max(p50s):.0f}) "
                f"| {statistics.median(p99s):.0f} ({max(p99s):.0f}) |"
            )
    finally:
        worker.terminate()
        worker.wait(20)
        if "Traceback" in log.read_text():
            print(log.read_text()[-2000:])


if __name__ == "__main__":
    main()
