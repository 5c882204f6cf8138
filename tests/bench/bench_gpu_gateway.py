"""Suite 4 on a GPU: 1-16 concurrent single-query clients through the real gateway and worker processes.

Tokenization, JSON, HTTP and the gRPC hop included: each client posts one short query at a time to
/v1/embeddings (base64, as the OpenAI SDK does) and waits for it; latency is measured at the client.
The worker serves a model built from a real config with random weights (`--model-config`); the
gateway tokenizes with the tokenizer directory given (`--tokenizer`; ids stay inside any larger
vocabulary). Buckets the traffic hits are prewarmed first, as the operator's prewarm Job does.
Prints a markdown table. A benchmark, not a test.
"""

import argparse
import asyncio
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gpu import write_model_dir

WORDS = [
    "what",
    "is",
    "the",
    "fastest",
    "way",
    "to",
    "serve",
    "text",
    "embeddings",
    "for",
    "semantic",
    "search",
    "at",
    "scale",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spawn(args: list[str], log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen([sys.executable, "-P", "-m", *args], stdout=out, stderr=subprocess.STDOUT)


async def wait_ready(url: str, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(f"{url}/ready") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.5)
    raise SystemExit(f"{url} not ready after {timeout_s}s")


async def clients(url: str, concurrency: int, requests_each: int) -> list[float]:
    latencies: list[float] = []

    async def client(index: int, session: aiohttp.ClientSession) -> None:
        for i in range(requests_each):
            query = " ".join(WORDS[(index + i + k) % len(WORDS)] for k in range(12))
            started = time.perf_counter()
            async with session.post(
                f"{url}/v1/embeddings", json={"input": query, "encoding_format": "base64"}
            ) as response:
                await response.read()
                if response.status != 200:
                    raise SystemExit(f"status {response.status}")
            latencies.append((time.perf_counter() - started) * 1e3)

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(client(c, session) for c in range(concurrency)))
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-config", default="bge-m3")
    parser.add_argument("--tokenizer", type=Path, required=True, help="directory with tokenizer.json")
    parser.add_argument("--requests", type=int, default=200, help="per client")
    parser.add_argument("--max-batch-tokens", type=int, default=2048)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp())
    path, model = write_model_dir(args.model_config, tmp)
    del model
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (args.tokenizer / name).exists():
            shutil.copy(args.tokenizer / name, path / name)
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 512}))
    worker_port, gateway_port = free_port(), free_port()
    worker = spawn(
        [
            "kembed.worker",
            "--model",
            str(path),
            "--device",
            "cuda",
            "--dtype",
            "bfloat16",
            "--port",
            str(worker_port),
            "--max-batch-tokens",
            str(args.max_batch_tokens),
        ],
        tmp / "worker.log",
    )
    gateway = spawn(
        [
            "kembed.gateway",
            "--model",
            str(path),
            "--worker",
            f"127.0.0.1:{worker_port}",
            "--port",
            str(gateway_port),
            "--log-level",
            "warning",
        ],
        tmp / "gateway.log",
    )
    url = f"http://127.0.0.1:{gateway_port}"
    try:
        asyncio.run(wait_ready(url))
        buckets = ",".join(f"{s}x{t}" for s in (1, 2, 4, 8, 16) for t in (64, 128, 256) if s * 2 <= t)
        prewarm = subprocess.run(
            [
                sys.executable,
                "-P",
                "-m",
                "kembed.worker",
                "prewarm",
                "--target",
                f"127.0.0.1:{worker_port}",
                "--buckets",
                buckets,
            ],
            capture_output=True,
            text=True,
        )
        print(prewarm.stdout.strip(), prewarm.stderr.strip()[-300:], flush=True)
        asyncio.run(clients(url, 4, 50))  # warm-up: connections, any bucket prewarm missed
        rows = []
        for concurrency in (1, 2, 4, 8, 16):
            latencies = sorted(asyncio.run(clients(url, concurrency, args.requests)))
            p50 = statistics.median(latencies)
            p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
            rows.append(f"| {concurrency} | {p50:.2f} | {p99:.2f} | {len(latencies)} |")
            print(rows[-1], flush=True)
        print("\n| concurrent clients | p50 ms | p99 ms | requests |\n|---:|---:|---:|---:|")
        print("\n".join(rows))
    finally:
        for proc in (gateway, worker):
            proc.terminate()
            proc.wait(20)
        for log in ("worker.log", "gateway.log"):
            text = (tmp / log).read_text()
            if "Traceback" in text:
                print(f"--- {log}\n{text[-3000:]}")


if __name__ == "__main__":
    main()
