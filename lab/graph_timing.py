"""CUDA-graph capture and timing shared by the GPU benchmarks that time a chain of calls
(bench_gemm_algos.py, bench_kernel_chain.py, bench_lane_contention.py): the chain runs once on a side
stream (compiles, workspaces, handles outside capture), is captured once as one graph, replayed once,
then timed by CUDA events over replays."""

import statistics
from collections.abc import Callable

import torch


def capture(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """A graph of `fn`, run once first on a side stream so that nothing is compiled or allocated
    inside the capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def per_call_us(fn: Callable[[], object], num_calls: int, replays: int = 20, rounds: int = 3) -> float:
    """Median over `rounds` of one call's time in µs, from `replays` replays of a graph of `fn`, which
    makes `num_calls` calls (kernels, GEMMs) per run."""
    graph = capture(fn)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / replays / num_calls)
    return statistics.median(times)
