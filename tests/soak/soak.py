"""`make soak`: does memory level off under steady load? Minutes long; not part of `make test`.

Starts a real worker (CPU unless --device says otherwise, the bundled all-MiniLM-L6-v2) and a real
gateway on free localhost ports, drives them with steady mixed load from --clients concurrent clients
(OpenAI and TEI embeddings of 1-64 texts of 1-400 words, so batches of many different shapes, and
/tokenize; with --rerank also /rerank against a second worker and gateway serving a tiny random
cross-encoder), samples each process's RSS (with its children's) every --sample-s seconds and prints a
table. Judgement: after --warmup-s, every later sample must stay within --tolerance (10 %) of the
level at the end of the warm-up (the median of the samples in its last minute, or last half); exit 1 if
not, 2 if more than 0.1 % of requests failed (a 429, the gateway refusing what it cannot serve in
time, is counted apart: the client backs off for its Retry-After and goes on).

--probe-dir DIR runs the worker under tests/soak/probe_worker.py, which records glibc's heap
accounting (and, with --tracemalloc, Python's allocations and snapshots) there, and trims the heap
once at the end. --worker-env KEY=VALUE (repeatable) sets the worker's environment, e.g.
MALLOC_ARENA_MAX=2, to compare allocator settings.
"""

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
MIB = 1024 * 1024
# fmt: off
_WORDS = (
    "search", "retrieval", "embedding", "vector", "query", "document", "ranking", "latency",
    "throughput", "gateway", "worker", "token", "batch", "model", "neural", "network", "semantic",
    "similarity", "cosine", "index", "shard", "replica", "kubernetes", "the", "of", "and", "a", "to",
    "in", "is", "that", "it", "for", "on", "with", "as", "was", "by", "be", "this", "are", "or", "from",
    "at", "an", "naïve", "café", "東京", "☕", "1234", "3.14",
)
# fmt: on
BATCH_SIZES = (1, 1, 1, 2, 3, 4, 5, 8, 12, 16, 24, 32, 48, 64)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_bytes(pid: int) -> int:
    """VmRSS of `pid` plus its descendants' (a gateway may run several processes); 0 once gone."""
    total = 0
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as children:
                total += sum(rss_bytes(int(child)) for child in children.read().split())
    except (FileNotFoundError, ProcessLookupError):
        pass
    return total


@dataclass
class Service:
    name: str
    popen: subprocess.Popen
    log: Path

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(20)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)


def spawn(name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None) -> Service:
    log = log_dir / f"{name}.log"
    with log.open("w") as out:
        popen = subprocess.Popen(
            [sys.executable, "-P", *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )
    return Service(name, popen, log)


def start_stack(
    label: str, args: argparse.Namespace, log_dir: Path, model: Path | None
) -> tuple[str, list[Service]]:
    """One worker and one gateway on the same model; returns the gateway's URL once it is ready."""
    worker_port = free_port()
    worker_args = ["--port", str(worker_port), "--metrics-port", str(free_port()), "--device", args.device]
    if model is not None:
        worker_args += ["--model", str(model)]
    env = dict(item.split("=", 1) for item in args.worker_env)
    if args.probe_dir and model is None:
        env |= {
            "KEMBED_SOAK_PROBE_DIR": str(Path(args.probe_dir).resolve()),
            "KEMBED_SOAK_PROBE_S": str(args.probe_s),
            "KEMBED_SOAK_TRACEMALLOC": "1" if args.tracemalloc else "0",
        }
        worker = spawn(f"{label}-worker", [str(HERE / "probe_worker.py"), *worker_args], log_dir, env)
    else:
        worker = spawn(f"{label}-worker", ["-m", "kembed.worker", *worker_args], log_dir, env)
    gateway_port = free_port()
    gateway_args = [
        "-m",
        "kembed.gateway",
        "--port",
        str(gateway_port),
        "--worker",
        f"127.0.0.1:{worker_port}",
    ]
    if model is not None:
        gateway_args += ["--model", str(model)]
    gateway = spawn(f"{label}-gateway", gateway_args, log_dir)
    services = [worker, gateway]
    url = f"http://127.0.0.1:{gateway_port}"
    ready_s = 900 if args.tracemalloc else 180  # tracing every allocation slows torch's import and load
    deadline = time.monotonic() + ready_s
    while time.monotonic() < deadline:
        for service in services:
            if service.popen.poll() is not None:
                for other in services:
                    other.stop()
                sys.exit(f"{service.name} exited with {service.popen.returncode}:\n{service.log.read_text()}")
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return url, services
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    for service in services:
        service.stop()
    sys.exit(f"{label} stack not ready after {ready_s} s; logs in {log_dir}")


def cross_encoder_dir(target: Path) -> Path:
    """A random tiny BertForSequenceClassification with the bundled tokenizer (as the e2e rerank test)."""
    import shutil

    import torch
    import transformers

    from kembed.worker.config import bundled_model_dir

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=128, max_position_embeddings=512, num_labels=1,
    )  # fmt: skip
    transformers.BertForSequenceClassification(config).eval().save_pretrained(target)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(bundled_model_dir() / name, target / name)
    return target


@dataclass
class Tally:
    requests: Counter = field(default_factory=Counter)  # by kind
    statuses: Counter = field(default_factory=Counter)  # by status code, or "transport"
    texts: int = 0
    failures: list[str] = field(default_factory=list)  # the first few, for the report

    def failed(self) -> int:
        """Errors: transport failures and error statuses, except 429 (refused at once under load)."""
        return sum(
            n
            for status, n in self.statuses.items()
            if status == "transport" or (status >= 400 and status != 429)
        )


def text(rng: random.Random) -> str:
    # Mostly short and medium, a quarter past the model's 256-token limit (truncated): many lengths.
    n = rng.choice((rng.randint(1, 20), rng.randint(1, 80), rng.randint(20, 200), rng.randint(150, 400)))
    return " ".join(rng.choice(_WORDS) for _ in range(n))


async def client(
    index: int, http: httpx.AsyncClient, urls: dict[str, str], stop_at: float, tally: Tally
) -> None:
    rng = random.Random(index)
    kinds = ["openai"] * 6 + ["embed"] * 2 + ["tokenize"] + (["rerank"] * 2 if "rerank" in urls else [])
    while time.monotonic() < stop_at:
        kind = rng.choice(kinds)
        texts = [text(rng) for _ in range(rng.choice(BATCH_SIZES))]
        if kind == "openai":
            url = f"{urls['embed']}/v1/embeddings"
            body = {"input": texts, "encoding_format": rng.choice(("float", "base64"))}
        elif kind == "embed":
            url, body = f"{urls['embed']}/embed", {"inputs": texts, "truncate": True}
        elif kind == "tokenize":
            url, body = f"{urls['embed']}/tokenize", {"inputs": texts[:8]}
        else:
            url, body = f"{urls['rerank']}/rerank", {"query": text(rng), "texts": texts, "truncate": True}
        try:
            response = await http.post(url, json=body)
            status: int | str = response.status_code
            if status == 429:  # the gateway's admission: back off as a client should, not a failure
                await asyncio.sleep(min(5.0, float(response.headers.get("retry-after", 1))))
            elif status >= 400 and len(tally.failures) < 5:
                tally.failures.append(f"{kind} {status}: {response.text[:200]}")
        except httpx.HTTPError as exc:
            status = "transport"
            if len(tally.failures) < 5:
                tally.failures.append(f"{kind}: {exc!r}")
        tally.requests[kind] += 1
        tally.statuses[status] += 1
        tally.texts += len(texts)


async def sample(
    services: list[Service], stop_at: float, every_s: float, rows: list[tuple], tally: Tally
) -> None:
    started = time.monotonic()
    while True:
        now = time.monotonic()
        rows.append(
            (now - started, sum(tally.requests.values()), *(rss_bytes(s.popen.pid) for s in services))
        )
        print(
            f"{rows[-1][0]:7.0f} s {rows[-1][1]:8d} req  "
            + "  ".join(
                f"{s.name} {rss / MIB:7.1f} MiB" for s, rss in zip(services, rows[-1][2:], strict=True)
            ),
            flush=True,
        )
        if now >= stop_at:
            return
        await asyncio.sleep(min(every_s, max(0.0, stop_at - time.monotonic())))


async def drive(
    args: argparse.Namespace, urls: dict[str, str], services: list[Service]
) -> tuple[list, Tally]:
    tally = Tally()
    rows: list[tuple] = []
    stop_at = time.monotonic() + args.duration_s
    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        await asyncio.gather(
            sample(services, stop_at, args.sample_s, rows, tally),
            *(client(i, http, urls, stop_at, tally) for i in range(args.clients)),
        )
    return rows, tally


def judge(name: str, rows: list[tuple], column: int, args: argparse.Namespace) -> bool:
    """Within tolerance of the level at the warm-up's end, from then on?"""
    tail = [r for r in rows if max(args.warmup_s - 60, args.warmup_s / 2) <= r[0] <= args.warmup_s] or rows[
        :1
    ]
    after = [r for r in rows if r[0] > args.warmup_s]
    start, level = rows[0][2 + column], statistics.median(r[2 + column] for r in tail)
    if not after:
        print(f"{name}: no samples after the {args.warmup_s:.0f} s warm-up; nothing to judge")
        return False
    top, end = max(r[2 + column] for r in after), after[-1][2 + column]
    # the growth rate over the second half of what follows the warm-up (MiB per 10 minutes)
    half = after[len(after) // 2 :]
    rate = 0.0
    if len(half) >= 2 and half[-1][0] > half[0][0]:
        rate = (half[-1][2 + column] - half[0][2 + column]) / (half[-1][0] - half[0][0]) * 600 / MIB
    is_flat = top <= level * (1 + args.tolerance)
    print(
        f"{name}: start {start / MIB:.0f} MiB, after warm-up {level / MIB:.0f}, end {end / MIB:.0f}, "
        f"max {top / MIB:.0f} ({(top / level - 1) * 100:+.1f} % over the warm-up level), "
        f"late slope {rate:+.1f} MiB/10 min: {'plateau' if is_flat else 'GROWING'}"
    )
    return is_flat


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration-s", type=float, default=900, help="load time, warm-up included (900)")
    parser.add_argument("--warmup-s", type=float, default=240, help="not judged (240)")
    parser.add_argument("--sample-s", type=float, default=10, help="RSS sampling period (10)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients (4)")
    parser.add_argument("--tolerance", type=float, default=0.10, help="allowed rise over the warm-up level")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rerank", action="store_true", help="add /rerank on a tiny cross-encoder stack")
    parser.add_argument("--worker-env", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--probe-dir", help="run the worker under probe_worker.py, writing here")
    parser.add_argument("--probe-s", type=float, default=30, help="probe period (30)")
    parser.add_argument(
        "--tracemalloc", action="store_true", help="with --probe-dir: trace Python allocations"
    )
    parser.add_argument("--log-dir", help="service logs (default: a temporary directory)")
    parser.add_argument("--csv", help="write the samples here")
    args = parser.parse_args()
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="kembed-soak-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    services: list[Service] = []
    try:
        url, started = start_stack("embed", args, log_dir, None)
        services += started
        urls = {"embed": url}
        if args.rerank:
            url, started = start_stack("rerank", args, log_dir, cross_encoder_dir(log_dir / "cross-encoder"))
            services += started
            urls["rerank"] = url
        print(f"soak: {args.duration_s:.0f} s, {args.clients} clients, logs in {log_dir}", flush=True)
        rows, tally = asyncio.run(drive(args, urls, services))
        if args.probe_dir:  # what a heap trim gives back: free memory glibc held, not live objects
            (Path(args.probe_dir) / "trim").touch()
            time.sleep(args.probe_s + 2)
    finally:
        for service in reversed(services):
            service.stop()
    if args.csv:
        with open(args.csv, "w") as out:
            out.write(",".join(["seconds", "requests", *(f"{s.name}_rss_bytes" for s in services)]) + "\n")
            out.writelines(",".join(f"{v:.0f}" for v in row) + "\n" for row in rows)
    total = sum(tally.requests.values())
    print(
        f"\nrequests {total} ({dict(tally.requests)}), texts {tally.texts}, "
        f"statuses {dict(tally.statuses)}, failed {tally.failed()}"
    )
    for failure in tally.failures:
        print("  " + failure)
    flat = [judge(s.name, rows, i, args) for i, s in enumerate(services)]
    if args.probe_dir and (probe := Path(args.probe_dir) / "probe.jsonl").exists():
        for record in map(json.loads, probe.read_text().splitlines()):
            if "rss_after_trim" in record:
                print(
                    f"worker heap trim at the end: {record['rss_before_trim'] / MIB:.0f} -> "
                    f"{record['rss_after_trim'] / MIB:.0f} MiB"
                )
    if tally.failed() > total / 1000:
        sys.exit(2)
    if not all(flat):
        sys.exit(1)


if __name__ == "__main__":
    main()
