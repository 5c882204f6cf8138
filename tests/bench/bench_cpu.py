"""`make bench-cpu`: kembed against sentence-transformers on this machine's CPU, measured in one run.

Embeds the same mixed-length texts (5-300 words, many past the model's 256-token limit) three ways,
best of `--rounds` each, the three interleaved so background load hits them alike:
- sentence-transformers `encode(batch_size=32)`: the baseline most users run today (tokenization
  included; it sorts by length to cut padding);
- kembed engine-only: pre-tokenized ids through the worker's scheduler and engine in-process, as
  requests of 32 texts all submitted at once (no tokenization, no RPC);
- kembed end to end: real gateway and worker processes, `--concurrency` HTTP clients each posting
  requests of 32 texts to /v1/embeddings with base64 output (the OpenAI SDK's default).
Every kembed result is checked against the baseline (cosine >= 0.999 per row) before it is reported.
The table replaces the CPU section of docs/benchmarks.md. A benchmark, not a test: nothing asserts speed.
"""

import argparse
import asyncio
import base64
import datetime
import platform
import re
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import sentence_transformers
import torch
from tokenizers import Tokenizer

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "e2e"))
from corpus import mixed_lengths  # noqa: E402
from processes import start_stack  # noqa: E402

from kembed.worker.config import WorkerConfig, bundled_model_dir  # noqa: E402
from kembed.worker.engine import load_engine  # noqa: E402
from kembed.worker.scheduling.scheduler import Scheduler  # noqa: E402

BATCH = 32
START, END = "<!-- bench-cpu:start -->", "<!-- bench-cpu:end -->"


def run_sentence_transformers(model, texts: list[str]) -> tuple[float, np.ndarray]:
    started = time.perf_counter()
    vectors = model.encode(texts, batch_size=BATCH)
    return time.perf_counter() - started, vectors


def tokenize(texts: list[str]) -> list[np.ndarray]:
    """The gateway's tokenization (sentence-transformers' rules for this model: strip, cut at 256)."""
    tokenizer = Tokenizer.from_file(str(bundled_model_dir() / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(256)
    return [np.array(e.ids, np.int32) for e in tokenizer.encode_batch([t.strip() for t in texts])]


async def run_engine(engine, ids: list[np.ndarray], max_batch_tokens: int) -> tuple[float, np.ndarray]:
    scheduler = Scheduler(engine, max_batch_tokens=max_batch_tokens, max_queued_tokens=1 << 30)
    scheduler.start()
    try:
        started = time.perf_counter()
        parts = await asyncio.gather(
            *(
                scheduler.submit(
                    np.concatenate(ids[i : i + BATCH]),
                    np.array([len(x) for x in ids[i : i + BATCH]], np.int32),
                )
                for i in range(0, len(ids), BATCH)
            )
        )
        elapsed = time.perf_counter() - started
    finally:
        await scheduler.close()
    vectors = np.concatenate(parts)
    return elapsed, vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


async def run_end_to_end(url: str, texts: list[str], concurrency: int) -> tuple[float, np.ndarray]:
    batches = [list(range(i, min(i + BATCH, len(texts)))) for i in range(0, len(texts), BATCH)]
    vectors = np.zeros((len(texts), 384), np.float32)
    queue: asyncio.Queue = asyncio.Queue()
    for batch in batches:
        queue.put_nowait(batch)

    async def client_loop(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            batch = queue.get_nowait()
            response = await client.post(
                "/v1/embeddings", json={"input": [texts[i] for i in batch], "encoding_format": "base64"}
            )
            response.raise_for_status()
            for i, item in zip(batch, response.json()["data"], strict=True):
                vectors[i] = np.frombuffer(base64.b64decode(item["embedding"]), "<f4")

    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        started = time.perf_counter()
        await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
        return time.perf_counter() - started, vectors


def check(name: str, got: np.ndarray, expected: np.ndarray) -> float:
    cosine = float(((got * expected).sum(1) / np.linalg.norm(got, axis=1)).min())
    if cosine < 0.999:
        raise SystemExit(f"{name}: min cosine {cosine} < 0.999 against sentence-transformers")
    return cosine


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--texts", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-batch-tokens", type=int, default=WorkerConfig.max_batch_tokens)
    parser.add_argument("--out", type=Path, default=None, help="markdown file whose CPU section to replace")
    args = parser.parse_args()

    texts = mixed_lengths(args.texts, seed=0)
    model = sentence_transformers.SentenceTransformer(str(bundled_model_dir()), device="cpu")
    ids = tokenize(texts)
    num_tokens = sum(len(x) for x in ids)
    engine = load_engine(WorkerConfig(model=bundled_model_dir(), device="cpu"))
    model.encode(texts[:64], batch_size=BATCH)  # warm both up: first calls pay one-time costs
    asyncio.run(run_engine(engine, ids[:64], args.max_batch_tokens))

    log_dir = Path("/tmp/kembed-bench-logs")
    log_dir.mkdir(exist_ok=True)
    stack = start_stack(log_dir, num_workers=1)
    best = {"st": float("inf"), "engine": float("inf"), "e2e": float("inf")}
    cosines = {}
    try:
        asyncio.run(run_end_to_end(stack.url, texts[:64], args.concurrency))
        for round_ in range(args.rounds):
            seconds, expected = run_sentence_transformers(model, texts)
            best["st"] = min(best["st"], seconds)
            seconds, got = asyncio.run(run_engine(engine, ids, args.max_batch_tokens))
            best["engine"] = min(best["engine"], seconds)
            cosines["engine"] = check("engine", got, expected)
            seconds, got = asyncio.run(run_end_to_end(stack.url, texts, args.concurrency))
            best["e2e"] = min(best["e2e"], seconds)
            cosines["e2e"] = check("end to end", got, expected)
            print(f"round {round_ + 1}: " + ", ".join(f"{k} {v:.2f}s" for k, v in best.items()), flush=True)
    finally:
        for proc in stack.processes:
            proc.stop()

    rows = [
        ("sentence-transformers `encode` (baseline)", best["st"], "—", 1.0),
        (
            "kembed engine-only (scheduler + engine, in-process)",
            best["engine"],
            cosines["engine"],
            best["st"] / best["engine"],
        ),
        (
            f"kembed end to end (HTTP → gateway → gRPC → worker, {args.concurrency} clients)",
            best["e2e"],
            cosines["e2e"],
            best["st"] / best["e2e"],
        ),
    ]
    table = [
        f"Measured {datetime.date.today()} by `make bench-cpu` on {cpu_name()} ({torch.get_num_threads()} "
        f"threads), torch {torch.__version__}, sentence-transformers {sentence_transformers.__version__}; "
        f"{args.texts} texts of 5-300 words ({num_tokens} tokens after truncation to 256), "
        f"requests of {BATCH} texts, max_batch_tokens {args.max_batch_tokens}, best of {args.rounds} rounds.",
        "",
        "| path | seconds | texts/s | tokens/s | × sentence-transformers | min cosine vs baseline |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, seconds, cosine, ratio in rows:
        cos = cosine if isinstance(cosine, str) else f"{cosine:.5f}"
        table.append(
            f"| {name} | {seconds:.2f} | {args.texts / seconds:.0f} | {num_tokens / seconds:.0f} "
            f"| {ratio:.2f} | {cos} |"
        )
    section = "\n".join(table)
    print(section)
    if args.out is not None:
        write_section(args.out, section)


def write_section(path: Path, section: str) -> None:
    block = f"{START}\n{section}\n{END}"
    text = (
        path.read_text() if path.exists() else "# Benchmarks\n\n## CPU (`make bench-cpu`)\n\n" + block + "\n"
    )
    if START in text:
        text = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: block, text, flags=re.S)
    path.write_text(text)


if __name__ == "__main__":
    main()
