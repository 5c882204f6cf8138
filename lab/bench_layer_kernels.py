# ruff: noqa: B023, E501  (lambdas are timed at once, inside the loop; wide measurement printouts)
"""Where a BGE-M3 layer's time goes on a GPU: torch varlen attention with max_seqlen baked at the
bucket's token count vs the real longest sequence (BGE-M3 and Qwen3 heads), the layer's GEMMs, GELU
separate vs cuBLASLt epilogue, residual add + LayerNorm; each timed as CUDA-graph replays.
`python -P lab/bench_layer_kernels.py` on a GPU (docs/benchmarks-history.md)."""

import random

import torch
import torch.nn.functional as F
from torch.nn.attention.varlen import varlen_attn


def graph_time(fn, n=400, inner=10):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(inner):
            fn()
    g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n // inner):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / n * 1e3


def ragged(total, lo, hi, seed=0):
    rnd = random.Random(seed)
    lens = []
    while True:
        n = rnd.randint(lo, hi)
        if sum(lens) + n > total:
            break
        lens.append(n)
    return lens


def main():
    dev = "cuda"
    bf = torch.bfloat16
    print("== attention: max_seqlen baked = bucket tokens vs pow2(real max) ==")
    for label, H, KVH, D, causal in [("qwen3", 16, 8, 128, True)]:
        for T, lens in [
            (8192, ragged(8192 - 200, 32, 512)),
            (4096, [256] * 16),
            (2048, [256] * 8),
            (1024, [64] * 16),
            (128, [128]),
        ]:
            pad = T - sum(lens)
            cu_list = [0]
            for n in lens:
                cu_list.append(cu_list[-1] + n)
            cu_list.append(T)
            real = max(max(lens), pad)
            p2 = 1 << (real - 1).bit_length()
            q = torch.randn(T, H, D, device=dev, dtype=bf)
            k = torch.randn(T, KVH, D, device=dev, dtype=bf)
            cu = torch.tensor(cu_list, dtype=torch.int32, device=dev)
            kw = dict(window_size=(-1, 0) if causal else (-1, -1))
            if KVH != H:
                k = k.repeat_interleave(H // KVH, dim=1)
            t_bucket = graph_time(lambda: varlen_attn(q, k, k, cu, cu, T, T, **kw))
            t_p2 = graph_time(lambda: varlen_attn(q, k, k, cu, cu, p2, p2, **kw))
            out_a = varlen_attn(q, k, k, cu, cu, T, T, **kw)
            out_b = varlen_attn(q, k, k, cu, cu, p2, p2, **kw)
            same = torch.equal(out_a, out_b)
            print(
                f"{label} T={T} seqs={len(lens)} real_max={real} p2={p2}: max=T {t_bucket:.1f}us, max=p2 {t_p2:.1f}us, equal={same}",
                flush=True,
            )

    print("== GEMMs (BGE-M3 layer shapes), graph replay ==")
    for M in (128, 512, 8192):
        x1 = torch.randn(M, 1024, device=dev, dtype=bf)
        x4 = torch.randn(M, 4096, device=dev, dtype=bf)
        res = []
        for name, x, N in [("qkv", x1, 3072), ("o", x1, 1024), ("up", x1, 4096), ("down", x4, 1024)]:
            w = torch.randn(N, x.shape[1], device=dev, dtype=bf)
            b = torch.randn(N, device=dev, dtype=bf)
            t = graph_time(lambda: F.linear(x, w, b))
            tf = 2 * M * N * x.shape[1] / (t * 1e-6) / 1e12
            res.append(f"{name} {t:.1f}us ({tf:.0f} TF/s)")
        w = torch.randn(4096, 1024, device=dev, dtype=bf)
        b = torch.randn(4096, device=dev, dtype=bf)
        t_sep = graph_time(lambda: F.gelu(F.linear(x1, w, b)))
        t_fused = graph_time(lambda: torch._addmm_activation(b, x1, w.t(), use_gelu=True))
        h = torch.randn(M, 1024, device=dev, dtype=bf)
        r = torch.randn_like(h)
        lw = torch.randn(1024, device=dev, dtype=bf)
        lb = torch.randn(1024, device=dev, dtype=bf)
        t_ln = graph_time(lambda: F.layer_norm(h + r, (1024,), lw, lb, 1e-5))
        t_ln_only = graph_time(lambda: F.layer_norm(h, (1024,), lw, lb, 1e-5))
        print(
            f"M={M}: "
            + ", ".join(res)
            + f"; up+gelu {t_sep:.1f}us vs addmm_activation {t_fused:.1f}us; add+LN {t_ln:.1f}us, LN {t_ln_only:.1f}us",
            flush=True,
        )


if __name__ == "__main__":
    main()
