"""Does one persistent kernel beat three for a BERT feed-forward block at few tokens? (a GPU, not a test)

BGE-M3's FFN shape (1024 -> 4096 -> 1024, exact GELU, LayerNorm), bf16. For each token count M, one
CUDA graph runs LAYERS feed-forward blocks back to back, each with its own weights (so they come from
HBM, as in a real step), through
- the engine's path: cuBLASLt up-projection + GELU epilogue, cuBLAS down-projection, Triton add +
  LayerNorm (worker/engine/kernels/fused.py), and
- `persistent_mlp_kernel` (persistent_mlp_kernel.py), for several tile configurations.
Both are checked against float32 eager on the same weights (cosine per row, max abs error), then
timed by CUDA events over graph replays in interleaved rounds; printed: µs per block, median round
(worst round).
`python -P lab/bench_persistent_mlp.py`
"""

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from persistent_mlp_kernel import PersistentMlp

from kembed.worker.engine.kernels.fused import add_layer_norm

HIDDEN, INTER, EPS = 1024, 4096, 1e-5
# (BM, BN1, BN2, BK, SPLIT, num_warps, num_stages)
CONFIGS = {
    16: [(16, 32, 32, 64, 4, 4, 4), (16, 32, 64, 64, 8, 4, 4), (16, 64, 64, 64, 8, 4, 3)],
    64: [(64, 32, 64, 64, 8, 4, 4), (64, 64, 64, 64, 8, 4, 3), (64, 32, 32, 64, 4, 4, 4)],
    128: [(128, 32, 64, 64, 8, 4, 3), (128, 64, 64, 64, 8, 8, 3), (64, 32, 64, 64, 4, 4, 4)],
    256: [(128, 64, 64, 64, 4, 8, 3), (128, 32, 64, 64, 4, 4, 3)],
    512: [(128, 64, 64, 64, 2, 8, 3), (128, 128, 128, 64, 4, 8, 3)],
}


class Block:
    def __init__(self, device: torch.device, gen: torch.Generator) -> None:
        def rand(*shape: int, scale: float) -> torch.Tensor:
            return (torch.randn(*shape, generator=gen, device=device) * scale).to(torch.bfloat16)

        self.w1 = rand(INTER, HIDDEN, scale=HIDDEN**-0.5)
        self.b1 = rand(INTER, scale=0.02)
        self.w2 = rand(HIDDEN, INTER, scale=INTER**-0.5)
        self.b2 = rand(HIDDEN, scale=0.02)
        self.norm = nn.LayerNorm(HIDDEN, eps=EPS, device=device, dtype=torch.bfloat16)
        with torch.no_grad():
            self.norm.weight.copy_(1 + rand(HIDDEN, scale=0.1).float())
            self.norm.bias.copy_(rand(HIDDEN, scale=0.1).float())

    def engine(self, x: torch.Tensor) -> torch.Tensor:
        h = torch._addmm_activation(self.b1, x, self.w1.t(), use_gelu=True)
        return add_layer_norm(F.linear(h, self.w2, self.b2), x, self.norm)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        h = F.gelu(x @ self.w1.float().t() + self.b1.float())
        out = h @ self.w2.float().t() + self.b2.float() + x
        return F.layer_norm(out, (HIDDEN,), self.norm.weight.float(), self.norm.bias.float(), EPS)

    def persistent(self, x: torch.Tensor, kernel: PersistentMlp) -> torch.Tensor:
        return kernel(x, self.w1, self.b1, self.w2, self.b2, self.norm.weight, self.norm.bias, EPS, True)


def graph_of(fn, x: torch.Tensor) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(x)
    return graph, out


def time_graph(graph: torch.cuda.CUDAGraph, replays: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / replays


def debug(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def cos_rows(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(F.cosine_similarity(a.float(), b.float(), dim=1).min())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=sorted(CONFIGS))
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--replays", type=int, default=50)
    parser.add_argument(
        "--configs", type=int, default=9, help="at most this many configurations a token count"
    )
    args = parser.parse_args()
    device = torch.device("cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    gen = torch.Generator(device=device).manual_seed(0)
    blocks = [Block(device, gen) for _ in range(args.layers)]
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {sms} SMs, {args.layers} blocks a graph"
    )
    print("| tokens | path | µs per block, median (worst) | min cos vs fp32 | max abs err |")
    print("|---:|---|---:|---:|---:|")
    with torch.inference_mode():
        for m in args.tokens:
            x = torch.randn(m, HIDDEN, generator=gen, device=device).to(torch.bfloat16)
            ref = blocks[0].reference(x)
            contenders = {}

            def chain(fn):
                def run(x: torch.Tensor) -> torch.Tensor:
                    for block in blocks:
                        x = fn(block, x)
                    return x

                return run

            out = blocks[0].engine(x)
            graph = graph_of(chain(Block.engine), x)[0]
            graph.replay()
            torch.cuda.synchronize()
            debug(f"{m} engine: graph replay ok")
            contenders["engine (3 kernels)"] = (graph, out, None)
            for config in CONFIGS.get(m, CONFIGS[128])[: args.configs]:
                bm, bn1, bn2, _, split, _, _ = config
                mpad = -(-m // bm) * bm
                work = max((mpad // bm) * (INTER // bn1), (mpad // bm) * (HIDDEN // bn2) * split)
                for programs in sorted({min(sms, work), sms}):
                    kernels = [PersistentMlp(m, HIDDEN, INTER, device, config, programs) for _ in blocks]
                    by_block = dict(zip(map(id, blocks), kernels, strict=True))

                    def one(block, x, by_block=by_block):
                        return block.persistent(x, by_block[id(block)])

                    label = f"persistent {config} x{programs}"
                    out = blocks[0].persistent(x, kernels[0])
                    torch.cuda.synchronize()
                    debug(f"{m} {label}: one block eager ok")
                    chain(one)(x)
                    torch.cuda.synchronize()
                    debug(f"{m} {label}: chain eager ok")
                    graph = graph_of(chain(one), x)[0]
                    graph.replay()
                    torch.cuda.synchronize()
                    debug(f"{m} {label}: graph replay ok")
                    # the graph holds raw pointers into the kernels' workspaces: keep them alive
                    contenders[label] = (graph, out, kernels)
            times: dict[str, list[float]] = {name: [] for name in contenders}
            for _ in range(args.rounds):
                for name, (graph, _, _) in contenders.items():
                    times[name].append(time_graph(graph, args.replays) / args.layers)
            for name, (_, out, _) in contenders.items():
                err = float((out.float() - ref).abs().max())
                print(
                    f"| {m} | {name} | {np.median(times[name]):.2f} ({max(times[name]):.2f}) "
                    f"| {cos_rows(out, ref):.5f} | {err:.4f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
