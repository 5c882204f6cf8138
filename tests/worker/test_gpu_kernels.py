"""Fused kernels and the attention auto-choice on a real GPU (`pytest -m gpu`).

Each fused step against its eager float32 form on fresh random data (relative error of a bf16
computation: well under 1e-2), and every varlen backend against the padded SDPA reference on
bucket-shaped batches (padding slot and empty sequence slots included).
"""

import itertools
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kembed.worker.engine.attention import (
    ATTENTION_BACKENDS,
    AttentionMetadata,
    AttentionShape,
    cuda_backends,
)
from kembed.worker.engine.attention_choice import RANGES, RoutedAttention, choose_attention
from kembed.worker.engine.fused import add_layer_norm, linear_activation

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


@pytest.mark.parametrize("hidden", [384, 1000, 1024, 4096])
@pytest.mark.parametrize("num_rows", [1, 128, 8192])
def test_add_layer_norm_matches_float32_layer_norm(hidden, num_rows):
    norm = nn.LayerNorm(hidden, eps=1e-5, device=CUDA, dtype=torch.bfloat16)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(num_rows, hidden, device=CUDA, dtype=torch.bfloat16) * 3 + 1
    residual = torch.randn_like(x)
    want = F.layer_norm(x.float() + residual.float(), (hidden,), norm.weight.float(), norm.bias.float(), 1e-5)
    got = add_layer_norm(x, residual, norm)
    assert got.dtype == torch.bfloat16 and torch.isfinite(got).all()
    assert rel_err(got, want) < 1e-2


@pytest.mark.parametrize("activation", ["gelu", "gelu_new", "relu"])
def test_linear_activation_matches_float32_reference(activation):
    linear = nn.Linear(1024, 4096, device=CUDA, dtype=torch.bfloat16)
    x = torch.randn(300, 1024, device=CUDA, dtype=torch.bfloat16)
    eager = {"gelu": F.gelu, "gelu_new": lambda t: F.gelu(t, approximate="tanh"), "relu": F.relu}[activation]
    want = eager(F.linear(x.float(), linear.weight.float(), linear.bias.float()))
    assert rel_err(linear_activation(x, linear, activation, eager), want) < 1e-2


def bucket_batch(lengths, num_tokens, shape: AttentionShape):
    """q/k/v and metadata laid out as the CUDA engine lays out a bucket: real sequences, one padding
    slot up to num_tokens, empty slots up to a power-of-two count, max_seqlen = num_tokens."""
    slots = 1 << (len(lengths) - 1).bit_length()
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    offsets += [num_tokens] * (slots + 2 - len(offsets))
    qkv = torch.randn(num_tokens, shape.num_heads + 2 * shape.num_kv_heads, shape.head_dim, device=CUDA,
                      dtype=torch.bfloat16)  # fmt: skip
    q, k, v = qkv.split([shape.num_heads, shape.num_kv_heads, shape.num_kv_heads], dim=1)
    cu = torch.tensor(offsets, dtype=torch.int32)
    seq_ids = torch.repeat_interleave(torch.arange(len(offsets) - 1), torch.diff(cu).long())
    meta = AttentionMetadata(cu.to(CUDA), num_tokens, seq_ids.to(CUDA), None, None, None, ())
    return q, k, v, meta, offsets


SHAPES = [  # BGE-M3, Qwen3-0.6B, MiniLM
    AttentionShape(16, 16, 64, False),
    AttentionShape(16, 8, 128, True),
    AttentionShape(12, 12, 32, False),
]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("lengths,num_tokens", [([128], 128), ([3, 250, 17, 1], 320), ([500] * 5, 2560)])
def test_every_varlen_backend_matches_sdpa_on_bucket_layouts(shape, lengths, num_tokens):
    backends = cuda_backends(CUDA)
    assert "torch-varlen" in backends
    q, k, v, meta, offsets = bucket_batch(lengths, num_tokens, shape)
    real = offsets[len(lengths)]
    # reference: one float32 SDPA per real sequence
    want = torch.cat([
        F.scaled_dot_product_attention(
            *(t[a:b].float().transpose(0, 1) for t in (q, k, v)), is_causal=shape.is_causal,
            enable_gqa=shape.num_kv_heads != shape.num_heads,
        ).transpose(0, 1)
        for a, b in itertools.pairwise(offsets[: len(lengths) + 1])
    ])  # fmt: skip
    for name, attend in backends.items():
        got = attend(q, k, v, meta, shape.is_causal)
        assert got.shape == q.shape, name
        assert rel_err(got[:real], want) < 1e-2, name


def test_auto_choice_times_every_backend_and_routes_every_size():
    backends = cuda_backends(CUDA)
    shape = SHAPES[1]
    plan = choose_attention(backends, shape, CUDA, torch.bfloat16, max_tokens=8192)
    timed = {(limit, name) for limit, name, _ in plan.timings_us}
    assert timed == {(limit, name) for limit, _ in RANGES for name in backends}
    assert all(us > 0 for _, _, us in plan.timings_us)
    assert plan.routes[-1][0] == sys.maxsize and set(n for _, n in plan.routes) <= set(backends)
    router = RoutedAttention(plan, backends)
    for lengths, num_tokens in [([100], 128), ([500] * 5, 2560)]:
        q, k, v, meta, _ = bucket_batch(lengths, num_tokens, shape)
        chosen = backends[plan.backend_for(num_tokens)]
        assert torch.equal(router(q, k, v, meta, True), chosen(q, k, v, meta, True))


def test_flash_attn_on_a_cpu_is_refused():
    assert "flash-attn" not in ATTENTION_BACKENDS  # only cuda_backends offers it
