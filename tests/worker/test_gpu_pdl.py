"""The Triton kernels launched with programmatic dependent launch (PDL) on a real GPU (`pytest -m gpu`).

PDL changes when a kernel starts, never what it computes: each kernel launched with it must give the
bitwise result of the plain launch, match its eager float32 form, and, chained with GEMMs and with
itself inside a CUDA graph (where a missing wait would read a half-written input), replay to the
plain-launch graph's result for fresh inputs each time. Needs compute capability >= 9.0.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kembed.worker.engine import pdl
from kembed.worker.engine.fused import add_layer_norm
from kembed.worker.engine.fused_decoder import qk_norm_rope, rms_norm, silu_mul
from kembed.worker.engine.qwen3 import RMSNorm
from kembed.worker.engine.rope import RotaryEmbedding, rotate

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")
BF16 = torch.bfloat16
HIDDEN, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 1024, 16, 8, 128  # Qwen3-0.6B's layer shape
EPS = 1e-6


@pytest.fixture(scope="module", autouse=True)
def hopper():
    if torch.cuda.get_device_capability(CUDA) < pdl.MIN_CAPABILITY:
        pytest.skip("PDL needs compute capability 9.0 (Hopper) or newer")
    # On Hopper with the Triton the engine is built for, PDL must be available, not quietly off.
    assert pdl.HAS_GDC, "this Triton has no triton.language.extra.cuda.gdc_wait"
    assert pdl.is_supported(CUDA)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def weight(n: int) -> torch.Tensor:
    return torch.empty(n, device=CUDA, dtype=BF16).uniform_(0.5, 1.5)


def case_add_layer_norm(num_rows: int):
    norm = nn.LayerNorm(HIDDEN, eps=1e-5, device=CUDA, dtype=BF16)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(num_rows, HIDDEN, device=CUDA, dtype=BF16) * 3 + 1
    residual = torch.randn_like(x)
    want = F.layer_norm(x.float() + residual.float(), (HIDDEN,), norm.weight.float(), norm.bias.float(), 1e-5)
    return (lambda use_pdl: (add_layer_norm(x, residual, norm, use_pdl=use_pdl),)), (want,)


def case_rms_norm(num_rows: int):
    w = weight(HIDDEN)
    x = torch.randn(num_rows, HIDDEN, device=CUDA, dtype=BF16) * 4
    residual = torch.randn_like(x)
    total = x.float() + residual.float()
    want = total * torch.rsqrt(total.pow(2).mean(-1, keepdim=True) + EPS) * w.float()
    return (lambda use_pdl: rms_norm(x, w, EPS, residual=residual, use_pdl=use_pdl)), (want, total)


def case_qk_norm_rope(num_rows: int):
    qkv = torch.randn(num_rows, (NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM, device=CUDA, dtype=BF16)
    q_norm, k_norm = RMSNorm(HEAD_DIM, EPS).to(CUDA), RMSNorm(HEAD_DIM, EPS).to(CUDA)
    with torch.no_grad():
        q_norm.weight.uniform_(0.5, 1.5)
        k_norm.weight.uniform_(0.5, 1.5)
    cos, sin = RotaryEmbedding(HEAD_DIM, 4096, 1e6).to(CUDA)(torch.randint(0, 4096, (num_rows,), device=CUDA))
    q_ref, k_ref, _ = qkv.float().split([NUM_HEADS * HEAD_DIM] + [NUM_KV_HEADS * HEAD_DIM] * 2, dim=1)
    want = (
        rotate(q_norm(q_ref.view(num_rows, NUM_HEADS, HEAD_DIM)), cos, sin),
        rotate(k_norm(k_ref.view(num_rows, NUM_KV_HEADS, HEAD_DIM)), cos, sin),
    )
    qw, kw, cos, sin = q_norm.weight.to(BF16), k_norm.weight.to(BF16), cos.to(BF16), sin.to(BF16)
    return (
        lambda use_pdl: qk_norm_rope(qkv, qw, kw, EPS, cos, sin, NUM_HEADS, NUM_KV_HEADS, use_pdl=use_pdl)
    ), want


def case_silu_mul(num_rows: int):
    gate_up = torch.randn(num_rows, 2 * 3072, device=CUDA, dtype=BF16) * 3
    gate, up = gate_up.float().chunk(2, dim=-1)
    return (lambda use_pdl: (silu_mul(gate_up, use_pdl=use_pdl),)), (F.silu(gate) * up,)


CASES = {
    "add_layer_norm": case_add_layer_norm,
    "rms_norm": case_rms_norm,
    "qk_norm_rope": case_qk_norm_rope,
    "silu_mul": case_silu_mul,
}


@pytest.mark.parametrize("num_rows", [1, 128, 4096], ids=lambda n: f"{n}rows")
@pytest.mark.parametrize("name", list(CASES))
def test_pdl_launch_matches_the_plain_launch_and_the_eager_form(name, num_rows):
    run, want = CASES[name](num_rows)
    plain = run(False)
    with_pdl = run(True)
    by_default = run(None)  # the device's choice: on, here, unless KEMBED_PDL=0
    for got_pdl, got_plain, got_default, reference in zip(with_pdl, plain, by_default, want, strict=True):
        assert torch.equal(got_pdl, got_plain)
        assert torch.equal(got_default, got_plain)
        assert torch.isfinite(got_pdl).all() and rel_err(got_pdl, reference) < 1e-2


class Chain:
    """Two decoder-like and two encoder-like layers in the engine's order (a GEMM before each of our
    kernels, attention left out), then 8 add+LayerNorms and 8 RMSNorms back to back: the boundaries
    where a PDL kernel may start early, GEMM to Triton and Triton to Triton."""

    def __init__(self, num_tokens: int) -> None:
        inter, qkv_width = 3072, (NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM
        self.num_tokens = num_tokens
        self.layers = [
            {
                "qkv": torch.randn(qkv_width, HIDDEN, device=CUDA, dtype=BF16) / HIDDEN**0.5,
                "o": torch.randn(HIDDEN, NUM_HEADS * HEAD_DIM, device=CUDA, dtype=BF16) / HIDDEN**0.5,
                "gate_up": torch.randn(2 * inter, HIDDEN, device=CUDA, dtype=BF16) / HIDDEN**0.5,
                "down": torch.randn(HIDDEN, inter, device=CUDA, dtype=BF16) / inter**0.5,
                "input_norm": weight(HIDDEN),
                "post_norm": weight(HIDDEN),
                "q_norm": weight(HEAD_DIM),
                "k_norm": weight(HEAD_DIM),
            }
            for _ in range(2)
        ]
        self.ln = nn.LayerNorm(HIDDEN, eps=1e-5, device=CUDA, dtype=BF16)
        with torch.no_grad():
            self.ln.weight.uniform_(0.5, 1.5)
            self.ln.bias.uniform_(-0.5, 0.5)
        self.ffn = torch.randn(HIDDEN, HIDDEN, device=CUDA, dtype=BF16) / HIDDEN**0.5
        self.rope = RotaryEmbedding(HEAD_DIM, 4096, 1e6).to(CUDA)
        self.tail_norm = weight(HIDDEN)

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, use_pdl: bool) -> torch.Tensor:
        cos, sin = (t.to(BF16) for t in self.rope(positions))  # computed in the graph, as in the engine
        delta = None
        for p in self.layers:  # decoder-like: rms_norm, GEMM, qk_norm_rope, GEMM, rms_norm, GEMM, silu_mul
            h, x = rms_norm(x, p["input_norm"], EPS, residual=delta, use_pdl=use_pdl)
            q, k = qk_norm_rope(h @ p["qkv"].T, p["q_norm"], p["k_norm"], EPS, cos, sin, NUM_HEADS,
                                NUM_KV_HEADS, use_pdl=use_pdl)  # fmt: skip
            attn = q.reshape(self.num_tokens, -1) + k.repeat_interleave(2, dim=1).reshape(self.num_tokens, -1)
            h, x = rms_norm(attn @ p["o"].T, p["post_norm"], EPS, residual=x, use_pdl=use_pdl)
            delta = silu_mul(h @ p["gate_up"].T, use_pdl=use_pdl) @ p["down"].T
        assert delta is not None
        for _ in range(2):  # encoder-like: GEMM, add+LayerNorm
            x = add_layer_norm(x @ self.ffn.T, x, self.ln, use_pdl=use_pdl)
        for _ in range(8):  # Triton to Triton, each reading the one before's output
            x = add_layer_norm(x, delta, self.ln, use_pdl=use_pdl)
        for _ in range(8):
            x, delta = rms_norm(x, self.tail_norm, EPS, residual=delta, use_pdl=use_pdl)
        return x.float() + delta.float()


def capture(chain: Chain, static_x: torch.Tensor, static_positions: torch.Tensor, use_pdl: bool):
    """(graph, its output) for the chain, warmed up (compiled) on a side stream first."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            chain(static_x, static_positions, use_pdl)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain(static_x, static_positions, use_pdl)
    return graph, out


@pytest.mark.parametrize("num_tokens", [128, 4096], ids=lambda n: f"{n}tokens")
def test_graph_of_pdl_kernels_replays_to_the_plain_launch_result(num_tokens):
    torch.manual_seed(0)
    chain = Chain(num_tokens)
    static_x = torch.randn(num_tokens, HIDDEN, device=CUDA, dtype=BF16)
    static_positions = torch.arange(num_tokens, device=CUDA)
    with torch.inference_mode():
        graph_pdl, out_pdl = capture(chain, static_x, static_positions, use_pdl=True)
        graph_plain, out_plain = capture(chain, static_x, static_positions, use_pdl=False)
        previous = None
        for _ in range(10):  # fresh inputs each replay: a graph that read stale or half-written data differs
            static_x.copy_(torch.randn(num_tokens, HIDDEN, device=CUDA, dtype=BF16))
            static_positions.copy_(torch.randint(0, 4096, (num_tokens,), device=CUDA))
            graph_plain.replay()
            want = out_plain.clone()
            graph_pdl.replay()
            torch.cuda.synchronize()
            assert torch.isfinite(out_pdl).all()
            assert torch.equal(out_pdl, want)
            eager = chain(static_x, static_positions, use_pdl=False)  # outside any graph
            assert rel_err(out_pdl, eager) < 1e-2
            assert previous is None or not torch.equal(out_pdl, previous)
            previous = out_pdl.clone()
