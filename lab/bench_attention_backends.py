# ruff: noqa: B023, E501  (lambdas are timed at once, inside the loop; wide measurement printouts)
"""FlashAttention 4 (flash-attn-4) against torch's varlen kernel on bucket-like batches: first-call
compile time, relative error, graph-replay time with max_seqlen = pow2(longest) and = bucket tokens,
and replay == eager. `python -P lab/bench_attention_backends.py` on a Hopper/Blackwell GPU."""

import sys
import time
from pathlib import Path

import torch
from torch.nn.attention.varlen import varlen_attn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_layer_kernels import graph_time, ragged

t0 = time.perf_counter()
from flash_attn.cute.interface import flash_attn_varlen_func  # noqa: E402

print(f"import flash_attn.cute {time.perf_counter() - t0:.1f}s", flush=True)
dev, bf = "cuda", torch.bfloat16
for label, H, KVH, D, causal in [("bge-m3", 16, 16, 64, False), ("qwen3", 16, 8, 128, True)]:
    for T, lens in [
        (8192, ragged(8192 - 200, 32, 512)),
        (4096, [256] * 16),
        (1024, [64] * 16),
        (512, [500]),
        (128, [128]),
    ]:
        pad = T - sum(lens)
        cu_list = [0]
        for n in lens:
            cu_list.append(cu_list[-1] + n)
        if pad:
            cu_list.append(T)
        real = max(max(lens), pad)
        p2 = 1 << (real - 1).bit_length()
        qkv = torch.randn(T, H + 2 * KVH, D, device=dev, dtype=bf)
        q, k, v = qkv.split([H, KVH, KVH], dim=1)
        cu = torch.tensor(cu_list, dtype=torch.int32, device=dev)
        kr = k.repeat_interleave(H // KVH, dim=1) if KVH != H else k
        vr = v.repeat_interleave(H // KVH, dim=1) if KVH != H else v
        win = (-1, 0) if causal else (-1, -1)
        ref = varlen_attn(q, kr, vr, cu, cu, p2, p2, window_size=win)
        t_compile = time.perf_counter()
        out = flash_attn_varlen_func(
            q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=p2, max_seqlen_k=p2, causal=causal
        )
        if isinstance(out, tuple):
            out = out[0]
        torch.cuda.synchronize()
        t_compile = time.perf_counter() - t_compile
        err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
        t_tv = graph_time(
            lambda: varlen_attn(
                q,
                kr if KVH == H else k.repeat_interleave(H // KVH, dim=1),
                vr if KVH == H else v.repeat_interleave(H // KVH, dim=1),
                cu,
                cu,
                p2,
                p2,
                window_size=win,
            )
        )
        t_tv_T = graph_time(
            lambda: varlen_attn(
                q,
                kr if KVH == H else k.repeat_interleave(H // KVH, dim=1),
                vr if KVH == H else v.repeat_interleave(H // KVH, dim=1),
                cu,
                cu,
                T,
                T,
                window_size=win,
            )
        )
        t_fa4 = graph_time(
            lambda: flash_attn_varlen_func(
                q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=p2, max_seqlen_k=p2, causal=causal
            )
        )
        t_fa4_T = graph_time(
            lambda: flash_attn_varlen_func(
                q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=T, max_seqlen_k=T, causal=causal
            )
        )
        # graph replay equals eager on fresh inputs (static buffers refilled)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            gout = flash_attn_varlen_func(
                q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=p2, max_seqlen_k=p2, causal=causal
            )
            gout = gout[0] if isinstance(gout, tuple) else gout
        qkv.copy_(torch.randn_like(qkv))
        g.replay()
        eager = flash_attn_varlen_func(
            q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=p2, max_seqlen_k=p2, causal=causal
        )
        eager = eager[0] if isinstance(eager, tuple) else eager
        print(
            f"{label} T={T} seqs={len(lens)} p2={p2}: first call {t_compile:.2f}s rel_err {err:.2e}; "
            f"torch-varlen {t_tv:.1f}us (max=T {t_tv_T:.1f}), fa4 {t_fa4:.1f}us (max=T {t_fa4_T:.1f}); replay==eager {torch.equal(gout, eager)}",
            flush=True,
        )
