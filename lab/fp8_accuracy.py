"""Would fp8 GEMMs keep embeddings within cosine 0.999 of float32? `python -P lab/fp8_accuracy.py`
(CPU, a few minutes): the bundled all-MiniLM-L6-v2 (real, trained weights) through sentence-transformers in
float32, then again with chosen nn.Linear layers computing in float8 e4m3 as an H100/H200 fp8 GEMM
would (inputs quantized per token, weights per output channel, fp32 accumulation; or finer: 1 x G
input groups and G x G weight blocks, emulated by quantize-dequantize). Prints the per-row cosine
against the float32 embeddings for each variant. A measurement for docs/benchmarks-history.md, not a test.
"""

import argparse
import sys
from pathlib import Path

import torch
from sentence_transformers import SentenceTransformer

from kembed.worker.config import bundled_model_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))
from corpus import texts  # the e2e tests' 240 texts: edge cases, 8 scripts, code, >20 past 256 tokens

E4M3_MAX = 448.0
VARIANTS = {  # name: (linear layers whose names contain one of these, group size; 0 = per row/channel)
    "all 37 linears, per-token x per-channel": (("dense", "query", "key", "value"), 0),
    "all 37 linears, 1x128 groups x 128x128 blocks": (("dense", "query", "key", "value"), 128),
    "all 37 linears, 1x32 groups x 32x32 blocks": (("dense", "query", "key", "value"), 32),
    "FFN up-projection only (6)": (("intermediate.dense",), 0),
    "attention q/k/v only (18)": (("attention.self",), 0),
}


def fake_quant(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Quantize-dequantize `t` [r, c] to e4m3 with one scale per (rows x cols) block."""
    r, c = t.shape
    blocks = t.reshape(r // rows, rows, c // cols, cols)
    scale = (blocks.abs().amax(dim=(1, 3), keepdim=True) / E4M3_MAX).clamp(min=1e-12)
    return ((blocks / scale).to(torch.float8_e4m3fn).float() * scale).reshape(r, c)


def fp8_forward(linear: torch.nn.Linear, group: int):
    weight = linear.weight.detach().float()
    n, k = weight.shape
    weight_q = fake_quant(weight, 1, k) if group == 0 else fake_quant(weight, min(group, n), min(group, k))
    bias = None if linear.bias is None else linear.bias.detach().float()

    def forward(x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).float()
        flat_q = fake_quant(flat, 1, k if group == 0 else min(group, k))
        out = flat_q @ weight_q.t() + (0 if bias is None else bias)
        return out.reshape(*x.shape[:-1], n).to(x.dtype)

    return forward


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args()
    model_dir = bundled_model_dir()
    corpus = texts()
    reference = SentenceTransformer(str(model_dir), device="cpu").encode(corpus, normalize_embeddings=True)
    print("| fp8 (e4m3) variant | min cosine | mean cosine | rows below 0.999 |\n|---|---:|---:|---:|")
    for name, (select, group) in VARIANTS.items():
        model = SentenceTransformer(str(model_dir), device="cpu")
        for layer_name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and any(s in layer_name for s in select):
                module.forward = fp8_forward(module, group)
        cos = (reference * model.encode(corpus, normalize_embeddings=True)).sum(axis=1)
        print(f"| {name} | {cos.min():.5f} | {cos.mean():.5f} | {(cos < 0.999).sum()} of {len(cos)} |")


if __name__ == "__main__":
    main()
