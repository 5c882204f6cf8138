"""The small-M Triton GEMM on a real GPU (`pytest -m gpu`): every candidate config of each projection
shape of BGE-M3 and Qwen3-0.6B against float32 torch, with and without bias and GELU, at token counts
that fill, straddle and overflow the M tiles; and CUDA-graph replays with new inputs, which only match
eager if the last program of each split-K tile set its counter back to 0.
"""

import pytest
import torch
import torch.nn.functional as F

from kembed.worker.engine.small_gemm import GemmConfig, candidate_configs, default_config, small_linear

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")

SHAPES = {  # name: (in, out)
    "bge-qkv": (1024, 3072),
    "bge-o": (1024, 1024),
    "bge-up": (1024, 4096),
    "bge-down": (4096, 1024),
    "qwen-qkv": (1024, 4096),
    "qwen-o": (2048, 1024),
    "qwen-gate-up": (1024, 6144),
    "qwen-down": (3072, 1024),
}
NUM_TOKENS = [1, 17, 128, 300]
EPILOGUES = {"plain": (False, None), "bias": (True, None), "bias-gelu": (True, "gelu_tanh")}


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want).norm() / want.norm()).item()


def operands(num_tokens: int, k: int, n: int, has_bias: bool):
    x = torch.randn(num_tokens, k, device=CUDA, dtype=torch.bfloat16)
    weight = torch.randn(n, k, device=CUDA, dtype=torch.bfloat16) / k**0.5
    bias = torch.randn(n, device=CUDA, dtype=torch.bfloat16) if has_bias else None
    return x, weight, bias


def reference(x, weight, bias, activation) -> torch.Tensor:
    y = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
    return F.gelu(y, approximate="tanh") if activation == "gelu_tanh" else y


def check(x, weight, bias, activation, config: GemmConfig | None) -> None:
    got = small_linear(x, weight, bias, activation, config)
    assert got.shape == (x.shape[0], weight.shape[0]) and got.dtype == torch.bfloat16
    err = rel_err(got, reference(x, weight, bias, activation))
    assert err < 1e-2, f"{config}: relative error {err:.2e}"


@pytest.mark.parametrize("epilogue", EPILOGUES, ids=str)
@pytest.mark.parametrize("num_tokens", NUM_TOKENS, ids=lambda m: f"M{m}")
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_default_config_matches_float32_linear(shape, num_tokens, epilogue):
    k, n = SHAPES[shape]
    has_bias, activation = EPILOGUES[epilogue]
    check(*operands(num_tokens, k, n, has_bias), activation, None)


@pytest.mark.parametrize("num_tokens", NUM_TOKENS, ids=lambda m: f"M{m}")
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_every_candidate_config_matches_float32_linear(shape, num_tokens):
    k, n = SHAPES[shape]
    has_bias, activation = EPILOGUES["bias-gelu" if shape == "bge-up" else "bias"]
    x, weight, bias = operands(num_tokens, k, n, has_bias)
    for config in candidate_configs(num_tokens, n, k):
        check(x, weight, bias, activation, config)


def test_uneven_k_matches_float32_linear():
    """K not a multiple of BLOCK_K (masked loads) and N not a multiple of BLOCK_N, split and not."""
    x, weight, bias = operands(40, 1000, 1000, True)
    for split_k in (1, 3):
        check(x, weight, bias, "gelu_tanh", GemmConfig(64, 64, 128, split_k, 4, 3))


def split_configs(num_tokens: int, n: int, k: int) -> list[GemmConfig]:
    configs = [c for c in candidate_configs(num_tokens, n, k) if c.split_k > 1]
    assert configs, "the shape should need split-K"
    return [default_config(num_tokens, n, k), *configs[:2]]


@pytest.mark.parametrize("num_tokens", [16, 128], ids=lambda m: f"M{m}")
def test_replay_matches_eager(num_tokens):
    """Graph replays with new inputs match eager calls: the split-K counters are reset after each call."""
    k, n = SHAPES["bge-down"]
    x, weight, bias = operands(num_tokens, k, n, True)
    for config in split_configs(num_tokens, n, k):
        small_linear(x, weight, bias, "gelu_tanh", config)  # eager first: allocates the workspace
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = small_linear(x, weight, bias, "gelu_tanh", config)
        for _ in range(2):
            x.copy_(torch.randn_like(x))
            graph.replay()
            torch.cuda.synchronize()
            want = small_linear(x, weight, bias, "gelu_tanh", config)
            assert torch.equal(out, want), f"{config}: replay differs from eager"
            assert rel_err(out, reference(x, weight, bias, "gelu_tanh")) < 1e-2


def test_first_call_inside_capture_is_refused():
    x, weight, _ = operands(16, 1024, 1024, False)
    config = GemmConfig(16, 32, 128, 4, 4, 3)  # in no candidate list: nothing allocated it yet
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="eagerly first"), torch.cuda.graph(graph):
        x.add_(1)  # the graph holds a kernel, so ending the capture does not warn of an empty graph
        small_linear(x, weight, None, None, config)
