"""The online suite: short queries end to end on one GPU worker, against the engine's own pace.

`python -P tests/bench/bench_online.py` on a CUDA machine (`make gpu-check` runs it). First the
engine alone, in this process: one step of N 12-word queries (~16 tokens each), timed from an idle
GPU to the rows on the host, for N in `--engine-batches` (3 interleaved rounds after a warm-up) ->
the engine's queries/s at each batch size. Then a real worker process on the GPU (BGE-M3 shape by
default: its real config, random weights, bf16) and a real gateway with `--processes P`, driven by
the load generator (loadgen.py: keep-alive HTTP/1.1 clients in processes of their own, exact
per-request timestamps) posting one query per request to /v1/embeddings (base64, as the OpenAI
SDK asks), 512 distinct queries in turn. For each P and each number of clients: requests/s, p50,
p99 and p99.9 (from every request's own time), the CPU per request of the gateway (all its
processes), the worker and the load generator, the mean batch the worker formed (its
kembed_worker_batch_sequences histogram over the run), the engine's queries/s at that batch size
(interpolated between the sizes timed) and the ratio of the two: the headline. Each row is
`--rounds` runs, the median and the worst in brackets. A benchmark, not a test.
"""

import argparse
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
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loadgen
from timing import cell as rounds_cell

from kembed.worker.config import bundled_model_dir

# A vocabulary for 12-word queries: search-like English, so each query tokenizes to ~14-16 tokens.
WORDS = ["what", "is", "the", "fastest", "way", "to", "serve", "text", "embeddings", "for", "semantic",
         "search", "at", "scale", "how", "do", "vector", "databases", "index", "dense", "and", "sparse",
         "representations", "which", "model", "ranks", "passages", "best", "when", "users", "ask", "short",
         "questions", "about", "cities", "rivers", "history", "science", "music", "sports", "cooking",
         "travel", "weather"]  # fmt: skip


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def queries(count: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, 12)) for _ in range(count)]


def spawn(args: list[str], log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-P", "-m", *args], stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def wait_ready(url: str, procs: dict[Path, subprocess.Popen], timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for log, proc in procs.items():
            if proc.poll() is not None:
                raise SystemExit(f"{log.name} exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{url} not ready after {timeout_s:.0f} s")


def stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def model_dir(config: str, tokenizer: Path, tmp: Path) -> Path:
    from bench_gpu import write_model_dir

    path, model = write_model_dir(config, tmp)
    del model
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tokenizer / name).exists():
            shutil.copy(tokenizer / name, path / name)
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 512}))
    return path


def engine_rates(
    path: Path, device: str, texts: list[str], batches: list[int], rounds: int, iters: int
) -> dict[int, list[float]]:
    """queries/s of one engine step per batch size, one value per round (rounds interleaved)."""
    import torch
    from tokenizers import Tokenizer

    from kembed.worker.config import WorkerConfig
    from kembed.worker.engine import load_engine

    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.no_padding()  # the bundled tokenizer.json pads to 128: the gateway clears it too
    tokenizer.no_truncation()
    seqs = [np.asarray(e.ids, np.int64) for e in tokenizer.encode_batch(texts)]
    dtype = "bfloat16" if device == "cuda" else "float32"
    engine = load_engine(WorkerConfig(model=path, device=device, dtype=dtype, max_batch_tokens=4096))
    chosen = {n: [seqs[i % len(seqs)] for i in range(n)] for n in batches}
    for picked in chosen.values():  # capture each batch's bucket, then warm it
        ids = np.concatenate(picked).astype(np.int32)
        engine.prewarm([engine.pack(ids, np.array([len(s) for s in picked], np.int32)).bucket])
        time_engine(engine, picked, 20)
    rates: dict[int, list[float]] = {n: [] for n in batches}
    for _ in range(rounds):
        for n, picked in chosen.items():
            ms = statistics.median(time_engine(engine, picked, iters))
            rates[n].append(n / ms * 1e3)
    mean = np.mean([len(s) for s in seqs])
    info = engine.info
    print(f"engine: {info.device}, attention {info.attention_backend}, mean query {mean:.1f} tokens")
    del engine
    if device == "cuda":
        torch.cuda.empty_cache()
    return rates


def time_engine(engine, seqs: list[np.ndarray], iters: int) -> list[float]:
    """Milliseconds of each of `iters` steps, each from an idle device to its rows on the host."""
    ids, lengths = np.concatenate(seqs).astype(np.int32), np.array([len(s) for s in seqs], np.int32)
    out = []
    for _ in range(iters):
        started = time.perf_counter()
        engine.step(engine.pack(ids, lengths)).wait()
        out.append((time.perf_counter() - started) * 1e3)
    return out


def engine_rate_at(rates: dict[int, float], batch: float) -> float:
    """The engine's queries/s at a (mean) batch size, log-linear between the sizes timed."""
    sizes = sorted(rates)
    if batch <= sizes[0]:
        return rates[sizes[0]] * batch / sizes[0]  # below the smallest: a step costs at least as much
    return float(np.interp(np.log(batch), np.log(sizes), [rates[s] for s in sizes]))


COUNTS = (
    "kembed_worker_batch_sequences_sum",  # sequences in the batches launched
    "kembed_worker_batch_sequences_count",  # batches launched
    "kembed_worker_admitted_requests_total",
    "kembed_worker_admitted_groups_total",  # frames (of a class) admitted
)


def worker_counts(port: int) -> dict[str, float]:
    """The worker's counts of COUNTS, read from its /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in COUNTS:
            values[name] = float(value)
    return values


def cell(values: list[float], digits: int = 2, is_higher_better: bool = False) -> str:
    return rounds_cell(values, f"{{:.{digits}f}}", is_higher_better)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-config", default="bge-m3")
    parser.add_argument(
        "--device",
        choices=["cuda", "cpu"],
        default="cuda",
        help="cpu: the bundled MiniLM on the CPU (a dry run)",
    )
    parser.add_argument("--tokenizer", type=Path, default=bundled_model_dir())
    parser.add_argument("--gateway-processes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration-s", type=float, default=3.0, help="measured time per run")
    parser.add_argument("--warmup-s", type=float, default=1.0)
    parser.add_argument("--engine-batches", type=int, nargs="+", default=[1, 8, 16, 32, 64, 128])
    parser.add_argument("--engine-iters", type=int, default=50)
    parser.add_argument("--no-engine", action="store_true", help="skip the engine's own timing (no ratio)")
    parser.add_argument("--loadgen-processes", type=int, help="default: loadgen's own rule")
    parser.add_argument("--gateway-arg", action="append", default=[], help="extra gateway flag (repeat)")
    parser.add_argument("--worker-arg", action="append", default=[], help="extra worker flag (repeat)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kembed-online-"))
    path = model_dir(args.model_config, args.tokenizer, tmp) if args.device == "cuda" else args.tokenizer
    texts = queries(512)
    bodies = [json.dumps({"input": text, "encoding_format": "base64"}).encode() for text in texts]
    median_rates = {1: float("nan")}
    if not args.no_engine:
        rates = engine_rates(path, args.device, texts, args.engine_batches, args.rounds, args.engine_iters)
        print("\n| queries a step | engine queries/s |\n|---:|---:|")
        for n, values in rates.items():
            print(f"| {n} | {cell(values, 0, is_higher_better=True)} |")
        median_rates = {n: statistics.median(v) for n, v in rates.items()}
    worker_port, metrics_port = free_port(), free_port()
    worker = spawn(
        ["kembed.worker", "--model", str(path), "--device", args.device,
         "--dtype", "bfloat16" if args.device == "cuda" else "float32",
         "--port", str(worker_port), "--metrics-port", str(metrics_port), "--log-level", "WARNING",
         *args.worker_arg],
        tmp / "worker.log",
    )  # fmt: skip
    gateway = None
    rows = []
    try:
        for processes in args.gateway_processes:
            port = free_port()
            gateway = spawn(
                ["kembed.gateway", "--model", str(path), "--worker", f"127.0.0.1:{worker_port}",
                 "--port", str(port), "--processes", str(processes), "--log-level", "warning",
                 *args.gateway_arg],
                tmp / f"gateway-{processes}.log",
            )  # fmt: skip
            logs = {tmp / "worker.log": worker, tmp / f"gateway-{processes}.log": gateway}
            wait_ready(f"http://127.0.0.1:{port}/ready", logs)
            loadgen.run(port, bodies, connections=64, warmup_s=1.0, duration_s=2.0)  # warm: connections, code
            time.sleep(1.0)  # what the warm-up left in flight is answered before the first run
            for clients in args.clients:
                runs, batches, frames = [], [], []
                for _ in range(args.rounds):
                    before = worker_counts(metrics_port)
                    runs.append(
                        loadgen.run(
                            port, bodies, connections=clients, processes=args.loadgen_processes,
                            warmup_s=args.warmup_s, duration_s=args.duration_s,
                            groups={"gateway": [gateway.pid], "worker": [worker.pid]},
                        )
                    )  # fmt: skip
                    after = worker_counts(metrics_port)
                    delta = {name: after[name] - before[name] for name in COUNTS}
                    batches.append(delta[COUNTS[0]] / max(delta[COUNTS[1]], 1))
                    frames.append(delta[COUNTS[2]] / max(delta[COUNTS[3]], 1))
                    if runs[-1].num_errors:
                        print(f"  {runs[-1].num_errors} errors: {runs[-1].first_error}", flush=True)
                rate = [r.requests_per_s for r in runs]
                batch = statistics.median(batches)
                engine = engine_rate_at(median_rates, batch)
                rows.append(
                    f"| {processes} | {clients} | {cell(rate, 0, is_higher_better=True)} "
                    f"| {cell([r.p50_ms for r in runs])} "
                    f"| {cell([r.p99_ms for r in runs])} | {cell([r.p999_ms for r in runs])} "
                    f"| {cell([r.group_cpu_us['gateway'] for r in runs], 0)} "
                    f"| {cell([r.group_cpu_us['worker'] for r in runs], 0)} "
                    f"| {cell([r.loadgen_cpu_us for r in runs], 0)} | {statistics.median(frames):.1f} "
                    f"| {batch:.1f} | {engine:,.0f} "
                    f"| {statistics.median(rate) / engine:.2f} |"
                )
                print(rows[-1], flush=True)
            stop(gateway)
            gateway = None
        print(
            f"\nEach cell: the median of {args.rounds} runs of {args.duration_s:g} s (the worst in "
            "brackets); CPU in µs per request.\n\n| gateway processes | clients | requests/s | p50 ms "
            "| p99 ms | p99.9 ms | gateway CPU | worker CPU | loadgen CPU | requests a frame | batch formed "
            "| engine queries/s at it | end to end / engine |\n"
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        )
        print("\n".join(rows))
    finally:
        stop(gateway)
        stop(worker)
        for log in tmp.glob("*.log"):
            text = log.read_text()
            if "Traceback" in text or "ERROR" in text:
                print(f"--- {log.name}\n{text[-3000:]}")


if __name__ == "__main__":
    main()
