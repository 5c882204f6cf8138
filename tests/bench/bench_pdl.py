"""Programmatic dependent launch on and off for one engine step, in one run (a GPU, not a test).

`KEMBED_PDL` is read once per process and a captured graph keeps the launches it was captured with,
so two worker processes load the same model (random weights, tests/bench/configs), one with
KEMBED_PDL=1 and one with KEMBED_PDL=0, and each prewarms the buckets of the shapes. Rounds then
alternate between them (on, off / off, on / ...; the other process idles meanwhile), each timing
per shape the graph replay alone (CUDA events around back-to-back replays: device time, launch
gaps included) and the whole engine step (pack, copy in, replay, copy out, wait: the p50 over the
iterations). Printed per shape: the median over rounds and the worst round, on and off, and the
least cosine between the two processes' outputs (the same ids in both).
`python3 -P tests/bench/bench_pdl.py [--models bge-m3 qwen3-0.6b] [--rounds 3] [--iters 200]`
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gpu import build, cos_min, write_model_dir
from profile_step import load_real_batch

from kembed.worker.engine import pdl

SHAPES = ((1, 128), (1, 512), (16, 512))  # (sequences, tokens each)
TAG = "@@bench_pdl "  # marks the child's protocol lines on its stdout


def say(message: dict) -> None:
    print(TAG + json.dumps(message), flush=True)


def replay_ms(engine, ids: np.ndarray, lengths: np.ndarray, iters: int) -> float:
    """Device time per replay of the batch's graph, its real batch in the static inputs."""
    batch = engine.pack(ids, lengths)
    load_real_batch(engine, batch)
    engine.graphs.replay(batch.bucket)  # captured at prewarm: this one only settles the clocks
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        engine.graphs.replay(batch.bucket)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def step_ms(engine, ids: np.ndarray, lengths: np.ndarray, iters: int) -> list[float]:
    out = []
    for _ in range(iters):
        began = time.perf_counter()
        engine.step(engine.pack(ids, lengths)).wait()
        out.append((time.perf_counter() - began) * 1e3)
    return out


def child(path: Path, iters: int) -> None:
    """One process, one setting of KEMBED_PDL: prewarm, report, then time a round per line read."""
    engine = build(path, "auto")
    rng = np.random.default_rng(0)  # the same ids in both processes
    batches = {}
    outputs = {}
    for num_seqs, length in SHAPES:
        lengths = np.full(num_seqs, length, np.int32)
        ids = rng.integers(5, engine.info.vocab_size, num_seqs * length).astype(np.int32)
        engine.prewarm([engine.pack(ids, lengths).bucket])
        batches[f"{num_seqs}x{length}"] = (ids, lengths)
        outputs[f"{num_seqs}x{length}"] = engine.step(engine.pack(ids, lengths)).wait().tolist()
    say(
        {
            "pdl": pdl.is_enabled(torch.cuda.current_device()),
            "switch": os.environ.get(pdl.ENV_SWITCH),
            "backend": engine.info.attention_backend,
            "outputs": outputs,
        }
    )
    for line in sys.stdin:
        if line.strip() != "round":
            break
        result = {}
        for key, (ids, lengths) in batches.items():
            replay = replay_ms(engine, ids, lengths, iters)
            steps = sorted(step_ms(engine, ids, lengths, iters))
            result[key] = {"replay": replay, "step_p50": statistics.median(steps)}
        say(result)


class Child:
    def __init__(self, path: Path, switch: str, iters: int) -> None:
        self.switch = switch
        self.proc = subprocess.Popen(
            [sys.executable, "-P", __file__, "--child", str(path), "--iters", str(iters)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=dict(os.environ, **{pdl.ENV_SWITCH: switch}),
        )

    def read(self) -> dict:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(TAG):
                return json.loads(line[len(TAG) :])
            print(line, end="", file=sys.stderr)  # anything else it printed
        raise RuntimeError(f"the KEMBED_PDL={self.switch} process exited with {self.proc.wait()}")

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        try:
            self.send("quit")
            self.proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):  # it had exited already, or hangs
            self.proc.kill()
            self.proc.wait()


def compare(path: Path, name: str, rounds: int, iters: int) -> list[str]:
    # One after the other: each times the attention backends at start (`auto`), alone on the GPU.
    on = Child(path, "1", iters)
    off = None
    try:
        ready_on = on.read()
        off = Child(path, "0", iters)
        ready_off = off.read()
        if not ready_on["pdl"]:
            raise RuntimeError("KEMBED_PDL=1 left PDL off here (compute capability < 9.0, or no gdc_wait)")
        assert not ready_off["pdl"]
        if ready_on["backend"] != ready_off["backend"]:
            print(f"note: attention on {ready_on['backend']}, off {ready_off['backend']}", file=sys.stderr)
        timings: dict[str, list[dict]] = {"on": [], "off": []}
        for r in range(rounds):
            print(f"  {name} round {r + 1}/{rounds}", file=sys.stderr, flush=True)
            order = [("on", on), ("off", off)] if r % 2 == 0 else [("off", off), ("on", on)]
            for label, proc in order:
                proc.send("round")
                timings[label].append(proc.read())
    finally:
        on.close()
        if off is not None:
            off.close()
    rows = []
    for num_seqs, length in SHAPES:
        key = f"{num_seqs}x{length}"
        cos = cos_min(np.array(ready_on["outputs"][key]), np.array(ready_off["outputs"][key]))
        cells = []
        for metric in ("replay", "step_p50"):
            for label in ("on", "off"):
                values = [t[key][metric] for t in timings[label]]
                cells.append(f"{statistics.median(values):.3f} / {max(values):.3f}")
            on_median = statistics.median(t[key][metric] for t in timings["on"])
            off_median = statistics.median(t[key][metric] for t in timings["off"])
            cells.append(f"{1e3 * (off_median - on_median):+.0f}")
        label = f"{name}, {ready_on['backend']}"
        rows.append(f"| {label} | {num_seqs} × {length} | {' | '.join(cells)} | {cos:.5f} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["bge-m3"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)  # a model directory: run as one side
    args = parser.parse_args()
    if args.child:
        child(args.child, args.iters)
        return
    if args.rounds < 1 or args.iters < 1:
        parser.error("--rounds and --iters must be at least 1")
    props = torch.cuda.get_device_properties(0)
    print(f"{props.name}, torch {torch.__version__}; {args.rounds} rounds of {args.iters} iterations\n")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            path, model = write_model_dir(name, Path(tmp))
            del model
            torch.cuda.empty_cache()
            rows += compare(path, name, args.rounds, args.iters)
    print(
        "| model, attention | batch | replay ms, PDL on (median / worst) | replay ms, off | replay saved µs "
        "| step p50 ms, PDL on (median / worst) | step p50 ms, off | step saved µs | min cos on vs off |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
