"""A persistent Triton kernel for a BERT layer's feed-forward block at few tokens (an experiment).

out = LayerNorm(x + W2 · act(W1 · x + b1) + b2), in ONE launch instead of three (cuBLASLt up-projection
with its GELU epilogue, cuBLAS down-projection, Triton add + LayerNorm). The grid is at most one
program per SM, all resident at once, and runs three phases separated by grid barriers:
1. up-projection tiles [BM x BN1] over the intermediate width, bias and activation, into a bf16
   workspace `hidden` [M, I];
2. down-projection tiles [BM x BN2] with the intermediate width split SPLIT ways, fp32 partials into
   `partial` [SPLIT, Mpad, H];
3. one row per program: sum of the partials + b2 + residual, LayerNorm, store.
A kernel boundary inside a CUDA graph costs ~2 µs on an H200 and cuBLAS's small-M GEMMs ~4-9 µs
each whatever their bytes, so one launch with two ~1 µs barriers may beat three kernels.

The barrier is the sense-reversing counter of torch inductor's cooperative reductions: program 0 adds
2^31 - (programs - 1), every other program adds 1, so the count's low bits return to where they were
and its top bit flips once everyone has arrived; nothing needs resetting between graph replays. It
deadlocks if the grid's programs cannot all be resident at once: keep grid <= SMs, and never run two
such kernels concurrently on streams whose grids together exceed what the SMs hold.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _grid_barrier(sem):
    tl.debug_barrier()
    one_i32 = 1
    one_u32 = one_i32.to(tl.uint32)
    expected = tl.num_programs(0).to(tl.uint32)
    if tl.program_id(0) == 0:  # noqa: SIM108 (Triton's frontend wants the if statement)
        nb = 0x80000000 - (expected - one_u32)
    else:
        nb = one_u32
    old = tl.atomic_add(sem, nb, sem="release")
    flipped = False
    while not flipped:
        current = tl.atomic_add(sem, 0, sem="acquire")
        flipped = ((old ^ current) & 0x80000000) != 0
    tl.debug_barrier()


@triton.jit
def _gelu(x, EXACT: tl.constexpr):
    if EXACT:
        return 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    return 0.5 * x * (1.0 + (2.0 * tl.sigmoid(2.0 * inner) - 1.0))


@triton.jit
def persistent_mlp_kernel(
    X, W1, B1, W2, B2, LW, LB, HID_BUF, PART, Y, SEM,
    M, eps,
    H: tl.constexpr, INTER: tl.constexpr, MPAD: tl.constexpr,
    BM: tl.constexpr, BN1: tl.constexpr, BN2: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr,
    EXACT_GELU: tl.constexpr, NUM_STAGES: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    sem = SEM.to(tl.pointer_type(tl.uint32))
    num_m = MPAD // BM

    # 1. hidden = act(x W1^T + b1)
    n1 = INTER // BN1
    for tile in range(pid, num_m * n1, nprog):
        rows = (tile // n1) * BM + tl.arange(0, BM)
        cols = (tile % n1) * BN1 + tl.arange(0, BN1)
        acc = tl.zeros([BM, BN1], dtype=tl.float32)
        for k in tl.range(0, H, BK, num_stages=NUM_STAGES):
            ks = k + tl.arange(0, BK)
            x = tl.load(X + rows[:, None] * H + ks[None, :], mask=rows[:, None] < M, other=0.0)
            w = tl.load(W1 + cols[:, None] * H + ks[None, :])
            acc = tl.dot(x, tl.trans(w), acc)
        acc += tl.load(B1 + cols).to(tl.float32)[None, :]
        hidden = _gelu(acc, EXACT_GELU)
        tl.store(HID_BUF + rows[:, None] * INTER + cols[None, :], hidden.to(HID_BUF.dtype.element_ty))
    _grid_barrier(sem)

    # 2. partial[s] = hidden[:, chunk s] W2[:, chunk s]^T
    n2 = H // BN2
    chunk = INTER // SPLIT
    for item in range(pid, num_m * n2 * SPLIT, nprog):
        s = item % SPLIT
        rest = item // SPLIT
        rows = (rest // n2) * BM + tl.arange(0, BM)
        cols = (rest % n2) * BN2 + tl.arange(0, BN2)
        acc = tl.zeros([BM, BN2], dtype=tl.float32)
        for k in tl.range(0, chunk, BK, num_stages=NUM_STAGES):
            ks = s * chunk + k + tl.arange(0, BK)
            h = tl.load(HID_BUF + rows[:, None] * INTER + ks[None, :], cache_modifier=".cg")
            w = tl.load(W2 + cols[:, None] * INTER + ks[None, :])
            acc = tl.dot(h, tl.trans(w), acc)
        tl.store(PART + (s * MPAD + rows[:, None]) * H + cols[None, :], acc)
    _grid_barrier(sem)

    # 3. y = LayerNorm(sum_s partial[s] + b2 + x)
    cols = tl.arange(0, H)
    for row in range(pid, M, nprog):
        acc = tl.load(B2 + cols).to(tl.float32) + tl.load(X + row * H + cols).to(tl.float32)
        for s in tl.static_range(SPLIT):
            acc += tl.load(PART + (s * MPAD + row) * H + cols, cache_modifier=".cg")
        mean = tl.sum(acc, axis=0) / H
        centered = acc - mean
        rstd = 1.0 / tl.sqrt(tl.sum(centered * centered, axis=0) / H + eps)
        y = centered * rstd * tl.load(LW + cols).to(tl.float32) + tl.load(LB + cols).to(tl.float32)
        tl.store(Y + row * H + cols, y.to(Y.dtype.element_ty))


class PersistentMlp:
    """Workspace and launch of `persistent_mlp_kernel` for one [M, H] shape (allocate outside a
    graph capture, call inside). `config`: (BM, BN1, BN2, BK, SPLIT, num_warps, num_stages)."""

    def __init__(self, m: int, hidden: int, inter: int, device: torch.device, config: tuple, programs: int):
        self.bm, self.bn1, self.bn2, self.bk, self.split, self.warps, self.stages = config
        self.m, self.hidden, self.inter = m, hidden, inter
        self.mpad = -(-m // self.bm) * self.bm
        self.hid = torch.zeros(self.mpad, inter, dtype=torch.bfloat16, device=device)
        self.part = torch.zeros(self.split, self.mpad, hidden, dtype=torch.float32, device=device)
        self.sem = torch.zeros(1, dtype=torch.int32, device=device)
        self.programs = programs

    def __call__(self, x, w1, b1, w2, b2, norm_w, norm_b, eps: float, exact_gelu: bool) -> torch.Tensor:
        y = torch.empty_like(x)
        persistent_mlp_kernel[(self.programs,)](
            x, w1, b1, w2, b2, norm_w, norm_b, self.hid, self.part, y, self.sem,
            self.m, eps,
            H=self.hidden, INTER=self.inter, MPAD=self.mpad,
            BM=self.bm, BN1=self.bn1, BN2=self.bn2, BK=self.bk, SPLIT=self.split,
            EXACT_GELU=exact_gelu, NUM_STAGES=self.stages, num_warps=self.warps,
        )  # fmt: skip
        return y
