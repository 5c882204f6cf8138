# ruff: noqa: B023  (lambdas are timed at once, inside the loop)
"""The `triton` attention kernel against torch's varlen kernel on bucket-shaped batches (a GPU, not a test).

For BGE-M3's heads (16 x 64, bidirectional) and Qwen3-0.6B's (16 query heads over 8 key/value heads
of 128, causal), each bucket laid out as the engine lays it out (its real sequences, the padding
slot, empty slots), timed as CUDA-graph replays of 10 calls: torch's varlen kernel with max_seqlen
= the bucket's tokens (what the engine passes), our kernel with the tile `tiles` picks and with
others, and, given `--old FILE`, an earlier version of the kernel module. Each output is checked
against torch's kernel with the exact max_seqlen (relative error of the whole output).
`python -P lab/bench_triton_attention.py [--old path/to/triton_attention.py]`
"""

import argparse
import importlib.util
import inspect
import itertools
import sys
from pathlib import Path

import torch
from torch.nn.attention.varlen import varlen_attn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_layer_kernels import graph_time, ragged

from kembed.worker.engine.layers.attention import AttentionMetadata
from kembed.worker.engine.layers.triton_attention import tiles, varlen_attention

MODELS = (("bge-m3", 16, 16, 64, False), ("qwen3-0.6b", 16, 8, 128, True))
# (label, bucket tokens, bucket sequence slots, real lengths)
BUCKETS = (
    ("4 queries", 64, 4, [16] * 4),
    ("1 x 128", 128, 1, [128]),
    ("1 x 512", 512, 1, [500]),
    ("16 x 64", 1024, 16, [64] * 16),
    ("16 x 256", 4096, 16, [256] * 16),
    ("16 x 512", 8192, 16, [512] * 16),
    ("mixed 32-512", 8192, 64, ragged(8192 - 200, 32, 512)),
    ("1 x 4096", 4096, 1, [4096]),
)
HAS_GQA = "enable_gqa" in inspect.signature(varlen_attn).parameters
OTHER_TILES = (
    (64, 64, 4, 3, True),
    (64, 64, 4, 3, False),
    (128, 64, 8, 3, True),
    (64, 32, 4, 3, True),
    (64, 32, 4, 3, False),
    (32, 64, 4, 3, True),
    (64, 64, 4, 2, True),
)


def bucket_cu(tokens: int, slots: int, lengths: list[int]) -> list[int]:
    """cu_seqlens as the engine builds them: the real sequences, the padding slot, empty slots."""
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return cu + [tokens] * (slots + 2 - len(cu))


def load_old(path: str):
    spec = importlib.util.spec_from_file_location("old_triton_attention", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    backend = getattr(module, "TritonAttention", None) or module.TritonShortAttention  # its earlier name
    return backend()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--old", help="an earlier triton_attention.py to time beside")
    args = parser.parse_args()
    old = load_old(args.old) if args.old else None
    dev, bf = "cuda", torch.bfloat16
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; µs per call (graph replay)")
    print("| heads | bucket | torch-varlen | old triton | triton (tile) | other tiles: µs (rel. err) |")
    print("|---|---|---:|---:|---:|---|")
    for label, heads, kv_heads, dim, causal in MODELS:
        for name, tokens, slots, lengths in BUCKETS:
            cu_list = bucket_cu(tokens, slots, lengths)
            cu = torch.tensor(cu_list, dtype=torch.int32, device=dev)
            qkv = torch.randn(tokens, heads + 2 * kv_heads, dim, device=dev, dtype=bf)
            q, k, v = qkv.split([heads, kv_heads, kv_heads], dim=1)
            longest = max(b - a for a, b in itertools.pairwise(cu_list))
            win = (-1, 0) if causal else (-1, -1)
            gqa: dict[str, bool] = {}
            if kv_heads != heads and HAS_GQA:
                gqa = {"enable_gqa": True}
            elif kv_heads != heads:  # older torch: the engine materialises the shared heads too
                k, v = (x.repeat_interleave(heads // kv_heads, dim=1) for x in (k, v))
            ref = varlen_attn(q, k, v, cu, cu, longest, longest, window_size=win, **gqa)

            def err(out: torch.Tensor, ref: torch.Tensor = ref) -> str:
                real = cu_list[len(lengths)]  # the padding slot's rows differ in no way that matters
                diff = (out[:real].float() - ref[:real].float()).norm() / ref[:real].float().norm()
                return f"{diff.item():.1e}"

            t_torch = graph_time(lambda: varlen_attn(q, k, v, cu, cu, tokens, tokens, window_size=win, **gqa))
            old_cell = "—"
            if old is not None:
                meta = AttentionMetadata(cu, tokens, cu, None, None, None, tuple(cu_list))
                out = old(q, k, v, meta, causal)
                old_cell = f"{graph_time(lambda: old(q, k, v, meta, causal)):.1f} ({err(out)})"
            tile = tiles(tokens, len(cu_list) - 1, dim)
            out = varlen_attention(q, k, v, cu, causal)
            ours = f"{graph_time(lambda: varlen_attention(q, k, v, cu, causal)):.1f} {tile} ({err(out)})"
            others = []
            for other in OTHER_TILES:
                if other == tile:
                    continue
                try:
                    out = varlen_attention(q, k, v, cu, causal, other)
                    t = graph_time(lambda: varlen_attention(q, k, v, cu, causal, other))
                    others.append(f"{other}: {t:.1f} ({err(out)})")
                except Exception as error:  # a tile Triton cannot build (registers, shared memory)
                    others.append(f"{other}: failed {type(error).__name__}")
            print(
                f"| {label} | {name} | {t_torch:.1f} | {old_cell} | {ours} | {'; '.join(others)} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
