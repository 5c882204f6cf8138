"""Where one engine step's GPU time goes, by kernel, on the benchmark models (a GPU, not a test).

For each model and batch shape: kernel time by kernel name (torch profiler, eager forwards: kernel
durations do not depend on launch gaps), the graph replay time (CUDA events) and a whole engine step
(pack, copy in, replay, copy out, wait), so the host's share shows as their difference.
`python -P tests/bench/profile_step.py --models bge-m3 qwen3-0.6b`
"""

import argparse
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gpu import build, write_model_dir

SHAPES = ((1, 128), (16, 512))  # (sequences, tokens each)


def load_real_batch(engine, batch) -> None:
    """Put `batch` in the static input block (prewarm leaves a neutral one-sequence batch there,
    whose attention over the whole bucket would misstate every multi-sequence shape)."""
    slot = engine.ring.acquire()
    slot.stage(batch)
    engine.static.load(slot, batch.bucket)
    torch.cuda.synchronize()
    engine.ring.release(slot)


def kernel_table(engine, batch, top: int) -> list[str]:
    bucket = batch.bucket
    load_real_batch(engine, batch)
    with torch.inference_mode():
        for _ in range(3):
            engine._forward_static(bucket)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                engine._forward_static(bucket)
            torch.cuda.synchronize()
    totals, counts = defaultdict(float), defaultdict(int)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name] += event.device_time_total / 5
            counts[event.name] += 1
    total = sum(totals.values())
    rows = [f"    kernels per forward: {sum(counts.values()) // 5}, kernel time {total:.0f} µs"]
    for name, us in sorted(totals.items(), key=lambda kv: -kv[1])[:top]:
        rows.append(f"    {us:8.1f} µs {100 * us / total:5.1f}%  x{counts[name] // 5:<4} {name[:90]}")
    return rows


def replay_and_step_ms(engine, ids, lengths, iters: int = 100) -> tuple[float, float]:
    batch = engine.pack(ids, lengths)
    engine.prewarm([batch.bucket])
    load_real_batch(engine, batch)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        engine.graphs.replay(batch.bucket)
    end.record()
    end.synchronize()
    replay = start.elapsed_time(end) / iters
    steps = []
    for _ in range(iters):
        began = time.perf_counter()
        engine.step(engine.pack(ids, lengths)).wait()
        steps.append((time.perf_counter() - began) * 1e3)
    return replay, float(np.median(steps))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["bge-m3"])
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            path, baseline = write_model_dir(name, Path(tmp))
            del baseline
            engine = build(path, "auto")
            print(f"{name} ({engine.info.attention_backend})", flush=True)
            for num_seqs, length in SHAPES:
                lengths = np.full(num_seqs, length, np.int32)
                ids = rng.integers(5, engine.info.vocab_size, num_seqs * length).astype(np.int32)
                replay, step = replay_and_step_ms(engine, ids, lengths)
                print(f"  {num_seqs} x {length}: replay {replay:.3f} ms, whole step {step:.3f} ms")
                print("\n".join(kernel_table(engine, engine.pack(ids, lengths), args.top)), flush=True)
            del engine
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
