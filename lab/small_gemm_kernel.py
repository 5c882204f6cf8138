"""bf16 GEMM for few tokens (M of 1..512): y = act(x @ W.T + b) with the weight read spread over every SM.

At 128 tokens a BGE-M3 projection is bound by reading its weight (6 MiB for QKV: 1.5 µs at 4.3 TB/s),
yet cuBLAS takes ~4.6 µs: its tiles are sized for large M, so too few SMs stream the weight. Here each
program owns a narrow BLOCK_N slice of the output and, where N / BLOCK_N alone gives too few programs,
SPLIT_K programs share one output tile along K. Those write float32 partial tiles to a workspace and
bump a per-tile counter; the last to arrive sums the partials in split order (deterministic), adds the
bias, applies GELU(tanh) if asked, writes bf16 and sets the counter back to 0, so the next call (or the
next CUDA-graph replay) starts from zero. No program ever waits on another: nothing can deadlock.

Workspaces and counters are cached per (device, M, N, K, config) and allocated on the first eager call
of that key; a key first met inside CUDA-graph capture raises, because memory taken there belongs to the
graph's pool. Calls sharing a key must be ordered on one stream (as a model's layers are): two in flight
at once would share counters. Where Triton is not installed (the CPU build of torch), the eager form runs.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only torch builds ship without Triton
    triton = None

ACTIVATIONS = (None, "gelu_tanh")
MAX_SPLIT_K = 8  # more partial tiles cost more workspace traffic than the extra programs win back
# Bytes of pipelined operand tiles per program: H100/H200 give a block up to 227 KiB of shared memory;
# the rest stays free for the epilogue's layout conversion and a second resident program on small tiles.
SMEM_BUDGET = 160 * 1024
# Rough H200 figures for ordering candidates before measurements exist (lab/bench_small_gemm.py).
HBM_BYTES_PER_S = 4.3e12
L2_BYTES_PER_S = 12e12
MMA_FLOPS = 400e12


@dataclass(frozen=True)
class GemmConfig:
    """One launch shape of the kernel."""

    block_m: int  # tokens per program; >= 16, the smallest tensor-core tile
    block_n: int  # output features per program; small so that N / block_n programs cover the SMs
    block_k: int  # K step of the pipelined loop
    split_k: int  # programs sharing one output tile along K; > 1 adds the workspace reduction
    num_warps: int
    num_stages: int  # K steps in flight (shared-memory ring of x and W tiles)

    def __str__(self) -> str:
        return (
            f"m{self.block_m}n{self.block_n}k{self.block_k}s{self.split_k}w{self.num_warps}p{self.num_stages}"
        )


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _tile_shapes(num_tokens: int) -> list[tuple[int, int, int]]:
    """(block_m, block_n, block_k) worth trying at this M: one M tile up to 64 tokens, then 64 or 128."""
    if num_tokens <= 64:
        block_m = max(16, _next_pow2(num_tokens))
        return [(block_m, bn, bk) for bn, bk in ((16, 256), (32, 128), (32, 256), (64, 128), (128, 64))]
    return [(bm, bn, bk) for bm in (64, 128) for bn, bk in ((32, 128), (64, 128), (128, 64))]


def estimated_seconds(num_tokens: int, n: int, k: int, config: GemmConfig, num_sms: int) -> float:
    """A rough time model, only to order candidates (and so pick the default) before a measured table:
    the slowest of weight streaming (slowed by idle SMs), L2 reads of x tiles, and tensor-core time, as
    the pipelined loop overlaps them; then the split reduction's partial tiles, which come after."""
    m_pad = math.ceil(num_tokens / config.block_m) * config.block_m
    n_tiles = math.ceil(n / config.block_n)
    num_programs = (m_pad // config.block_m) * n_tiles * config.split_k
    hbm = 2 * (n * k + num_tokens * k + num_tokens * n) / min(1.0, num_programs / num_sms)
    partials = 8 * config.split_k * m_pad * n_tiles * config.block_n if config.split_k > 1 else 0
    l2 = 2 * n_tiles * m_pad * k
    mma = 2 * m_pad * n_tiles * config.block_n * k / (MMA_FLOPS if config.block_m >= 64 else MMA_FLOPS / 2)
    return max(hbm / HBM_BYTES_PER_S, l2 / L2_BYTES_PER_S, mma) + partials / L2_BYTES_PER_S


def candidate_configs(num_tokens: int, n: int, k: int, num_sms: int = 132) -> list[GemmConfig]:
    """Configs worth measuring for x [num_tokens, k] @ W[n, k].T, best estimate first.

    Per tile shape: the smallest power-of-two split that gives at least one program per SM, and twice
    that while the count stays under two per SM (more programs per SM hide more memory latency)."""
    configs = []
    for block_m, block_n, block_k in _tile_shapes(num_tokens):
        num_stages = min(4, SMEM_BUDGET // ((block_m + block_n) * block_k * 2))
        num_warps = 4 if block_m * block_n <= 64 * 64 else 8
        num_tiles = math.ceil(num_tokens / block_m) * math.ceil(n / block_n)
        max_split = min(MAX_SPLIT_K, math.ceil(k / block_k))
        split = 1
        while num_tiles * split < num_sms and split * 2 <= max_split:
            split *= 2
        splits = [split] + ([split * 2] if split * 2 <= max_split and num_tiles * split < 2 * num_sms else [])
        for split_k in splits:
            configs.append(GemmConfig(block_m, block_n, block_k, split_k, num_warps, num_stages))
    return sorted(configs, key=lambda c: estimated_seconds(num_tokens, n, k, c, num_sms))


def default_config(num_tokens: int, n: int, k: int, num_sms: int = 132) -> GemmConfig:
    return candidate_configs(num_tokens, n, k, num_sms)[0]


def small_linear(
    x: torch.Tensor,  # [num_tokens, in], bf16, rows contiguous
    weight: torch.Tensor,  # [out, in], nn.Linear layout
    bias: torch.Tensor | None = None,  # [out]
    activation: str | None = None,  # None or "gelu_tanh"
    config: GemmConfig | None = None,  # None: default_config for this shape and device
) -> torch.Tensor:
    """activation(x @ weight.T + bias) as [num_tokens, out] in x's dtype."""
    assert activation in ACTIVATIONS, activation
    if triton is None or not x.is_cuda:
        y = F.linear(x, weight, bias)
        return F.gelu(y, approximate="tanh") if activation == "gelu_tanh" else y
    assert x.dim() == 2 and x.stride(1) == 1 and weight.stride(1) == 1 and x.shape[1] == weight.shape[1]
    num_tokens, k = x.shape
    n = weight.shape[0]
    assert num_tokens * max(n, k) < 2**31, "offsets are 32-bit"
    if config is None:
        config = _default_config_cached(num_tokens, n, k, _num_sms(x.device))
    out = x.new_empty(num_tokens, n)
    num_tiles = math.ceil(num_tokens / config.block_m) * math.ceil(n / config.block_n)
    workspace, counters = _workspace(x.device, num_tokens, n, k, config, num_tiles)
    _small_gemm_kernel[(num_tiles, config.split_k)](
        x, weight, out if bias is None else bias, out, workspace, counters,
        num_tokens, n, k, x.stride(0), weight.stride(0), out.stride(0), config.split_k,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        EVEN_K=k % config.block_k == 0, HAS_BIAS=bias is not None, GELU_TANH=activation == "gelu_tanh",
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    return out


_workspaces: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
_num_sms_by_device: dict[torch.device, int] = {}
_default_configs: dict[tuple[int, int, int, int], GemmConfig] = {}


def _num_sms(device: torch.device) -> int:
    if device not in _num_sms_by_device:
        _num_sms_by_device[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _num_sms_by_device[device]


def _default_config_cached(num_tokens: int, n: int, k: int, num_sms: int) -> GemmConfig:
    key = (num_tokens, n, k, num_sms)
    if key not in _default_configs:
        _default_configs[key] = default_config(num_tokens, n, k, num_sms)
    return _default_configs[key]


def _workspace(
    device: torch.device, num_tokens: int, n: int, k: int, config: GemmConfig, num_tiles: int
) -> tuple[torch.Tensor, torch.Tensor]:
    key = (device, num_tokens, n, k, config)
    if key not in _workspaces:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"small_linear: first call for M={num_tokens} N={n} K={k} {config} is inside CUDA-graph "
                "capture; call it once eagerly first so its workspace lives outside the graph's pool"
            )
        # Without a split the kernel never touches them, but they keep its argument types (float32,
        # int32 pointers) so one compiled kernel serves every split.
        size = config.split_k * num_tiles * config.block_m * config.block_n if config.split_k > 1 else 1
        workspace = torch.empty(size, device=device, dtype=torch.float32)
        counters = torch.zeros(num_tiles if config.split_k > 1 else 1, device=device, dtype=torch.int32)
        _workspaces[key] = (workspace, counters)  # [split_k, num_tiles, block_m, block_n], [num_tiles]
    return _workspaces[key]


if triton is not None:

    @triton.jit
    def _store_output(
        acc, B, Y, offs_m, offs_n, M, N, stride_ym, HAS_BIAS: tl.constexpr, GELU_TANH: tl.constexpr
    ):
        if HAS_BIAS:
            acc += tl.load(B + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        if GELU_TANH:
            # 0.5 * x * (1 + tanh(u)) == x * sigmoid(2u); exp overflowing to inf still gives the 0 limit
            inner = 0.7978845608028654 * (acc + 0.044715 * acc * acc * acc)
            acc = acc / (1.0 + tl.exp(-2.0 * inner))
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        tl.store(Y + offs_m[:, None] * stride_ym + offs_n[None, :], acc.to(Y.dtype.element_ty), mask=mask)

    # SPLIT_K is a runtime value (not specialised at 1) so one compiled kernel serves every split.
    @triton.jit(do_not_specialize=["SPLIT_K"])
    def _small_gemm_kernel(
        X, W, B, Y, WS, COUNTERS, M, N, K, stride_xm, stride_wn, stride_ym, SPLIT_K,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr, GELU_TANH: tl.constexpr,
    ):  # fmt: skip
        tile = tl.program_id(0)  # M tiles vary fastest: programs reading one weight slice run together
        pid_k = tl.program_id(1)
        num_m_tiles = tl.cdiv(M, BLOCK_M)
        offs_m = (tile % num_m_tiles) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = (tile // num_m_tiles) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        # Rows and columns past the edge re-read valid ones (no masks in the loop); never stored.
        rows = offs_m % M
        cols = offs_n % N
        num_k_blocks = tl.cdiv(K, BLOCK_K)
        blocks_per_split = tl.cdiv(num_k_blocks, SPLIT_K)
        k_start = pid_k * blocks_per_split
        k_end = tl.minimum(k_start + blocks_per_split, num_k_blocks)
        x_ptrs = X + rows[:, None] * stride_xm + (k_start * BLOCK_K + offs_k)[None, :]
        w_ptrs = W + cols[None, :] * stride_wn + (k_start * BLOCK_K + offs_k)[:, None]  # [BLOCK_K, BLOCK_N]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kb in range(k_start, k_end):
            if EVEN_K:
                x = tl.load(x_ptrs)
                w = tl.load(w_ptrs)
            else:
                k_mask = kb * BLOCK_K + offs_k < K
                x = tl.load(x_ptrs, mask=k_mask[None, :], other=0.0)
                w = tl.load(w_ptrs, mask=k_mask[:, None], other=0.0)
            acc = tl.dot(x, w, acc)
            x_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        if SPLIT_K > 1:
            num_tiles = tl.num_programs(0)
            in_tile = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
            tl.store(WS + (pid_k * num_tiles + tile) * (BLOCK_M * BLOCK_N) + in_tile, acc)
            # Every thread's partial is issued before the one thread that bumps the counter releases
            # it (the CUTLASS semaphore pattern: barrier, then a single release at GPU scope).
            tl.debug_barrier()
            arrived = tl.atomic_add(COUNTERS + tile, 1, sem="acq_rel")
            if arrived == SPLIT_K - 1:
                total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for s in range(0, SPLIT_K):  # split order, whichever program came last: deterministic
                    part = WS + (s * num_tiles + tile) * (BLOCK_M * BLOCK_N) + in_tile
                    total += tl.load(part, cache_modifier=".cg")  # from L2, never a stale L1 line
                _store_output(total, B, Y, offs_m, offs_n, M, N, stride_ym, HAS_BIAS, GELU_TANH)
                tl.atomic_xchg(COUNTERS + tile, 0)  # ready for the next call / graph replay
        else:
            _store_output(acc, B, Y, offs_m, offs_n, M, N, stride_ym, HAS_BIAS, GELU_TANH)
