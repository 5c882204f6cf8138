"""`make bench` on a GPU: kembed's engine against transformers on the same GPU, same run.

Models are built from real configs (tests/bench/configs/<name>) with random weights: speed does not
depend on their values, and nothing is downloaded. Benchmarks (`--suites`, all by default):
- latency: batch 1 at 128 / 512 / 4096 tokens, a whole engine step (pack, copy in, graph replay,
  copy out, wait), graphs prewarmed; the cold (first, eager) hit too. Against two baselines on the
  same weights (transformers `AutoModel`, sdpa, bf16, pooled like the model): HF eager, and HF in a
  whole-model CUDA graph captured by hand for the batch shape (static inputs, warm-up on a side
  stream, forward + pooling captured; per call copy in, replay, copy out), the fastest a careful
  user gets from transformers. Every contender is warmed up first, then timed in interleaved rounds
  (`--rounds`: kembed, HF + graph, HF eager, kembed, ...); printed: the median over rounds of each
  round's p50 (and kembed's p99) and the worst round's p50;
- scoring: a cross-encoder (bge-reranker-v2-m3 shape) over 5 / 25 / 50 query-document pairs of
  512 tokens, one step; the same three contenders on `AutoModelForSequenceClassification`;
- throughput: batches of 100 from 4 concurrent clients through the scheduler, fixed 512 and mixed
  32-512 lengths, tokens/s; the baseline (HF eager) runs the same batches padded; each makes one
  untimed pass, then they alternate for `--rounds` rounds (printed: median round / worst round);
- saturation: one step's latency against the bucket's token count, to set max_batch_tokens.
Equal-length batches (latency, scoring) go to transformers without an attention mask, as a careful
user sends them (no padding to mask, and SDPA keeps its fastest kernels). Every kembed output is
checked against the baseline's (cosine >= 0.999 per row), and the graph baseline against HF eager.
Prints markdown.
"""

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `python -P` adds no script folder
from timing import environment, p50_p99, time_ms

from kembed.worker.config import WorkerConfig
from kembed.worker.engine import load_engine
from kembed.worker.scheduling.scheduler import Scheduler

CONFIGS = Path(__file__).resolve().parent / "configs"
RERANKER = "bge-reranker-v2-m3"
SUITES = ("latency", "scoring", "throughput", "saturation")


def write_model_dir(name: str, tmp: Path):
    """(model directory with random bf16 weights for config `name`, the transformers model itself)."""
    src = CONFIGS / name
    config = transformers.AutoConfig.from_pretrained(src)
    # AutoModel of a T5 config is the encoder-decoder; an embedder is its encoder alone
    auto = transformers.T5EncoderModel if config.model_type in ("t5", "mt5") else transformers.AutoModel
    with torch.device("cuda"):
        torch.manual_seed(0)
        # T5EncoderModel is no Auto class: built from its config as one builds any model class
        build = auto.from_config if auto is transformers.AutoModel else auto._from_config
        try:
            model = build(config, dtype=torch.bfloat16, attn_implementation="sdpa").eval()
        except ValueError:  # a class without sdpa (MPNet): its own attention, the fastest it has
            model = build(config, dtype=torch.bfloat16, attn_implementation="eager").eval()
    path = tmp / name
    model.save_pretrained(path)
    for extra in ("modules.json", "1_Pooling"):
        if (src / extra).is_dir():
            shutil.copytree(src / extra, path / extra)
        elif (src / extra).exists():
            shutil.copy(src / extra, path / extra)
    return path, model


def write_reranker_dir(tmp: Path, name: str = RERANKER):
    """(cross-encoder directory with random bf16 weights, the transformers model itself)."""
    config = transformers.AutoConfig.from_pretrained(CONFIGS / name)
    with torch.device("cuda"):
        torch.manual_seed(0)
        auto = transformers.AutoModelForSequenceClassification
        try:
            model = auto.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa").eval()
        except ValueError:  # a class without sdpa (DeBERTa-v2): its own attention
            model = auto.from_config(config, dtype=torch.bfloat16, attn_implementation="eager").eval()
    path = tmp / name
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


def pool(hidden: torch.Tensor, mask: torch.Tensor | None, pooling: str) -> torch.Tensor:
    """Rows pooled like the model's sentence-transformers config; mask None: no padding."""
    hidden = hidden.float()
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "last":
        return (
            hidden[:, -1]
            if mask is None
            else hidden[torch.arange(len(mask), device=mask.device), mask.sum(1) - 1]
        )
    if mask is None:
        return hidden.mean(1)
    return (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)


def hf_embed(model, ids: torch.Tensor, mask: torch.Tensor | None, pooling: str) -> torch.Tensor:
    """transformers' forward (no KV cache: nothing is generated) and pooling, on the GPU."""
    with torch.inference_mode():
        hidden = model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
        return pool(hidden, mask, pooling)


def baseline_rows(model, seqs: list[np.ndarray], pooling: str) -> torch.Tensor:
    """transformers on one padded batch (mixed lengths: with its attention mask)."""
    longest = max(len(s) for s in seqs)
    ids = torch.ones(len(seqs), longest, dtype=torch.int64)
    mask = torch.zeros(len(seqs), longest, dtype=torch.int64)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.from_numpy(s)
        mask[i, : len(s)] = 1
    return hf_embed(model, ids.cuda(), mask.cuda(), pooling)


class GraphedHF:
    """A transformers forward (+ pooling or head) in one CUDA graph for one batch shape, built as a
    careful user builds it: a static input tensor, warm-up on a side stream (lazy initialisation,
    cuBLAS handles, autotuning stay out of the capture), capture, then per call copy in, replay,
    copy out. Equal-length batches only (no attention mask)."""

    def __init__(self, forward: Callable[[torch.Tensor], torch.Tensor], num_seqs: int, length: int) -> None:
        self.ids = torch.ones(num_seqs, length, dtype=torch.int64, device="cuda")  # [num_seqs, length]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                forward(self.ids)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = forward(self.ids)  # the static output, overwritten by each replay

    def __call__(self, ids_cpu: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():  # the static tensors were made under it
            self.ids.copy_(ids_cpu)
            self.graph.replay()
            return self.out.cpu()


def cos_min(a: np.ndarray, b: np.ndarray) -> float:
    return float(((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))).min())


def time_calls(call: Callable[[], object], iters: int) -> list[float]:
    """Milliseconds of each of `iters` calls, each started with the GPU idle."""
    return time_ms(call, iters, before=torch.cuda.synchronize)


def time_engine(engine, seqs, iters: int) -> list[float]:
    ids, lengths = np.concatenate(seqs), np.array([len(s) for s in seqs], np.int32)
    return time_calls(lambda: engine.step(engine.pack(ids, lengths)).wait(), iters)


def interleaved(
    contenders: dict[str, tuple[Callable[[], object], int]], rounds: int
) -> dict[str, list[list[float]]]:
    """Each contender warmed up (5 calls), then `rounds` rounds of each in turn: {name: [round's ms]}."""
    for call, _ in contenders.values():
        time_calls(call, 5)
    samples: dict[str, list[list[float]]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, (call, iters) in contenders.items():
            samples[name].append(time_calls(call, iters))
    return samples


def p50_cell(rounds: list[list[float]], digits: int = 3) -> tuple[str, float]:
    """("median / worst" of the rounds' p50s, the median)."""
    p50s = [p50_p99(r)[0] for r in rounds]
    median = statistics.median(p50s)
    return f"{median:.{digits}f} / {max(p50s):.{digits}f}", median


def graphed(forward: Callable[[torch.Tensor], torch.Tensor], num_seqs: int, length: int) -> GraphedHF | None:
    """The graph baseline, or None (said on stderr, and '—' in the table) where transformers cannot
    be captured."""
    try:
        with torch.inference_mode():
            return GraphedHF(forward, num_seqs, length)
    except RuntimeError as error:
        print(f"    transformers could not be captured in a CUDA graph: {error}", file=sys.stderr, flush=True)
        torch.cuda.synchronize()
        return None


def compare_step(engine, seqs, forward, iters: int, rounds: int):
    """kembed's step, HF + CUDA graph and HF eager on one equal-length batch, timed in interleaved
    rounds: (cells, kembed's rows, HF eager's rows, HF + graph's rows or None)."""
    ids = np.concatenate(seqs).astype(np.int32)
    lengths = np.array([len(s) for s in seqs], np.int32)
    batch_cpu = torch.from_numpy(np.stack(seqs).astype(np.int64))
    cold = time_engine(engine, seqs, 1)[0]  # first hit of this bucket: eager
    engine.prewarm([engine.pack(ids, lengths).bucket])
    graph = graphed(forward, len(seqs), len(seqs[0]))
    contenders = {"kembed": (lambda: engine.step(engine.pack(ids, lengths)).wait(), iters)}
    if graph is not None:
        contenders["graph"] = (lambda: graph(batch_cpu), iters)
    contenders["eager"] = (lambda: forward(batch_cpu.cuda()).cpu(), max(20, iters // 4))
    samples = interleaved(contenders, rounds)
    ours, ours_p50 = p50_cell(samples["kembed"])
    p99 = statistics.median(p50_p99(r)[1] for r in samples["kembed"])
    eager, eager_p50 = p50_cell(samples["eager"], 2)
    cells = [ours, f"{p99:.3f}", f"{cold:.1f}"]
    if graph is not None:
        graph_cell, graph_p50 = p50_cell(samples["graph"])
        cells += [graph_cell, eager, f"{graph_p50 / ours_p50:.2f}×", f"{eager_p50 / ours_p50:.1f}×"]
    else:
        cells += ["—", eager, "—", f"{eager_p50 / ours_p50:.1f}×"]
    got = engine.step(engine.pack(ids, lengths)).wait()
    want = forward(batch_cpu.cuda()).cpu().numpy()
    graph_rows = graph(batch_cpu).numpy() if graph is not None else None
    return cells, got, want, graph_rows  # the graph and its memory pool go with this frame


def suite_latency(name, engine, baseline, rng, iters: int, rounds: int) -> list[str]:
    rows = []
    vocab, pooling = engine.info.vocab_size, engine.info.pooling
    # at most the model's position table (MPNet's and T5's 512): a longer sequence is refused at the edge
    for tokens in [n for n in (128, 512, 4096) if n <= engine.info.max_sequence_length]:
        print(f"  latency {name} 1x{tokens}", flush=True)
        seqs = [rng.integers(5, vocab, tokens).astype(np.int64)]
        cells, got, want, graph_rows = compare_step(
            engine, seqs, lambda ids: hf_embed(baseline, ids, None, pooling), iters, rounds
        )
        torch.cuda.empty_cache()
        if graph_rows is not None:
            assert cos_min(graph_rows, want) >= 0.999, "the graphed baseline differs from HF eager"
        cos = min(cos_min(got, want), cos_min(got, graph_rows) if graph_rows is not None else 1.0)
        rows.append(f"| {name} | 1 × {tokens} | {' | '.join(cells)} | {cos:.5f} |")
    return rows


def suite_scoring(engine, baseline, rng, iters: int, rounds: int, label: str) -> list[str]:
    """One step scoring N pairs of 512 tokens (query and document already joined)."""

    def logits(ids: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return baseline(input_ids=ids).logits.float()

    rows = []
    for num_docs in (5, 25, 50):
        print(f"  scoring {num_docs} x 512", flush=True)
        seqs = [rng.integers(5, engine.info.vocab_size, 512).astype(np.int64) for _ in range(num_docs)]
        cells, got, want, graph_rows = compare_step(engine, seqs, logits, iters, rounds)
        torch.cuda.empty_cache()
        diff = float(np.abs(got - want).max())
        if graph_rows is not None:
            assert float(np.abs(graph_rows - want).max()) < 0.05, "the graphed baseline differs from HF eager"
            diff = max(diff, float(np.abs(got - graph_rows).max()))
        rows.append(f"| {label} | {num_docs} × 512 | {' | '.join(cells)} | {diff:.4f} |")
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


def suite_throughput(name, engine, baseline, rng, num_batches: int, rounds: int) -> list[str]:
    """Tokens/s of batches of 100 sequences from 4 clients, kembed and the baseline in interleaved
    rounds after one untimed pass each; cells give the median round / the worst round."""
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
        for b in batches:  # the baseline's first pass too: cuBLAS and SDPA set up each padded shape
            baseline_rows(baseline, b, engine.info.pooling)
        ours, theirs, cos = [], [], 1.0
        for _ in range(rounds):
            seconds, outs = asyncio.run(run_clients(engine, batches, 8192))
            torch.cuda.synchronize()
            start = time.perf_counter()
            base_out = [baseline_rows(baseline, b, engine.info.pooling) for b in batches]
            torch.cuda.synchronize()
            theirs.append(num_tokens / (time.perf_counter() - start) / 1e6)
            ours.append(num_tokens / seconds / 1e6)
            cos = min(cos, *(cos_min(o, b.cpu().numpy()) for o, b in zip(outs, base_out, strict=True)))
        rows.append(
            f"| {name} | {label} | {np.median(ours):.3f} / {min(ours):.3f} | {np.median(theirs):.3f} / "
            f"{min(theirs):.3f} | {np.median(ours) / np.median(theirs):.1f}× | {cos:.5f} |"
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
        p50, _ = p50_p99(time_engine(engine, seqs, iters))
        rows.append(f"| {name} | {tokens} ({num_seqs} seqs) | {p50:.3f} | {tokens / p50 / 1e3:.2f} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["bge-m3"])
    parser.add_argument("--backends", nargs="+", default=["auto"], help="attention backends to compare")
    parser.add_argument("--iters", type=int, default=200, help="timed calls per round (HF eager: a quarter)")
    parser.add_argument(
        "--rounds", type=int, default=3, help="interleaved rounds of the latency and scoring suites"
    )
    parser.add_argument("--throughput-batches", type=int, default=40)
    parser.add_argument(
        "--rerankers", nargs="+", default=[RERANKER], help="cross-encoder configs of the scoring suite"
    )
    parser.add_argument(
        "--suites",
        type=lambda text: set(text.split(",")),
        default=set(SUITES),
        help=f"comma-separated, of {','.join(SUITES)} (default: all)",
    )
    args = parser.parse_args()
    if args.rounds < 1 or args.iters < 1:
        parser.error("--rounds and --iters must be at least 1")
    if args.suites - set(SUITES):
        parser.error(f"unknown --suites {sorted(args.suites - set(SUITES))}; they are {', '.join(SUITES)}")
    rng = np.random.default_rng(0)
    print(
        f"{environment('transformers')}; "
        f"latency and scoring: {args.rounds} interleaved rounds of {args.iters} calls (HF eager "
        f"{max(20, args.iters // 4)}), p50 as the median over rounds / the worst round\n"
    )
    latency, scoring, throughput, saturation = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            path, baseline = write_model_dir(name, Path(tmp))
            for backend in args.backends:
                engine = build(path, backend)
                label = f"{name}, {engine.info.attention_backend}"
                print(f"{label}: pooling {engine.info.pooling}", flush=True)
                if "latency" in args.suites:
                    latency += suite_latency(label, engine, baseline, rng, args.iters, args.rounds)
                    print("\n".join(latency[-3:]), flush=True)  # as they come: a later model may fail
                if "throughput" in args.suites:
                    throughput += suite_throughput(
                        label, engine, baseline, rng, args.throughput_batches, args.rounds
                    )
                    print("\n".join(throughput[-2:]), flush=True)
                if "saturation" in args.suites:
                    saturation += suite_saturation(label, engine, rng, max(20, args.iters // 4))
                del engine
                torch.cuda.empty_cache()
            del baseline
        for reranker in args.rerankers if "scoring" in args.suites else ():
            path, baseline = write_reranker_dir(Path(tmp), reranker)
            for backend in args.backends:
                engine = build(path, backend, max_batch_tokens=32768)
                label = f"{reranker}, {engine.info.attention_backend}"
                scoring += suite_scoring(engine, baseline, rng, args.iters, args.rounds, label)
                del engine
                torch.cuda.empty_cache()
            del baseline
    step_columns = (
        "kembed p50 ms (median / worst round) | kembed p99 ms (median) | cold ms | HF + CUDA graph p50 ms "
        "(median / worst) | HF eager p50 ms (median / worst) | speed-up vs HF + graph | vs HF eager"
    )
    if latency:
        print(f"| model, attention | batch | {step_columns} | min cos |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        print("\n".join(latency), "\n")
    if scoring:
        print(f"| model, attention | pairs | {step_columns} | max abs logit diff |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        print("\n".join(scoring), "\n")
    if throughput:
        print(
            "| model, attention | lengths | kembed Mtok/s (median / worst) "
            "| baseline Mtok/s (median / worst) | speed-up (medians) | min cos |"
        )
        print("|---|---|---:|---:|---:|---:|")
        print("\n".join(throughput), "\n")
    if saturation:
        print("| model, attention | tokens per step | p50 ms | ktok/ms |")
        print("|---|---|---:|---:|")
        print("\n".join(saturation))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
