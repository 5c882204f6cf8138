"""Does choosing the GEMM algorithm per shape pay? BGE-M3's four projections (QKV, output, up + GELU,
down) at 16..8192 tokens on a GPU, each timed as CUDA-graph replays of 20 calls on 20 distinct weights
(more than L2 holds, as a model's layers are), median of 3 rounds:
- torch's own call (`F.linear` with bias; `torch._addmm_activation` for up + GELU), as the engine runs;
- every algorithm cuBLASLt's heuristic offers for the shape (`cublasLtMatmulAlgoGetHeuristic`, 32 MiB
  workspace, bias / GELU-bias epilogue), called through ctypes on the same stream, each checked
  against torch's output;
- TunableOp (`torch.cuda.tunable`), torch's own per-shape search, tuned then replayed.
Prints one line per shape and a per-layer sum. Then, at 8192 rows, torch's GEMM against the fastest
of every algorithm configuration cuBLASLt has (`cublasLtMatmulAlgoGetIds`, each tile and stage count)
that runs a block per output tile rather than a persistent block per SM, with each kernel's grid
from a profiler trace. `python -P lab/bench_gemm_algos.py` (~2 min).
"""

import ctypes
import glob
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from graph_timing import per_call_us

# name: (in features, out features, GELU epilogue)
SHAPES = {
    "qkv": (1024, 3072, False),
    "o": (1024, 1024, False),
    "up+gelu": (1024, 4096, True),
    "down": (4096, 1024, False),
}
TOKENS = (16, 128, 512, 2048, 8192)
CALLS = 20
WORKSPACE = 32 << 20
BF16, F32, COMPUTE_32F = 14, 0, 68  # cudaDataType / cublasComputeType_t values
TRANSA, TRANSB, EPILOGUE, BIAS_POINTER = 3, 4, 7, 8  # cublasLtMatmulDescAttributes_t
EPILOGUE_BIAS, EPILOGUE_GELU_BIAS = 4, 36
PREF_WORKSPACE = 1
CAP_SWIZZLE, CAP_TILE_IDS, CAP_STAGES_IDS = 2, 6, 13  # cublasLtMatmulAlgoCapAttributes_t
CFG_TILE, CFG_SPLITK, CFG_SWIZZLE, CFG_STAGES = 1, 2, 4, 6  # cublasLtMatmulAlgoConfigAttributes_t
BULK_ROWS = 8192


class Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class Heuristic(ctypes.Structure):
    _fields_ = [
        ("algo", Algo),
        ("workspace_size", ctypes.c_size_t),
        ("state", ctypes.c_int),
        ("waves", ctypes.c_float),
        ("reserved", ctypes.c_int * 4),
    ]


def load_cublaslt() -> ctypes.CDLL:
    pattern = os.path.join("nvidia", "**", "libcublasLt.so*")
    found = [f for p in sys.path for f in glob.glob(os.path.join(p, pattern), recursive=True)]
    found += glob.glob("/usr/local/cuda*/lib64/libcublasLt.so*")
    if not found:
        raise SystemExit("libcublasLt not found next to torch or in /usr/local/cuda*")
    return ctypes.CDLL(found[0])


def check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what}: cuBLAS status {status}")


class LtLinear:
    """y[M,N] = act(x[M,K] @ w[N,K].T + b) as column-major D[N,M] = W[K,N]^T @ X[K,M] with one chosen
    heuristic algorithm."""

    def __init__(self, lt: ctypes.CDLL, handle: ctypes.c_void_p, m: int, k: int, n: int, gelu: bool) -> None:
        self.lt, self.handle, self.m, self.n = lt, handle, m, n
        self.desc = ctypes.c_void_p()
        check(lt.cublasLtMatmulDescCreate(ctypes.byref(self.desc), COMPUTE_32F, F32), "desc")
        self._set(TRANSA, ctypes.c_int(1))
        self._set(TRANSB, ctypes.c_int(0))
        self._set(EPILOGUE, ctypes.c_int(EPILOGUE_GELU_BIAS if gelu else EPILOGUE_BIAS))
        self.a, self.b, self.d = self._layout(k, n, k), self._layout(k, m, k), self._layout(n, m, n)
        pref = ctypes.c_void_p()
        check(lt.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "preference")
        size = ctypes.c_size_t(WORKSPACE)
        status = lt.cublasLtMatmulPreferenceSetAttribute(pref, PREF_WORKSPACE, ctypes.byref(size), 8)
        check(status, "workspace preference")
        self._bias = torch.zeros(n, dtype=torch.bfloat16, device="cuda")
        self._set(BIAS_POINTER, ctypes.c_void_p(self._bias.data_ptr()))
        self.results = (Heuristic * 64)()
        count = ctypes.c_int()
        check(
            lt.cublasLtMatmulAlgoGetHeuristic(
                handle, self.desc, self.a, self.b, self.d, self.d, pref, 64, self.results, ctypes.byref(count)
            ),
            "heuristic",
        )
        self.algos = [i for i in range(count.value) if self.results[i].state == 0]
        self.alpha, self.beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self.workspace = torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda")

    def _set(self, attr: int, value: ctypes._SimpleCData) -> None:
        size = ctypes.sizeof(value)
        check(self.lt.cublasLtMatmulDescSetAttribute(self.desc, attr, ctypes.byref(value), size), "attribute")

    def _layout(self, rows: int, cols: int, ld: int) -> ctypes.c_void_p:
        layout = ctypes.c_void_p()
        check(
            self.lt.cublasLtMatrixLayoutCreate(
                ctypes.byref(layout), BF16, ctypes.c_uint64(rows), ctypes.c_uint64(cols), ctypes.c_int64(ld)
            ),
            "layout",
        )
        return layout

    def __call__(
        self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, algo: int, out: torch.Tensor
    ) -> None:
        self.matmul(x, w, b, self.results[algo].algo, out)

    def matmul(
        self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, algo: Algo, out: torch.Tensor
    ) -> None:
        self._set(BIAS_POINTER, ctypes.c_void_p(b.data_ptr()))
        p = ctypes.c_void_p
        check(
            self.lt.cublasLtMatmul(
                self.handle, self.desc, ctypes.byref(self.alpha),
                p(w.data_ptr()), self.a, p(x.data_ptr()), self.b,
                ctypes.byref(self.beta), p(out.data_ptr()), self.d, p(out.data_ptr()), self.d,
                ctypes.byref(algo),
                p(self.workspace.data_ptr()), ctypes.c_size_t(WORKSPACE),
                p(torch.cuda.current_stream().cuda_stream),
            ),
            "matmul",
        )  # fmt: skip

    def calls(self, x, weights, bias, algo, outs):
        """One call per weight, each into its own output: what a graph of CALLS calls runs."""
        return lambda: [self(x, w, bias, algo, o) for w, o in zip(weights, outs, strict=True)]


def every_algo(lt: ctypes.CDLL, handle: ctypes.c_void_p) -> list[Algo]:
    """Every algorithm id cuBLASLt has for bf16 in and out with fp32 compute, in each tile, stage count
    and swizzle it accepts (split-K off): beyond what its heuristic offers."""
    types = (COMPUTE_32F, F32, BF16, BF16, BF16, BF16)
    ids, count = (ctypes.c_int * 1024)(), ctypes.c_int()
    check(lt.cublasLtMatmulAlgoGetIds(handle, *types, 1024, ids, ctypes.byref(count)), "algorithm ids")

    def u32_list(algo: Algo, attr: int) -> list[int]:
        size = ctypes.c_size_t()
        lt.cublasLtMatmulAlgoCapGetAttribute(ctypes.byref(algo), attr, None, 0, ctypes.byref(size))
        values = (ctypes.c_uint32 * (size.value // 4))()
        lt.cublasLtMatmulAlgoCapGetAttribute(ctypes.byref(algo), attr, values, size.value, ctypes.byref(size))
        return list(values)

    def configured(base: Algo, settings: dict[int, int]) -> Algo:
        algo = Algo.from_buffer_copy(base)
        for attr, value in settings.items():
            v = ctypes.c_uint32(value)
            check(
                lt.cublasLtMatmulAlgoConfigSetAttribute(ctypes.byref(algo), attr, ctypes.byref(v), 4),
                "config",
            )
        return algo

    algos = []
    for algo_id in ids[: count.value]:
        base = Algo()
        if lt.cublasLtMatmulAlgoInit(handle, *types, algo_id, ctypes.byref(base)):
            continue
        swizzles = [0, 1] if u32_list(base, CAP_SWIZZLE)[:1] == [1] else [0]
        for tile in u32_list(base, CAP_TILE_IDS) or [0]:
            for stages in u32_list(base, CAP_STAGES_IDS) or [0]:
                for swizzle in swizzles:
                    settings = {CFG_TILE: tile, CFG_STAGES: stages, CFG_SPLITK: 1, CFG_SWIZZLE: swizzle}
                    algos.append(configured(base, settings))
    return algos


def kernel_grid(fn: Callable[[], object]) -> tuple[str, int]:
    """(name, blocks) of the longest kernel `fn` launches, from a profiler trace."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as trace:
        prof.export_chrome_trace(trace.name)
        events = json.loads(Path(trace.name).read_text())["traceEvents"]
    kernel = max((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["dur"])
    grid = kernel["args"].get("grid", [0, 0, 0])
    return kernel["name"].removeprefix("void ").split("(")[0][:70], grid[0] * grid[1] * grid[2]


def tile_per_block(lt: ctypes.CDLL, handle: ctypes.c_void_p) -> None:
    """At a bulk step's rows: torch's GEMM (its grid, from a trace) against the fastest of every
    cuBLASLt algorithm configuration whose grid has a block per output tile (more blocks than SMs),
    between whose blocks a kernel on another stream can slip in."""
    algos = every_algo(lt, handle)
    print(f"\n{len(algos)} cuBLASLt algorithm configurations (every id x tile x stages x swizzle)\n")
    print(
        "| projection, 8192 rows | torch µs (blocks, kernel) "
        "| fastest with a block per tile µs (blocks, kernel) | configurations run |\n|---|---:|---:|---:|"
    )
    for name, (k, n, gelu) in SHAPES.items():
        print(tile_per_block_row(lt, handle, algos, name, k, n, gelu), flush=True)


def tile_per_block_row(
    lt: ctypes.CDLL, handle: ctypes.c_void_p, algos: list[Algo], name: str, k: int, n: int, gelu: bool
) -> str:
    x = torch.randn(BULK_ROWS, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.03
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(BULK_ROWS, n, device="cuda", dtype=torch.bfloat16)

    def ours() -> torch.Tensor:
        return torch._addmm_activation(b, x, w.t(), use_gelu=True) if gelu else F.linear(x, w, b)

    ref = ours().float()
    lin = LtLinear(lt, handle, BULK_ROWS, k, n, gelu)
    timed = []
    for algo in algos:  # a quick first timing of each, 8 back-to-back calls
        result = Heuristic()
        status = lt.cublasLtMatmulAlgoCheck(
            handle, lin.desc, lin.a, lin.b, lin.d, lin.d, ctypes.byref(algo), ctypes.byref(result)
        )
        if status or result.workspace_size > WORKSPACE:
            continue
        lin.matmul(x, w, b, algo, out)
        if (out.float() - ref).abs().max().item() > 0.1:
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(8):
            lin.matmul(x, w, b, algo, out)
        end.record()
        end.synchronize()
        timed.append((start.elapsed_time(end), len(timed), algo))
    torch_name, torch_blocks = kernel_grid(ours)
    torch_us = per_call_us(ours, 1)
    best = "none"
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for _, _, algo in sorted(timed):

        def call(algo: Algo = algo) -> None:
            lin.matmul(x, w, b, algo, out)

        kernel, blocks = kernel_grid(call)
        if blocks > sms:
            us = per_call_us(call, 1)
            best = f"{us:.1f} ({blocks}, `{kernel}`), {us / torch_us:.2f}x"
            break
    return f"| {name} {k} → {n} | {torch_us:.1f} ({torch_blocks}, `{torch_name}`) | {best} | {len(timed)} |"


def main() -> None:
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    torch.zeros(1, device="cuda")
    lt = load_cublaslt()
    handle = ctypes.c_void_p()
    check(lt.cublasLtCreate(ctypes.byref(handle)), "create")
    rows, per_layer = [], {}
    calls = {}
    for m in TOKENS:
        for name, (k, n, gelu) in SHAPES.items():
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.03 for _ in range(CALLS)]
            bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
            if gelu:

                def torch_fn(x=x, weights=weights, bias=bias):
                    return [torch._addmm_activation(bias, x, w.t(), use_gelu=True) for w in weights]
            else:

                def torch_fn(x=x, weights=weights, bias=bias):
                    return [F.linear(x, w, bias) for w in weights]

            calls[(m, name)] = torch_fn
            ours = per_call_us(torch_fn, CALLS)
            ref = torch_fn()[0].float()
            lin = LtLinear(lt, handle, m, k, n, gelu)
            outs = [torch.empty(m, n, dtype=torch.bfloat16, device="cuda") for _ in weights]
            timed = []
            for algo in lin.algos:
                lin(x, weights[0], bias, algo, outs[0])
                err = (outs[0].float() - ref).abs().max().item()
                us = per_call_us(lin.calls(x, weights, bias, algo, outs), CALLS)
                timed.append((us, algo, err))
            best_us, best_algo, _ = min(timed)
            first = next(us for us, algo, _ in timed if algo == 0)
            rows.append(
                f"| {m} | {name} | {ours:.2f} | {first:.2f} | {best_us:.2f} (#{best_algo} of {len(timed)}) | "
                f"{ours / best_us:.2f}x | {max(e for _, _, e in timed):.3g} |"
            )
            print(rows[-1], flush=True)
            sums = per_layer.setdefault(m, [0.0, 0.0, 0.0])
            sums[0] += ours
            sums[1] += best_us
    # TunableOp: torch's per-shape search over the implementations it has for this GPU
    tunable = torch.cuda.tunable
    tunable.enable(True)
    tunable.tuning_enable(True)
    tunable.set_filename("/tmp/kembed-tunableop.csv")
    for fn in calls.values():
        fn()
    torch.cuda.synchronize()
    tunable.tuning_enable(False)
    for (m, _), fn in calls.items():
        per_layer[m][2] += per_call_us(fn, CALLS)
    solutions = sorted({r[2] for r in tunable.get_results()})
    print(
        "\n| tokens | projection | torch µs | cuBLASLt heuristic #0 µs | best cuBLASLt algorithm µs "
        "| torch / best | max abs diff vs torch |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|")
    print("\n".join(rows))
    print(f"\nTunableOp solutions chosen: {solutions}")
    print("\n| tokens | torch µs per layer | best cuBLASLt µs per layer | TunableOp µs per layer |")
    print("|---:|---:|---:|---:|")
    for m, (ours, best, tuned) in per_layer.items():
        print(f"| {m} | {ours:.1f} | {best:.1f} | {tuned:.1f} |")
    tile_per_block(lt, handle)


if __name__ == "__main__":
    main()
