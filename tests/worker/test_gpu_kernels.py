"""Fused kernels (encoder and decoder layers) and the attention auto-choice on a real GPU (`pytest -m gpu`).

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

from kembed.worker.buckets import BucketTable
from kembed.worker.engine.attention_choice import (
    RANGES,
    RoutedAttention,
    choose_attention,
    probe_inputs,
)
from kembed.worker.engine.kernels.fused import add_layer_norm, linear_activation
from kembed.worker.engine.kernels.fused_decoder import qk_norm_rope, rms_norm, silu_mul
from kembed.worker.engine.layers.attention import AttentionShape
from kembed.worker.engine.layers.attention_backends import cuda_backends
from kembed.worker.engine.layers.norms import RMSNorm
from kembed.worker.engine.layers.rope import RotaryEmbedding, rotate

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


TABLE = BucketTable(16384, 256)


def bucket_batch(lengths, num_tokens, shape: AttentionShape):
    """q/k/v and metadata laid out as the CUDA engine lays out the bucket (`probe_inputs`: one padding
    slot, empty slots up to a power-of-two count, max_seqlen = num_tokens), and the offsets."""
    q, k, v, meta = probe_inputs(shape, tuple(lengths), TABLE, CUDA, torch.bfloat16)
    assert q.shape[0] == num_tokens
    return q, k, v, meta, meta.cu_seqlens.tolist()


SHAPES = [  # BGE-M3, Qwen3-0.6B, MiniLM
    AttentionShape(16, 16, 64, False),
    AttentionShape(16, 8, 128, True),
    AttentionShape(12, 12, 32, False),
]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize(
    "lengths,num_tokens",
    [([128], 128), ([3, 250, 17, 1], 320), ([500] * 5, 2560), ([300, 7, 513, 1000], 2048)],
)
def test_every_varlen_backend_matches_sdpa_on_bucket_layouts(shape, lengths, num_tokens):
    backends = cuda_backends(CUDA, shape, compile_kernels=True)
    assert {"torch-varlen", "triton"} <= set(backends)
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
    shape = SHAPES[1]
    backends = cuda_backends(CUDA, shape, compile_kernels=True)
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


@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("hidden", [256, 1000, 1024])
def test_rms_norm_kernel_matches_the_eager_rms_norm(hidden, with_residual):
    norm = RMSNorm(hidden, 1e-6).to(CUDA)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    weight = norm.weight.to(torch.bfloat16)
    x = torch.randn(333, hidden, device=CUDA, dtype=torch.bfloat16) * 4
    residual = torch.randn_like(x) if with_residual else None
    total_want = x.float() + (residual.float() if with_residual else 0)
    want = norm(total_want)  # float32 all the way
    got, total = rms_norm(x, weight, 1e-6, residual=residual)
    assert rel_err(got, want) < 1e-2 and rel_err(total, total_want) < 1e-2


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim"), [(16, 8, 128), (12, 4, 64), (8, 4, 32), (14, 2, 64)]
)
def test_qk_norm_rope_kernel_matches_norm_then_rotate(num_heads, num_kv_heads, head_dim):
    num_tokens = 300
    qkv = torch.randn(
        num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, device=CUDA, dtype=torch.bfloat16
    )
    q_norm, k_norm = RMSNorm(head_dim, 1e-6).to(CUDA), RMSNorm(head_dim, 1e-6).to(CUDA)
    with torch.no_grad():
        q_norm.weight.uniform_(0.5, 1.5)
        k_norm.weight.uniform_(0.5, 1.5)
    rope = RotaryEmbedding(head_dim, 4096, 1e6).to(CUDA)
    positions = torch.randint(0, 4096, (num_tokens,), device=CUDA)
    cos, sin = rope(positions)
    sizes = [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]
    q_ref, k_ref, _ = qkv.float().split(sizes, dim=1)
    want_q = rotate(q_norm(q_ref.view(num_tokens, num_heads, head_dim)), cos, sin)
    want_k = rotate(k_norm(k_ref.view(num_tokens, num_kv_heads, head_dim)), cos, sin)
    bf = torch.bfloat16
    q, k = qk_norm_rope(qkv, q_norm.weight.to(bf), k_norm.weight.to(bf), 1e-6, cos.to(bf), sin.to(bf),
                        num_heads, num_kv_heads)  # fmt: skip
    assert q.shape == want_q.shape and k.shape == want_k.shape
    assert rel_err(q, want_q) < 1e-2 and rel_err(k, want_k) < 1e-2


@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), [(12, 2, 128), (4, 2, 64)])
def test_qk_rope_kernel_without_weights_rotates_the_heads_as_they_are(num_heads, num_kv_heads, head_dim):
    """Qwen2's and EuroBERT's q and k: no per-head norm, RoPE alone (the kernel's NORM=False)."""
    num_tokens = 300
    qkv = torch.randn(
        num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, device=CUDA, dtype=torch.bfloat16
    )
    rope = RotaryEmbedding(head_dim, 4096, 1e6).to(CUDA)
    cos, sin = rope(torch.randint(0, 4096, (num_tokens,), device=CUDA))
    sizes = [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]
    q_ref, k_ref, _ = qkv.float().split(sizes, dim=1)
    want_q = rotate(q_ref.reshape(num_tokens, num_heads, head_dim), cos, sin)
    want_k = rotate(k_ref.reshape(num_tokens, num_kv_heads, head_dim), cos, sin)
    bf = torch.bfloat16
    q, k = qk_norm_rope(qkv, None, None, 1e-6, cos.to(bf), sin.to(bf), num_heads, num_kv_heads)
    assert q.shape == want_q.shape and k.shape == want_k.shape
    assert rel_err(q, want_q) < 1e-2 and rel_err(k, want_k) < 1e-2


@pytest.mark.parametrize("inter", [512, 1000, 3072])
def test_silu_mul_kernel_matches_silu_gate_times_up(inter):
    gate_up = torch.randn(257, 2 * inter, device=CUDA, dtype=torch.bfloat16) * 3
    gate, up = gate_up.float().chunk(2, dim=-1)
    assert rel_err(silu_mul(gate_up), F.silu(gate) * up) < 1e-2
