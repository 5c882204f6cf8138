"""fp8 linears (`--linear-dtype fp8`) against bf16 on a GPU, speed and accuracy side by side.
`python3 -P tests/bench/bench_fp8.py` (about 3 minutes on an H200).

- accuracy: the bundled all-MiniLM-L6-v2 (real weights; tests/worker/real_minilm.py finds it or its
  carried float16 copy) over the e2e tests' 240 texts, bf16 and fp8 engines against transformers in
  float32: min and mean cosine per row;
- throughput: BGE-M3 and Qwen3-0.6B shapes (random weights, tests/bench/configs), batches of 100
  sequences of 32-512 tokens from 4 concurrent clients through the scheduler (bench_gpu.py's
  throughput suite, budget 8192), bf16 and fp8 interleaved over `--rounds` rounds after two warm-up
  passes: the median round and the worst, in Mtok/s, and the fp8 rows' min cosine against bf16's;
- latency: one sequence of 128 and of 512 tokens, a whole engine step (graph prewarmed), p50/p99.
Prints markdown.
"""

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from kembed.worker.config import WorkerConfig
from kembed.worker.engine import load_engine

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "worker")]  # `python -P` adds neither
from bench_gpu import cos_min, run_clients, time_engine, write_model_dir  # noqa: E402
from real_minilm import CARRY_HINT, float32_rows, real_minilm_dir, tokenized_corpus  # noqa: E402
from timing import environment, p50_p99  # noqa: E402

LINEAR_DTYPES = ("auto", "fp8")  # auto: bf16, the model's dtype
LABELS = {"auto": "bf16", "fp8": "fp8"}


def build(path: Path, linear_dtype: str, backend: str, **overrides: object):
    return load_engine(
        WorkerConfig(
            model=path,
            device="cuda",
            dtype="bfloat16",
            linear_dtype=linear_dtype,
            attention_backend=backend,
            max_batch_tokens=16384,
            **overrides,  # type: ignore[arg-type]
        )
    )


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def suite_accuracy(backend: str) -> list[str]:
    path = real_minilm_dir()
    if path is None:
        raise SystemExit(CARRY_HINT)
    print(f"accuracy: {path}", flush=True)
    seqs = tokenized_corpus(path)
    reference = float32_rows(path, seqs, "cuda")
    rows = []
    for linear_dtype in LINEAR_DTYPES:
        engine = build(path, linear_dtype, backend, cuda_graphs=False)
        got = []
        for i in range(0, len(seqs), 16):
            batch = seqs[i : i + 16]
            lengths = np.array([len(s) for s in batch], np.int32)
            got.append(engine.step(engine.pack(np.concatenate(batch), lengths)).wait())
        cos = cosines(np.concatenate(got), reference)
        rows.append(
            f"| all-MiniLM-L6-v2 (real) | {LABELS[linear_dtype]} | {len(seqs)} | {cos.min():.5f} "
            f"| {cos.mean():.5f} | {(cos < 0.999).sum()} |"
        )
        del engine
    return rows


def suite_throughput(name: str, engines: dict, rng: np.random.Generator, args) -> list[str]:
    vocab = engines["auto"].info.vocab_size
    batches = [
        [rng.integers(5, vocab, rng.integers(32, 513)).astype(np.int32) for _ in range(100)]
        for _ in range(args.batches)
    ]
    num_tokens = sum(len(s) for b in batches for s in b)
    rates: dict[str, list[float]] = {d: [] for d in LINEAR_DTYPES}
    outs: dict[str, list[np.ndarray]] = {}
    for linear_dtype, engine in engines.items():  # warm-up: the buckets these batches hit, captured
        print(f"  throughput {name} {LABELS[linear_dtype]}: warm-up", flush=True)
        for _ in range(2):
            asyncio.run(run_clients(engine, batches, 8192))
    for round_index in range(args.rounds):
        for linear_dtype, engine in engines.items():
            seconds, outs[linear_dtype] = asyncio.run(run_clients(engine, batches, 8192))
            rates[linear_dtype].append(num_tokens / seconds / 1e6)
            print(f"  round {round_index + 1} {LABELS[linear_dtype]}: {rates[linear_dtype][-1]:.3f} Mtok/s")
    cos = min(cos_min(a, b) for a, b in zip(outs["fp8"], outs["auto"], strict=True))
    bf16, fp8 = statistics.median(rates["auto"]), statistics.median(rates["fp8"])
    return [
        f"| {name} | mixed 32-512 | {bf16:.3f} ({min(rates['auto']):.3f}) | {fp8:.3f} "
        f"({min(rates['fp8']):.3f}) | {fp8 / bf16:.2f}× | {cos:.5f} |"
    ]


def suite_latency(name: str, engines: dict, rng: np.random.Generator, iters: int) -> list[str]:
    rows = []
    vocab = engines["auto"].info.vocab_size
    for tokens in (128, 512):
        seq = rng.integers(5, vocab, tokens).astype(np.int64)
        results = {}
        for linear_dtype, engine in engines.items():
            print(f"  latency {name} 1x{tokens} {LABELS[linear_dtype]}", flush=True)
            engine.prewarm([engine.pack(seq.astype(np.int32), np.array([tokens], np.int32)).bucket])
            results[linear_dtype] = p50_p99(time_engine(engine, [seq], iters))
        (b50, b99), (f50, f99) = results["auto"], results["fp8"]
        rows.append(
            f"| {name} | 1 × {tokens} | {b50:.3f} | {b99:.3f} | {f50:.3f} | {f99:.3f} | {b50 / f50:.2f}× |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["bge-m3", "qwen3-0.6b"])
    parser.add_argument("--backend", default="auto", help="attention backend of every engine")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=30, help="batches of 100 sequences per round")
    parser.add_argument("--iters", type=int, default=200, help="steps per latency figure")
    args = parser.parse_args()
    print(f"{environment('transformers')}\n", flush=True)
    rng = np.random.default_rng(0)
    accuracy = suite_accuracy(args.backend)
    throughput, latency = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            path, baseline = write_model_dir(name, Path(tmp))
            del baseline
            engines = {d: build(path, d, args.backend) for d in LINEAR_DTYPES}
            label = f"{name}, {engines['auto'].info.attention_backend}"
            throughput += suite_throughput(label, engines, rng, args)
            latency += suite_latency(label, engines, rng, args.iters)
            del engines
            torch.cuda.empty_cache()
    print("\n| model | linears | texts | min cos vs fp32 | mean cos | rows below 0.999 |")
    print("|---|---|---:|---:|---:|---:|")
    print("\n".join(accuracy), "\n")
    print(
        "| model, attention | lengths | bf16 Mtok/s median (worst) | fp8 Mtok/s median (worst) "
        "| fp8 / bf16 | fp8 vs bf16 min cos |"
    )
    print("|---|---|---:|---:|---:|---:|")
    print("\n".join(throughput), "\n")
    print("| model, attention | batch | bf16 p50 ms | bf16 p99 ms | fp8 p50 ms | fp8 p99 ms | speed-up |")
    print("|---|---|---:|---:|---:|---:|---:|")
    print("\n".join(latency))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
