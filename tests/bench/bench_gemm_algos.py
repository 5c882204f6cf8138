"""Does choosing the GEMM algorithm per shape pay? BGE-M3's four projections (QKV, output, up + GELU,
down) at 16..8192 tokens on a GPU, each timed as CUDA-graph replays of 20 calls on 20 distinct weights
(more than L2 holds, as a model's layers are), median of 3 rounds:
- torch's own call (`F.linear` with bias; `torch._addmm_activation` for up + GELU), as the engine runs;
- every algorithm cuBLASLt's heuristic offers for the shape (`cublasLtMatmulAlgoGetHeuristic`, 32 MiB
  workspace, bias / GELU-bias epilogue), called through ctypes on the same stream, each checked
  against torch's output;
- TunableOp (`torch.cuda.tunable`), torch's own per-shape search, tuned then replayed.
Prints one line per shape and a per-layer sum. `python -P tests/bench/bench_gemm_algos.py` (~1 min).
"""

import ctypes
import glob
import os
import sys
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
        self._set(BIAS_POINTER, ctypes.c_void_p(b.data_ptr()))
        p = ctypes.c_void_p
        check(
            self.lt.cublasLtMatmul(
                self.handle, self.desc, ctypes.byref(self.alpha),
                p(w.data_ptr()), self.a, p(x.data_ptr()), self.b,
                ctypes.byref(self.beta), p(out.data_ptr()), self.d, p(out.data_ptr()), self.d,
                ctypes.byref(self.results[algo].algo),
                p(self.workspace.data_ptr()), ctypes.c_size_t(WORKSPACE),
                p(torch.cuda.current_stream().cuda_stream),
            ),
            "matmul",
        )  # fmt: skip

    def calls(self, x, weights, bias, algo, outs):
        """One call per weight, each into its own output: what a graph of CALLS calls runs."""
        return lambda: [self(x, w, bias, algo, o) for w, o in zip(weights, outs, strict=True)]


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


if __name__ == "__main__":
    main()
