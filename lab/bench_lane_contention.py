"""What an interactive lane step waits for beside bulk work (CUDA; BGE-M3 shape, random weights, bf16).

The worker's interactive lane (worker/engine/cuda_engine.py) replays a query step's graph on a
high-priority stream beside the main path's bulk steps. This times one lane step of `--queries`
14-token queries (host clock from launch to ready, one step in flight, the next 0.2-1 ms after)
beside work of several kinds kept two deep on the device, and that work's rate alone and beside:

- nothing;
- the engine's bulk step, 16 x 512 and 8 x 512 tokens, and 16 x 512 with its encoder layers' four
  GEMMs as the Triton kernel below (`bulk_gemms_in_triton`; the lane keeps cuBLAS);
- 24 layers' four GEMMs at 8192 rows: cuBLAS's (on Hopper persistent kernels, one block per SM for
  the whole GEMM) and a Triton GEMM through TMA descriptors (a block per output tile, each done in
  microseconds);
- big elementwise kernels (short blocks);
- the bulk step with the SMs split by green contexts (sm_partition.py): the lane on its own few
  SMs, bulk on the rest, both graphs captured on their group's streams.

Then the GEMMs' TFLOP/s, cuBLAS against the Triton kernel. Each row: the median of `--rounds`
interleaved rounds (worst in brackets). A benchmark, not a test: nothing asserts speed.
"""

import argparse
import contextlib
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests" / "bench")]  # bench_gpu, and percentile
from bench_gpu import write_model_dir  # noqa: E402
from graph_timing import capture, per_call_us  # noqa: E402
from sm_partition import split_sms  # noqa: E402
from timing import cell, environment, percentile  # noqa: E402

from kembed.worker.config import WorkerConfig  # noqa: E402
from kembed.worker.engine.engine import load_engine  # noqa: E402
from kembed.worker.engine.graphs import GraphCache  # noqa: E402
from kembed.worker.engine.models import bert  # noqa: E402

ROWS = 8192
SHAPES = {"QKV": (1024, 3072), "output": (1024, 1024), "up": (1024, 4096), "down": (4096, 1024)}  # (in, out)


@triton.jit
def _gemm_kernel(a_desc, b_desc, c_desc, bias_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr,
                 BK: tl.constexpr, GROUP_M: tl.constexpr, STAGES: tl.constexpr, BIAS: tl.constexpr,
                 GELU: tl.constexpr):  # fmt: skip
    """c = a @ b.T (+ bias, then GELU as cuBLAS's epilogue computes it: the tanh approximation)
    through TMA descriptors: one program per output tile, grouped for L2 reuse."""
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BN)
    first_m = (pid // (GROUP_M * num_n)) * GROUP_M
    size_m = min(tl.cdiv(M, BM) - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_n)) % size_m
    pid_n = (pid % (GROUP_M * num_n)) // size_m
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in tl.range(0, K, BK, num_stages=STAGES):
        acc = tl.dot(a_desc.load([pid_m * BM, k]), b_desc.load([pid_n * BN, k]).T, acc)
    if BIAS:
        acc += tl.load(bias_ptr + pid_n * BN + tl.arange(0, BN)).to(tl.float32)[None, :]
    if GELU:  # x * sigmoid(2 * sqrt(2 / pi) * (x + 0.044715 x^3)) = 0.5 x (1 + tanh(...))
        acc = acc * tl.sigmoid(1.5957691216057308 * (acc + 0.044715 * acc * acc * acc))
    c_desc.store([pid_m * BM, pid_n * BN], acc.to(tl.bfloat16))


# (BM, BN, BK, stages, warps): with 3 stages two blocks share an SM, so one block's epilogue runs
# beside the other's main loop. Of 11 tilings timed on an H200, the fastest for each of the four
# shapes, or within 4% of it (up + GELU)
TILE = (128, 128, 64, 3, 4)


def triton_gemm(
    x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, bias: torch.Tensor | None = None, gelu: bool = False
) -> Callable[[], None]:
    """A call of out = x @ w.T (+ bias, GELU) as a Triton kernel with a block per output tile
    (descriptors made once)."""
    (m, k), n = x.shape, w.shape[0]
    bm, bn, bk, stages, warps = TILE
    descs = (TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(w, [bn, bk]),
             TensorDescriptor.from_tensor(out, [bm, bn]))  # fmt: skip
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    args = (*descs, w if bias is None else bias, m, n, k)
    flags = {"BIAS": bias is not None, "GELU": gelu, "num_warps": warps, "num_stages": stages}
    return lambda: _gemm_kernel[grid](*args, BM=bm, BN=bn, BK=bk, GROUP_M=8, STAGES=stages, **flags)


def triton_linear(x: torch.Tensor, linear: torch.nn.Linear, gelu: bool = False) -> torch.Tensor:
    out = torch.empty(x.shape[0], linear.out_features, device=x.device, dtype=x.dtype)
    triton_gemm(x, linear.weight, out, linear.bias, gelu)()
    return out


@contextlib.contextmanager
def bulk_gemms_in_triton(model: torch.nn.Module, min_rows: int = 2048) -> Iterator[None]:
    """Within: the encoder layers' four linears run as `triton_linear` for inputs of at least
    `min_rows` tokens (the bulk steps); the lane's small steps keep cuBLAS."""
    activation = bert.linear_activation

    def linear_activation(
        x: torch.Tensor, linear: torch.nn.Linear, name: str, eager: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        return (
            triton_linear(x, linear, gelu=True)
            if x.shape[0] >= min_rows
            else activation(x, linear, name, eager)
        )

    def tiled(
        linear: torch.nn.Linear, cublas: Callable[[torch.Tensor], torch.Tensor]
    ) -> Callable[..., torch.Tensor]:
        return lambda x: triton_linear(x, linear) if x.shape[0] >= min_rows else cublas(x)

    layers = [m for m in model.modules() if isinstance(m, bert.BertLayer)]
    linears = [getattr(layer, name) for layer in layers for name in ("qkv", "attn_out", "ffn_out")]
    bert.linear_activation = linear_activation
    for linear in linears:
        linear.forward = tiled(linear, linear.forward)
    try:
        yield
    finally:
        bert.linear_activation = activation
        for linear in linears:
            del linear.forward  # the class's forward again


class Graph:
    """A captured chain of work, launched whole; `launch()` returns an event that fires when done."""

    def __init__(self, work: Callable[[], None]) -> None:
        self.graph = capture(work)

    def launch(self) -> torch.cuda.Event:
        self.graph.replay()
        event = torch.cuda.Event()
        event.record()
        return event


def contend(lane, query, launch: Callable[[], object] | None, seconds: float, with_lane: bool = True):
    """(lane step latencies in ms, units of `launch`'s work done per second) over `seconds`. `launch`
    starts one unit and returns a handle with `query()` (an event) or `is_ready()` (a result)."""
    latencies: list[float] = []
    outstanding: list[object] = []
    num_done, step, next_step = 0, None, time.perf_counter()
    until = time.perf_counter() + seconds
    while time.perf_counter() < until or outstanding or step:
        now = time.perf_counter()
        if launch is not None and now < until and len(outstanding) < 2:
            outstanding.append(launch())
        if with_lane and step is None and now >= next_step and now < until:
            step = (lane.step(query), time.perf_counter())
        for unit in list(outstanding):
            ready = unit.query() if isinstance(unit, torch.cuda.Event) else unit.is_ready()
            if ready:
                if not isinstance(unit, torch.cuda.Event):
                    unit.wait()
                outstanding.remove(unit)
                num_done += 1
        if step is not None and step[0].is_ready():
            latencies.append((time.perf_counter() - step[1]) * 1e3)
            step[0].wait()
            step, next_step = None, time.perf_counter() + random.uniform(0.2e-3, 1e-3)
    return latencies, num_done / seconds


def fmt(values: list[float], unit: str, higher_is_better: bool = False) -> str:
    return cell(values, unit, higher_is_better)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    parser.add_argument("--queries", type=int, default=6, help="queries in a lane step (14 tokens each)")
    parser.add_argument("--lane-sms", type=int, nargs="*", default=[16, 32], help="green-context splits")
    args = parser.parse_args()
    torch.manual_seed(0)
    path, hf = write_model_dir("bge-m3", Path(tempfile.mkdtemp(prefix="kembed-lane-")))
    del hf
    torch.cuda.empty_cache()
    config = WorkerConfig(model=path, device="cuda", dtype="bfloat16", max_batch_tokens=ROWS)
    main_path = load_engine(config)
    lane = main_path.lane
    assert lane is not None, "the worker's defaults give a CUDA engine an interactive lane"
    rng = np.random.default_rng(0)

    def batch(engine, num_seqs: int, length: int):
        ids = rng.integers(1000, 30000, size=num_seqs * length).astype(np.int32)
        return engine.pack(ids, np.full(num_seqs, length, dtype=np.int64))

    query = batch(lane, args.queries, 14)
    bulk = {tokens: batch(main_path, tokens // 512, 512) for tokens in (8192, 4096)}
    main_path.prewarm([b.bucket for b in bulk.values()])
    lane.prewarm([query.bucket])

    x = {name: torch.randn(ROWS, k, device="cuda", dtype=torch.bfloat16) for name, (k, n) in SHAPES.items()}
    w = {name: torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / 32 for name, (k, n) in SHAPES.items()}
    out = {name: torch.empty(ROWS, n, device="cuda", dtype=torch.bfloat16) for name, (k, n) in SHAPES.items()}
    big = torch.randn(64 << 20, device="cuda", dtype=torch.bfloat16)
    big_out = torch.empty_like(big)

    def cublas_layers() -> None:
        for _ in range(24):
            for name in SHAPES:
                torch.matmul(x[name], w[name].t(), out=out[name])

    tiled = {name: triton_gemm(x[name], w[name], out[name]) for name in SHAPES}

    def triton_layers() -> None:
        for _ in range(24):
            for call in tiled.values():
                call()

    def elementwise() -> None:
        for _ in range(100):
            torch.mul(big, 1.0001, out=big_out)

    graphs = {
        "cuBLAS": Graph(cublas_layers),
        "triton": Graph(triton_layers),
        "elementwise": Graph(elementwise),
    }
    beside: dict[str, Callable[[], object] | None] = {
        "nothing (the lane step alone)": None,
        "bulk steps of 16 x 512 tokens": lambda: main_path.step(bulk[8192]),
        "bulk steps of 8 x 512 tokens": lambda: main_path.step(bulk[4096]),
        "24 x 4 GEMMs of 8192 rows, cuBLAS": graphs["cuBLAS"].launch,
        "24 x 4 GEMMs of 8192 rows, Triton (a block per tile)": graphs["triton"].launch,
        "big elementwise kernels": graphs["elementwise"].launch,
    }
    rows = measure(args, lane, query, beside)
    cublas_out = main_path.step(bulk[8192]).wait().astype(np.float32)
    with bulk_gemms_in_triton(main_path.model):
        recapture(main_path, bulk[8192].bucket, main_path.stream, main_path.stream)
        tiled_out = main_path.step(bulk[8192]).wait().astype(np.float32)
        cosine = (
            (cublas_out * tiled_out).sum(1)
            / np.linalg.norm(cublas_out, axis=1)
            / np.linalg.norm(tiled_out, axis=1)
        )
        assert cosine.min() > 0.999, (
            f"the bulk step with Triton GEMMs is not the same model: cosine {cosine.min()}"
        )
        name = "bulk steps of 16 x 512, their GEMMs in Triton (a block per tile)"
        rows.update(measure(args, lane, query, {name: lambda: main_path.step(bulk[8192])}))
    for num_sms in args.lane_sms:  # last: these recapture both engines' graphs on the groups' streams
        lane_group, bulk_group = split_sms(num_sms)
        recapture(main_path, bulk[8192].bucket, bulk_group.stream(), bulk_group.stream())
        high = torch.cuda.Stream.priority_range()[1]  # type: ignore[call-arg]
        recapture(lane, query.bucket, lane_group.stream(high), lane_group.stream(high))
        name = f"bulk steps of 16 x 512 on {bulk_group.num_sms} SMs, the lane on {lane_group.num_sms}"
        rows.update(measure(args, lane, query, {name: lambda: main_path.step(bulk[8192])}))
    device = f"BGE-M3, {environment()}"
    print(
        f"\nA lane step of {args.queries} x 14 tokens beside other work ({device}); "
        f"median of {args.rounds} rounds (worst):\n"
    )
    print(
        "| beside | lane step p50 / p99 ms | lane steps/s | that work, units/s alone | with the lane "
        "| its time lost per lane step, ms |\n|---|---:|---:|---:|---:|---:|"
    )
    for name, (p50s, p99s, alone, both, steps) in rows.items():
        rates = " | | "  # the lane alone: no other work to give a rate for
        if alone[0]:
            rounds = list(zip(alone, both, steps, strict=True))
            share = statistics.median(b / a for a, b, _ in rounds)
            lost = [(1 - b / a) / n * 1e3 for a, b, n in rounds]  # the work's share lost, per lane step
            rates = f"{fmt(alone, '{:.1f}', True)} | {fmt(both, '{:.1f}', True)} ({share:.0%}) "
            rates += f"| {fmt(lost, '{:.2f}')}"
        lane = f"{fmt(p50s, '{:.2f}')} / {fmt(p99s, '{:.2f}')} | {fmt(steps, '{:.0f}', True)}"
        print(f"| {name} | {lane} | {rates} |")
    print("\n| GEMM, 8192 rows | cuBLAS µs (TFLOP/s) | Triton µs (TFLOP/s) |\n|---|---:|---:|")
    for name, (k, n) in SHAPES.items():
        a, b, c = x[name], w[name], out[name]
        tflops = 2 * ROWS * k * n / 1e6  # per µs
        cublas = per_call_us(lambda a=a, b=b, c=c: torch.matmul(a, b.t(), out=c), 1)
        plain = per_call_us(tiled[name], 1)
        print(
            f"| {name} {k} → {n} | {cublas:.1f} ({tflops / cublas:.0f}) "
            f"| {plain:.1f} ({tflops / plain:.0f}) |"
        )


def measure(args, lane, query, beside: dict[str, Callable[[], object] | None]):
    """{name: (lane p50s, lane p99s, work's units/s alone, with the lane, lane steps/s)}, a value per
    round, the rows interleaved within each round."""
    rows: dict[str, tuple[list[float], ...]] = {name: ([], [], [], [], []) for name in beside}
    for _ in range(args.rounds):
        for name, launch in beside.items():
            p50s, p99s, alone, both, steps = rows[name]
            rate_alone = contend(lane, query, launch, args.seconds, with_lane=False)[1] if launch else 0.0
            latencies, rate = contend(lane, query, launch, args.seconds)
            latencies.sort()
            p50s.append(percentile(latencies, 0.5))
            p99s.append(percentile(latencies, 0.99))
            alone.append(rate_alone)
            both.append(rate)
            steps.append(len(latencies) / args.seconds)
    return rows


@torch.inference_mode()
def recapture(engine, bucket, stream: torch.cuda.Stream, capture_stream: torch.cuda.Stream) -> None:
    """Run `engine` on `stream` from now on, with `bucket`'s graph captured anew on `capture_stream`
    (a graph keeps the SMs of the stream it was captured on, not of the one it is replayed on)."""
    engine.stream = stream
    engine.graphs = GraphCache(engine._forward_static, engine.policy, capture_stream)
    engine._capture(bucket)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
