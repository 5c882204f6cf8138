"""Which small-M GEMM configs are tried for a shape, and the eager form used without Triton (CPU)."""

import math

import pytest
import torch
import torch.nn.functional as F

from kembed.worker.engine.small_gemm import (
    MAX_SPLIT_K,
    SMEM_BUDGET,
    candidate_configs,
    small_linear,
)

SHAPES = [(1024, 3072), (1024, 1024), (4096, 1024), (1024, 6144), (1000, 1000)]  # (in, out)
NUM_TOKENS = [1, 16, 17, 64, 128, 300, 512]


@pytest.mark.parametrize("num_tokens", NUM_TOKENS, ids=lambda m: f"M{m}")
@pytest.mark.parametrize("k,n", SHAPES, ids=lambda s: str(s))
def test_candidates_fit_the_hardware_and_cover_the_sms(k, n, num_tokens):
    configs = candidate_configs(num_tokens, n, k, num_sms=132)
    assert configs and len(set(configs)) == len(configs)
    for c in configs:
        assert c.block_m >= 16 and c.block_n >= 16 and c.block_k >= 16  # tensor-core minimum
        if num_tokens <= 64:  # one M tile, no wider than the next power of two
            assert c.block_m >= num_tokens and (c.block_m == 16 or c.block_m < 2 * num_tokens)
        assert c.num_stages >= 2 and c.num_stages * (c.block_m + c.block_n) * c.block_k * 2 <= SMEM_BUDGET
        assert 1 <= c.split_k <= min(MAX_SPLIT_K, math.ceil(k / c.block_k))
        num_tiles = math.ceil(num_tokens / c.block_m) * math.ceil(n / c.block_n)
        if c.split_k > 1:  # a split is only added while the programs would not yet fill the SMs twice
            assert num_tiles * c.split_k // 2 < 2 * 132


def test_few_output_tiles_are_split_along_k():
    """1024 outputs in 16-token tiles are 64 or fewer tiles: every candidate splits K to reach the SMs."""
    assert all(c.split_k > 1 for c in candidate_configs(16, 1024, 4096, num_sms=132))


@pytest.mark.parametrize("activation", [None, "gelu_tanh"])
def test_cpu_falls_back_to_eager_linear(activation):
    x = torch.randn(5, 32)
    weight = torch.randn(48, 32)
    bias = torch.randn(48)
    want = F.linear(x, weight, bias)
    if activation:
        want = F.gelu(want, approximate="tanh")
    torch.testing.assert_close(small_linear(x, weight, bias, activation), want)
