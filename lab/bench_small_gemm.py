# ruff: noqa: B023  (lambdas are captured at once, inside the loop)
"""Small-M GEMM (small_gemm_kernel.py, a Triton split-K kernel kept here as an experiment: on the H200 it
lost to cuBLAS in 38 of 40 shapes, docs/benchmarks-history.md) against cuBLAS on the projections of BGE-M3 and
Qwen3-0.6B, for 16..512 tokens: every candidate config is checked against float32 torch (relative
error < 1e-2, failures printed and skipped) and timed as CUDA-graph replays of 20 calls, each call on its
own copy of the weight (more than L2 holds, as a model's layers are), against F.linear (+ GELU) captured
the same way. Prints a markdown table (best config, speed-up, weight-read floor at 4.3 TB/s), and the
default config's time so the heuristic can be judged.
`python -P lab/bench_small_gemm.py [--out FILE]` on a GPU; under 3 minutes on an H200.
"""

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from small_gemm_kernel import candidate_configs, default_config, small_linear

# name: (in, out, has_bias, activation)
SHAPES = {
    "bge-m3 qkv": (1024, 3072, True, None),
    "bge-m3 o": (1024, 1024, True, None),
    "bge-m3 up+gelu": (1024, 4096, True, "gelu_tanh"),
    "bge-m3 down": (4096, 1024, True, None),
    "qwen3 qkv": (1024, 4096, False, None),
    "qwen3 o": (2048, 1024, False, None),
    "qwen3 gate_up": (1024, 6144, False, None),
    "qwen3 down": (3072, 1024, False, None),
}
NUM_TOKENS = (16, 64, 128, 256, 512)
CALLS_PER_GRAPH = 20  # one weight copy per call: 20 x >= 2 MiB exceeds the 50 MiB L2 for all but `o`
REPLAYS = 10
HBM_BYTES_PER_S = 4.3e12


def graph_us(calls) -> float:
    """µs per call of `calls` (one callable per captured call), replayed as one CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in calls:  # warm-up outside capture: compiles, workspaces, cuBLAS handles
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in calls:
            fn()
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPLAYS):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (REPLAYS * len(calls))


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want).norm() / want.norm()).item()


def cublas(x, w, b, activation):
    if activation == "gelu_tanh":  # the engine's path today: one cuBLASLt call with the GELU epilogue
        return torch._addmm_activation(b, x, w.t(), use_gelu=True)
    return F.linear(x, w, b)


def bench_shape(name, k, n, has_bias, activation, num_sms):
    dev = torch.device("cuda")
    weights = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k**0.5 for _ in range(CALLS_PER_GRAPH)]
    biases = [torch.randn(n, device=dev, dtype=torch.bfloat16) if has_bias else None for _ in weights]
    rows = []
    for m in NUM_TOKENS:
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        want = F.linear(x.float(), weights[0].float(), None if biases[0] is None else biases[0].float())
        if activation == "gelu_tanh":
            want = F.gelu(want, approximate="tanh")
        t_cublas = graph_us(
            [lambda w=w, b=b: cublas(x, w, b, activation) for w, b in zip(weights, biases, strict=True)]
        )
        default = default_config(m, n, k, num_sms)
        results = []
        for config in candidate_configs(m, n, k, num_sms):
            try:
                err = rel_err(small_linear(x, weights[0], biases[0], activation, config), want)
                if not err < 1e-2:
                    print(f"  {name} M={m} {config}: relative error {err:.2e}, skipped", flush=True)
                    continue
                calls = [
                    lambda w=w, b=b: small_linear(x, w, b, activation, config)
                    for w, b in zip(weights, biases, strict=True)
                ]
                results.append((graph_us(calls), config))
            except Exception as exc:  # a config that does not compile or launch: report, keep going
                print(f"  {name} M={m} {config}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        floor = 2 * n * k / HBM_BYTES_PER_S * 1e6
        if not results:
            rows.append(f"| {name} | {m} | {t_cublas:.2f} | - | none passed | - | - | {floor:.2f} |")
            continue
        best_us, best = min(results, key=lambda r: r[0])
        default_us = next((t for t, c in results if c == default), float("nan"))
        rows.append(
            f"| {name} | {m} | {t_cublas:.2f} | {best_us:.2f} | {best} | {t_cublas / best_us:.2f}x "
            f"| {default_us:.2f} ({default}) | {floor:.2f} |"
        )
        print(rows[-1], flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the markdown table here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    began = time.perf_counter()
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    header = [
        f"{torch.cuda.get_device_name(0)}, {num_sms} SMs, torch {torch.__version__}; µs per call, "
        f"CUDA-graph replay, {CALLS_PER_GRAPH} distinct weight copies per graph",
        "",
        "| shape | M | cuBLAS µs | best Triton µs | best config | speed-up | default µs (config) "
        "| weight floor µs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(header), flush=True)
    rows = []
    for name, (k, n, has_bias, activation) in SHAPES.items():
        rows += bench_shape(name, k, n, has_bias, activation, num_sms)
        torch.cuda.empty_cache()
    table = "\n".join(header + rows)
    print(f"\n{table}\n\n{time.perf_counter() - began:.0f} s in all", flush=True)
    if args.out:
        args.out.write_text(table + "\n")


if __name__ == "__main__":
    main()
