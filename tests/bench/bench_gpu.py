"""`make bench` on a GPU: kembed's engine against transformers `AutoModel` (sdpa, padded, bf16), same run.

Models are built from real configs (tests/bench/configs/<name>) with random weights: speed does not
depend on their values, and nothing is downloaded. Benchmarks (`--suites`, all by default):
- latency: batch 1 at 128 / 512 / 4096 tokens, p50 and p99 of a whole engine step
  (pack, copy in, graph replay, copy out, wait), graphs prewarmed; cold (first, eager) hit too;
- scoring: a cross-encoder (bge-reranker-v2-m3 shape) over 5 / 25 / 50 query-document
  pairs of 512 tokens, one step; baseline `AutoModelForSequenceClassification` on the same weights;
- throughput: batches of 100 from 4 concurrent clients through the scheduler, fixed 512 and mixed
  32-512 lengths, tokens/s; the baseline runs the same batches padded;
- saturation: one step's latency against the bucket's token count, to set max_batch_tokens.
Every kembed output is checked against the baseline's (cosine >= 0.999 per row). Prints markdown.
"""

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import transformers

from kembed.worker.config import WorkerConfig
from kembed.worker.engine import load_engine
from kembed.worker.scheduler import Scheduler

CONFIGS = Path(__file__).resolve().parent / "configs"
RERANKER = "bge-reranker-v2-m3"
SUITES = ("latency", "scoring", "throughput", "saturation")


def write_model_dir(name: str, tmp: Path):
    """(model directory with random bf16 weights for config `name`, the transformers model itself)."""
    src = CONFIGS / name
    config = transformers.AutoConfig.from_pretrained(src)
    with torch.device("cuda"):
        torch.manual_seed(0)
        model = transformers.AutoModel.from_config(
            config, torch_dtype=torch.bfloat16, attn_implementation="sdpa"
        ).eval()
    path = tmp / name
    model.save_pretrained(path)
    for extra in ("modules.json", "1_Pooling"):
        if (src / extra).is_dir():
            shutil.copytree(src / extra, path / extra)
        elif (src / extra).exists():
            shutil.copy(src / extra, path / extra)
    return path, model


def write_reranker_dir(tmp: Path):
    """(cross-encoder directory with random bf16 weights, the transformers model itself)."""
    config = transformers.AutoConfig.from_pretrained(CONFIGS / RERANKER)
    with torch.device("cuda"):
        torch.manual_seed(0)
        model = transformers.AutoModelForSequenceClassification.from_config(
            config, torch_dtype=torch.bfloat16, attn_implementation="sdpa"
        ).eval()
    path = tmp / RERANKER
    model.save_pretrained(path)
    return path, model


def build(path: Path, backend: str, max_batch_tokens: int = 16384):
    return load_engine(
        WorkerConfig(
            model=path,
            device="cuda",
            dtype="bfloat16",
            max_batch_tokens=max_batch_tokens,
            attention_backend=backend,
        )
    )


def baseline_rows(model, seqs: list[np.ndarray], pooling: str) -> torch.Tensor:
    """transformers on one padded batch, pooled like the model's sentence-transformers config."""
    longest = max(len(s) for s in seqs)
    ids = torch.ones(len(seqs), longest, dtype=torch.int64)
    mask = torch.zeros(len(seqs), longest, dtype=torch.int64)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.from_numpy(s)
        mask[i, : len(s)] = 1
    ids, mask = ids.cuda(), mask.cuda()
    with torch.inference_mode():
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state.float()
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "last":
        return hidden[torch.arange(len(seqs)), mask.sum(1) - 1]
    return (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)


def cos_min(a: np.ndarray, b: np.ndarray) -> float:
    return float(((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))).min())


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def time_engine(engine, seqs, iters: int) -> list[float]:
    ids, lengths = np.concatenate(seqs), np.array([len(s) for s in seqs], np.int32)
    out = []
    for _ in range(iters):
        start = time.perf_counter()
        engine.step(engine.pack(ids, lengths)).wait()
        out.append((time.perf_counter() - start) * 1e3)
    return out


def time_baseline(model, seqs, pooling: str, iters: int) -> list[float]:
    out = []
    for _ in range(iters):
        torch.cuda.synchronize()
        start = time.perf_counter()
        baseline_rows(model, seqs, pooling).cpu()
        out.append((time.perf_counter() - start) * 1e3)
    return out


def suite_latency(name, engine, baseline, rng, iters: int) -> list[str]:
    rows = []
    vocab = engine.info.vocab_size
    for tokens in (128, 512, 4096):
        print(f"  latency {name} 1x{tokens}", flush=True)
        seqs = [rng.integers(5, vocab, tokens).astype(np.int64)]
        cold = time_engine(engine, seqs, 1)[0]  # first hit of this bucket: eager
        engine.prewarm([engine.pack(seqs[0].astype(np.int32), np.array([tokens], np.int32)).bucket])
        ours = time_engine(engine, seqs, iters)
        base = time_baseline(baseline, seqs, engine.info.pooling, max(10, iters // 5))
        got = engine.step(engine.pack(seqs[0].astype(np.int32), np.array([tokens], np.int32))).wait()
        cos = cos_min(got, baseline_rows(baseline, seqs, engine.info.pooling).cpu().numpy())
        (p50, p99), (b50, b99) = percentiles(ours), percentiles(base)
        rows.append(
            f"| {name} | 1 × {tokens} | {p50:.3f} | {p99:.3f} | {cold:.1f} | {b50:.2f} | {b99:.2f} "
            f"| {b50 / p50:.1f}× | {cos:.5f} |"
        )
    return rows


def suite_scoring(engine, baseline, rng, iters: int, label: str) -> list[str]:
    """One step scoring N pairs of 512 tokens (query and document already joined)."""
    rows = []
    for num_docs in (5, 25, 50):
        print(f"  scoring {num_docs} x 512", flush=True)
        seqs = [rng.integers(5, engine.info.vocab_size, 512).astype(np.int64) for _ in range(num_docs)]
        ids = np.concatenate(seqs).astype(np.int32)
        lengths = np.full(num_docs, 512, np.int32)
        cold = time_engine(engine, seqs, 1)[0]
        engine.prewarm([engine.pack(ids, lengths).bucket])
        ours = time_engine(engine, seqs, iters)
        batch = torch.from_numpy(np.stack(seqs)).cuda()
        base = []
        with torch.inference_mode():
            for _ in range(max(10, iters // 5)):
                torch.cuda.synchronize()
                start = time.perf_counter()
                want = baseline(input_ids=batch).logits.float().cpu()
                base.append((time.perf_counter() - start) * 1e3)
        got = engine.step(engine.pack(ids, lengths)).wait()
        diff = float(np.abs(got - want.numpy()).max())
        (p50, p99), (b50, b99) = percentiles(ours), percentiles(base)
        rows.append(
            f"| {label} | {num_docs} × 512 | {p50:.3f} | {p99:.3f} | {cold:.1f} | {b50:.2f} | {b99:.2f} "
            f"| {b50 / p50:.1f}× | {diff:.4f} |"
        )
    return rows


async def run_clients(engine, batches: list, budget: int) -> tuple[float, list[np.ndarray]]:
    """4 concurrent clients submitting the batches (100 sequences each) through one scheduler."""
    scheduler = Scheduler(engine, max_batch_tokens=budget, max_queued_tokens=1 << 30, max_inflight_batches=2)
    scheduler.start()
    queue = list(range(len(batches)))
    results: dict[int, np.ndarray] = {}

    async def client() -> None:
        while queue:
            i = queue.pop()
            lengths = np.array([len(s) for s in batches[i]], np.int32)
            results[i] = await scheduler.submit(np.concatenate(batches[i]), lengths)

    try:
        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(4)))
        return time.perf_counter() - start, [results[i] for i in range(len(batches))]
    finally:
        await scheduler.close()


def suite_throughput(name, engine, baseline, rng, num_batches: int) -> list[str]:
    rows = []
    vocab = engine.info.vocab_size
    for label, low, high in (("fixed 512", 512, 512), ("mixed 32-512", 32, 512)):
        print(f"  throughput {name} {label}", flush=True)
        batches = [
            [rng.integers(5, vocab, rng.integers(low, high + 1)).astype(np.int32) for _ in range(100)]
            for _ in range(num_batches)
        ]
        num_tokens = sum(len(s) for b in batches for s in b)

        asyncio.run(run_clients(engine, batches, 8192))  # first pass captures the buckets it hits
        seconds, outs = asyncio.run(run_clients(engine, batches, 8192))
        torch.cuda.synchronize()
        start = time.perf_counter()
        base_out = [baseline_rows(baseline, b, engine.info.pooling) for b in batches]
        torch.cuda.synchronize()
        base_seconds = time.perf_counter() - start
        cos = min(cos_min(o, b.cpu().numpy()) for o, b in zip(outs, base_out, strict=True))
        rows.append(
            f"| {name} | {label} | {num_tokens / seconds / 1e6:.3f} | {num_tokens / base_seconds / 1e6:.3f} "
            f"| {base_seconds / seconds:.1f}× | {cos:.5f} |"
        )
    return rows


def suite_saturation(name, engine, rng, iters: int) -> list[str]:
    rows = []
    vocab = engine.info.vocab_size
    for tokens in (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384):
        print(f"  saturation {name} {tokens}", flush=True)
        num_seqs = max(1, tokens // 256)
        seqs = [rng.integers(5, vocab, tokens // num_seqs).astype(np.int64) for _ in range(num_seqs)]
        engine.prewarm(
            [
                engine.pack(
                    np.concatenate(seqs).astype(np.int32), np.array([len(s) for s in seqs], np.int32)
                ).bucket
            ]
        )
        p50, _ = percentiles(time_engine(engine, seqs, iters))
        rows.append(f"| {name} | {tokens} ({num_seqs} seqs) | {p50:.3f} | {tokens / p50 / 1e3:.2f} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["bge-m3"])
    parser.add_argument("--backends", nargs="+", default=["auto"], help="attention backends to compare")
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--throughput-batches", type=int, default=40)
    parser.add_argument(
        "--suites",
        type=lambda text: set(text.split(",")),
        default=set(SUITES),
        help=f"comma-separated, of {','.join(SUITES)} (default: all)",
    )
    args = parser.parse_args()
    if args.suites - set(SUITES):
        parser.error(f"unknown --suites {sorted(args.suites - set(SUITES))}; they are {', '.join(SUITES)}")
    rng = np.random.default_rng(0)
    props = torch.cuda.get_device_properties(0)
    print(f"{props.name}, torch {torch.__version__}, transformers {transformers.__version__}\n")
    latency, scoring, throughput, saturation = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            path, baseline = write_model_dir(name, Path(tmp))
            for backend in args.backends:
                engine = build(path, backend)
                label = f"{name}, {engine.info.attention_backend}"
                print(f"{label}: pooling {engine.info.pooling}", flush=True)
                if "latency" in args.suites:
                    latency += suite_latency(label, engine, baseline, rng, args.iters)
                if "throughput" in args.suites:
                    throughput += suite_throughput(label, engine, baseline, rng, args.throughput_batches)
                if "saturation" in args.suites:
                    saturation += suite_saturation(label, engine, rng, max(20, args.iters // 4))
                del engine
                torch.cuda.empty_cache()
            del baseline
        if "scoring" in args.suites:
            path, baseline = write_reranker_dir(Path(tmp))
            for backend in args.backends:
                engine = build(path, backend, max_batch_tokens=32768)
                label = f"{RERANKER}, {engine.info.attention_backend}"
                scoring += suite_scoring(engine, baseline, rng, args.iters, label)
                del engine
                torch.cuda.empty_cache()
    if latency:
        print(
            "| model, attention | batch | p50 ms | p99 ms | cold ms | baseline p50 ms | baseline p99 ms "
            "| speed-up | min cos |"
        )
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        print("\n".join(latency), "\n")
    if scoring:
        print(
            "| model, attention | pairs | p50 ms | p99 ms | cold ms | baseline p50 ms | baseline p99 ms "
            "| speed-up | max abs logit diff |"
        )
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        print("\n".join(scoring), "\n")
    if throughput:
        print("| model, attention | lengths | kembed Mtok/s | baseline Mtok/s | speed-up | min cos |")
        print("|---|---|---:|---:|---:|---:|")
        print("\n".join(throughput), "\n")
    if saturation:
        print("| model, attention | tokens per step | p50 ms | ktok/ms |")
        print("|---|---|---:|---:|")
        print("\n".join(saturation))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
