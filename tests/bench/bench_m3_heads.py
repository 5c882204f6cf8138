"""GPU: what BGE-M3's extra outputs cost on top of the dense step. `python3 -P tests/bench/bench_m3_heads.py`.

A BGE-M3-shape model (tests/bench/configs/bge-m3, random bf16 weights, both heads) on the CUDA
engine with graphs: a dense-only step against a step asking every sequence for dense + sparse +
ColBERT (the multi-output graph with both heads, the gather of each sequence's outputs and their
copy to the host), and against the same model loaded without its heads (dense graphs only, the
baseline a dense-only request paid before). Shapes: 1 x 128 tokens, and 16 sequences of 32-512
tokens. The three take turns step by step (rotating order); per round each one's median of
`--iters` steps and the extra of that round (multi-output over the dense step of the same model);
prints markdown: median of the rounds (worst round).
"""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from kembed.proto.outputs import COLBERT, DENSE, SPARSE
from kembed.worker.config import WorkerConfig
from kembed.worker.engine import load_engine

CONFIG = Path(__file__).resolve().parent / "configs" / "bge-m3"


def write_m3(path: Path, with_heads: bool) -> Path:
    """BGE-M3's config with random bf16 weights in transformers' names (no transformers needed)."""
    config = json.loads((CONFIG / "config.json").read_text())
    h, inter, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    g = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    w = {
        "embeddings.word_embeddings.weight": rand(config["vocab_size"], h),
        "embeddings.position_embeddings.weight": rand(config["max_position_embeddings"], h),
        "embeddings.token_type_embeddings.weight": rand(config.get("type_vocab_size", 1), h),
        "embeddings.LayerNorm.weight": torch.ones(h, dtype=torch.bfloat16),
        "embeddings.LayerNorm.bias": torch.zeros(h, dtype=torch.bfloat16),
    }
    for i in range(layers):
        p = f"encoder.layer.{i}."
        for name, (o, n) in {
            "attention.self.query": (h, h), "attention.self.key": (h, h), "attention.self.value": (h, h),
            "attention.output.dense": (h, h), "intermediate.dense": (inter, h), "output.dense": (h, inter),
        }.items():  # fmt: skip
            w[p + name + ".weight"], w[p + name + ".bias"] = rand(o, n), rand(o)
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            w[p + norm + ".weight"] = torch.ones(h, dtype=torch.bfloat16)
            w[p + norm + ".bias"] = torch.zeros(h, dtype=torch.bfloat16)
    path.mkdir(parents=True)
    save_file(w, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config))
    for extra in ("modules.json",):
        (path / extra).write_text((CONFIG / extra).read_text())
    (path / "2_Normalize").mkdir()
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text((CONFIG / "1_Pooling" / "config.json").read_text())
    if with_heads:
        save_file({"weight": rand(1, h), "bias": rand(1)}, str(path / "sparse_linear.safetensors"))
        save_file({"weight": rand(h, h), "bias": rand(h)}, str(path / "colbert_linear.safetensors"))
    return path


def interleaved_ms(configs, ids, lengths, iters: int) -> list[float]:
    """Each config's median step (ms) over `iters` steps, the configs taking turns step by step in
    a rotating order: a drift of the machine (clocks, a neighbour) lands on all of them alike.
    `configs`: (engine, outputs) pairs."""

    def once(engine, outputs) -> None:
        engine.step(engine.pack(ids, lengths, None, None, outputs)).wait()

    for engine, outputs in configs:
        for _ in range(3):  # eager, capture, replay
            once(engine, outputs)
    times: list[list[float]] = [[] for _ in configs]
    for i in range(iters):
        for k in range(len(configs)):
            j = (i + k) % len(configs)
            torch.cuda.synchronize()
            started = time.perf_counter()
            once(*configs[j])
            times[j].append((time.perf_counter() - started) * 1e3)
    return [statistics.median(t) for t in times]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iters", type=int, default=200)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        engines = {}
        for name, heads in (("no heads", False), ("heads", True)):
            cfg = WorkerConfig(
                model=write_m3(Path(tmp) / name, heads), device="cuda", dtype="bfloat16", prewarm="none"
            )
            engines[name] = load_engine(cfg)
    shapes = {
        "1 x 128": [128],
        "16 x 32-512": rng.integers(32, 513, 16).tolist(),
    }
    every = DENSE | SPARSE | COLBERT
    print(
        f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"{args.rounds} rounds x {args.iters} steps"
    )
    print(
        "| shape | dense step, model without heads (ms) | dense step, with heads (ms) "
        "| dense + sparse + ColBERT (ms) | extra, median (worst) round |"
    )
    print("|---|---|---|---|---|")
    for shape, lens in shapes.items():
        lengths = np.array(lens, np.int32)
        ids = rng.integers(5, 250000, int(lengths.sum())).astype(np.int32)
        multi = np.full(len(lengths), every, np.uint8)
        configs = [(engines["no heads"], None), (engines["heads"], None), (engines["heads"], multi)]
        samples: dict[str, list[float]] = {"base": [], "dense": [], "multi": []}
        extras = []
        for _ in range(args.rounds):
            for name, ms in zip(samples, interleaved_ms(configs, ids, lengths, args.iters), strict=True):
                samples[name].append(ms)
            extras.append(samples["multi"][-1] / samples["dense"][-1] - 1)
        med = {k: statistics.median(v) for k, v in samples.items()}
        worst = {k: max(v) for k, v in samples.items()}
        pack_times = []
        for _ in range(args.iters):
            started = time.perf_counter()
            engines["heads"].pack(ids, lengths, None, None, multi)
            pack_times.append((time.perf_counter() - started) * 1e3)
        print(
            f"  (multi-output pack on the host, {shape}: {statistics.median(pack_times):.3f} ms)", flush=True
        )
        heads = engines["heads"]
        bucket = heads.pack(ids, lengths).bucket
        device_ms = {}
        for name, cache in (("dense", heads.graphs), ("multi", heads.multi_graphs)):
            cache.replay(bucket)  # captured by the steps above; replayed alone, timed on the device
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(args.iters):
                cache.replay(bucket)
            end.record()
            end.synchronize()
            device_ms[name] = start.elapsed_time(end) / args.iters
        print(
            f"  (graph replay alone on the device, {shape}: dense {device_ms['dense']:.3f} ms, every head "
            f"{device_ms['multi']:.3f} ms, {(device_ms['multi'] / device_ms['dense'] - 1) * 100:+.1f} %)",
            flush=True,
        )
        print(
            f"| {shape} | {med['base']:.3f} ({worst['base']:.3f}) "
            f"| {med['dense']:.3f} ({worst['dense']:.3f}) "
            f"| {med['multi']:.3f} ({worst['multi']:.3f}) "
            f"| {statistics.median(extras) * 100:+.1f} % ({max(extras) * 100:+.1f} %) |",
            flush=True,
        )


if __name__ == "__main__":
    main()
