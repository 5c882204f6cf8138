"""What a kernel boundary costs inside a CUDA graph, and what programmatic dependent launch (PDL) wins
back: a chain of 96 Triton kernels, each reading a weight of its own (1 or 4 MiB, 96 distinct, more
than L2 holds) and one value the previous kernel wrote, captured as one graph; per-kernel time from
replays (median of 3 rounds), against the time to read the weight at 4.3 TB/s. Variants: plain launch;
PDL launch (`launch_pdl=True`) waiting (`gdc_wait`) before any load; PDL launch loading the weight
before the wait (only the previous kernel's output is read after it).
`python -P lab/bench_kernel_chain.py` on a GPU of compute capability >= 9.0 (~10 s).
"""

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

sys.path.insert(0, str(Path(__file__).resolve().parent))
from graph_timing import per_call_us

NUM_KERNELS = 96
PROGRAMS = 528  # 4 per SM of an H100/H200
HBM_BYTES_PER_S = 4.3e12


@triton.jit
def _stream(X, W, Y, PDL: tl.constexpr, WEIGHT_FIRST: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    if WEIGHT_FIRST:
        w = tl.load(W + offs)
        if PDL:
            gdc_wait()
    else:
        if PDL:
            gdc_wait()
        w = tl.load(W + offs)
    x = tl.load(X + pid)
    if PDL:
        gdc_launch_dependents()
    tl.store(Y + pid, tl.sum(w.to(tl.float32), axis=0) * 1e-9 + x)


def main() -> None:
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}\n")
    print("| weight per kernel | plain µs | PDL, wait first µs | PDL, weight before wait µs | read µs |")
    print("|---:|---:|---:|---:|---:|")
    for mib in (1, 4):
        block = mib * 2**20 // 2 // PROGRAMS
        block = 1 << (block.bit_length() - 1)  # a power of two for tl.arange
        weights = [
            torch.randn(PROGRAMS * block, device="cuda", dtype=torch.bfloat16) for _ in range(NUM_KERNELS)
        ]
        buffers = [torch.zeros(PROGRAMS, device="cuda") for _ in range(2)]
        row = []
        for pdl, weight_first in ((False, False), (True, False), (True, True)):

            def chain(pdl=pdl, weight_first=weight_first, block=block, weights=weights, buffers=buffers):
                for i, w in enumerate(weights):
                    _stream[(PROGRAMS,)](
                        buffers[i % 2], w, buffers[(i + 1) % 2],
                        PDL=pdl, WEIGHT_FIRST=weight_first, BLOCK=block, launch_pdl=pdl,
                    )  # fmt: skip

            row.append(per_call_us(chain, NUM_KERNELS))
        size = PROGRAMS * block * 2
        floor = size / HBM_BYTES_PER_S * 1e6
        cells = " | ".join(f"{us:.2f}" for us in [*row, floor])
        print(f"| {size / 2**20:.1f} MiB | {cells} |", flush=True)


if __name__ == "__main__":
    main()
