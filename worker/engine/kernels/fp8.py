"""Opt-in fp8 GEMMs (`--linear-dtype fp8`): the encoder layers' linears in float8 e4m3 on the GPU.

Weights are quantised once at load, one float32 scale per output channel; activations per token at
run time, one float32 scale per row, computed by the kernel that produces them (add + LayerNorm,
RMSNorm, the FFN's activation) or by `quantize_rows` where nothing else touches them (attention's
output, the first layer's input). The GEMM is `torch._scaled_mm` with row-wise scales, bias added
and the product rounded to bfloat16 in its epilogue: on Hopper about twice bf16's rate.

Accuracy: e4m3 keeps 3 mantissa bits, so an fp8 model is no longer within cosine 0.999 of float32
(docs/benchmarks.md measures the bundled all-MiniLM-L6-v2); it is an opt-in, never the default.

Every function here has a plain-torch form that runs anywhere (`*_reference`): the CPU emulation
the tests check the kernels and the accuracy against. Everything on the GPU path is CUDA-graph
capturable (no host syncs, every tensor allocated per call, none shared between calls), so the
interactive lane's graphs run beside the main path's over the same quantised weights.
"""

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only torch builds ship without Triton
    triton = None

E4M3_MAX = 448.0  # the largest finite float8_e4m3fn
MIN_AMAX = 1e-12  # an all-zero row gets a tiny scale rather than a division by zero
FP8_DTYPE = torch.float8_e4m3fn

# The activation a kernel applies before quantising (a tl.constexpr in the kernels).
ACTIVATIONS = {"identity": 0, "gelu": 1, "gelu_new": 2, "gelu_pytorch_tanh": 2, "relu": 3, "silu_mul": 4}
_EAGER: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "identity": lambda x: x,
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu_mul": lambda x: F.silu(x.chunk(2, dim=-1)[0]) * x.chunk(2, dim=-1)[1],
}


class Fp8Rows(NamedTuple):
    """An activation quantised per row: `data` [rows, cols] float8_e4m3fn, `scale` [rows, 1] float32,
    so that row i is `data[i] * scale[i]`."""

    data: torch.Tensor
    scale: torch.Tensor


def fp8_unsupported_reason(device: torch.device) -> str | None:
    """Why `device` cannot run fp8 GEMMs, or None if it can."""
    if device.type != "cuda":
        return f"fp8 GEMMs need a CUDA GPU with fp8 tensor cores, and this worker runs on the {device.type}"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        name = torch.cuda.get_device_name(device)
        return (
            "fp8 GEMMs need CUDA compute capability 8.9 or newer (Ada, Hopper, Blackwell); "
            f"{name} has {major}.{minor}"
        )
    if triton is None:
        return "fp8 activations are quantised by Triton kernels, and Triton is not installed"
    return None


def quantize_rows_reference(x: torch.Tensor) -> Fp8Rows:
    """Per-row e4m3 quantisation in plain torch: scale = max|row| / 448, data = row / scale."""
    x32 = x.float()
    scale = x32.abs().amax(dim=-1, keepdim=True).clamp(min=MIN_AMAX) / E4M3_MAX
    data = (x32 / scale).clamp(-E4M3_MAX, E4M3_MAX).to(FP8_DTYPE)
    return Fp8Rows(data, scale)


def dequantize(rows: Fp8Rows) -> torch.Tensor:
    """The float32 values `rows` stands for."""
    return rows.data.float() * rows.scale


def activation_quantize_reference(x: torch.Tensor, activation: str) -> Fp8Rows:
    """`activation` applied in float32 (silu_mul: SiLU(first half) * second half), then per-row
    quantisation: the plain-torch form of `activation_quantize`."""
    return quantize_rows_reference(_EAGER[activation](x.float()))


def quantize_rows(x: torch.Tensor) -> Fp8Rows:
    """Per-row e4m3 quantisation of [rows, cols]: one Triton kernel on CUDA."""
    return activation_quantize(x, "identity")


def activation_quantize(x: torch.Tensor, activation: str) -> Fp8Rows:
    """`activation` then per-row quantisation of [rows, cols] in one pass (silu_mul: cols is twice
    the output's); on CUDA one Triton kernel, computing in float32 registers."""
    if triton is None or not x.is_cuda:
        return activation_quantize_reference(x, activation)
    assert x.stride(-1) == 1, "rows must be contiguous"
    num_rows, width = x.shape
    out_width = width // 2 if activation == "silu_mul" else width
    data = torch.empty(num_rows, out_width, dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty(num_rows, 1, dtype=torch.float32, device=x.device)
    block = min(triton.next_power_of_2(out_width), 4096)
    _activation_quantize_kernel[(num_rows,)](
        x, data, scale, x.stride(0), out_width,
        ACT=ACTIVATIONS[activation], BLOCK=block, NUM_CHUNKS=triton.cdiv(out_width, block),
        num_warps=4 if block <= 1024 else 8,
    )  # fmt: skip
    return Fp8Rows(data, scale)


class Fp8Linear(nn.Module):
    """An nn.Linear whose weight is float8 e4m3 with one float32 scale per output channel.

    `forward(x)` quantises x per token and multiplies; `mm(rows)` takes x already quantised (by the
    kernel that produced it). On CUDA the product is `torch._scaled_mm` (bias added and the result
    rounded to bfloat16 in its epilogue); elsewhere the same product is emulated in float32 from the
    dequantised operands (tests; the engine refuses fp8 off a capable GPU)."""

    weight: torch.Tensor  # [out, in] float8_e4m3fn
    weight_scale: torch.Tensor  # [1, out] float32
    bias: torch.Tensor | None  # [out] in the model's dtype

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.out_dtype = linear.weight.dtype
        weight = quantize_rows_reference(linear.weight.detach())  # per output channel: rows of W
        # [out, in] contiguous, so weight.t() is the column-major [in, out] _scaled_mm takes
        self.register_buffer("weight", weight.data.contiguous())
        self.register_buffer("weight_scale", weight.scale.reshape(1, -1).contiguous())  # [1, out]
        bias = None if linear.bias is None else linear.bias.detach().clone()
        self.register_buffer("bias", bias)  # [out] in the model's dtype, or None
        self.train(linear.training)

    @classmethod
    def can_hold(cls, linear: nn.Linear) -> bool:
        """fp8 GEMMs need both dimensions to be multiples of 16."""
        return linear.in_features % 16 == 0 and linear.out_features % 16 == 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mm(quantize_rows(x))

    def mm(self, rows: Fp8Rows) -> torch.Tensor:
        """rows @ W.T + b for rows [num_tokens, in] quantised per row -> [num_tokens, out]."""
        if rows.data.is_cuda:
            return torch._scaled_mm(
                rows.data,
                self.weight.t(),
                scale_a=rows.scale,
                scale_b=self.weight_scale,
                bias=self.bias,
                out_dtype=torch.bfloat16,
            )
        weight = self.weight.float() * self.weight_scale.t()
        out = dequantize(rows) @ weight.t()
        if self.bias is not None:
            out = out + self.bias.float()
        return out.to(self.out_dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8 e4m3"


def quantize_linears(model: nn.Module) -> int:
    """Replace the linears of every encoder/decoder layer in `model` by `Fp8Linear`s, in place; the
    layers name theirs in `FP8_LINEARS` (embeddings, poolers and heads have none). Returns how many
    were replaced; ValueError naming a linear whose shape fp8 GEMMs cannot take."""
    num_replaced = 0
    for layer in list(model.modules()):
        for name in getattr(layer, "FP8_LINEARS", ()):
            linear = getattr(layer, name)
            if isinstance(linear, Fp8Linear):
                continue
            assert isinstance(linear, nn.Linear), f"{type(layer).__name__}.{name} is not a linear"
            if not Fp8Linear.can_hold(linear):
                raise ValueError(
                    f"{type(layer).__name__}.{name} is {linear.in_features} x {linear.out_features}: fp8 "
                    "GEMMs need both dimensions to be multiples of 16"
                )
            setattr(layer, name, Fp8Linear(linear))
            num_replaced += 1
    return num_replaced


def fp8_linear(module: nn.Module) -> Fp8Linear:
    """`module` as the Fp8Linear it must be (the fp8 layer paths run only after `quantize_linears`)."""
    assert isinstance(module, Fp8Linear), f"expected an Fp8Linear, found {type(module).__name__}"
    return module


def is_quantized(layer: nn.Module) -> bool:
    """Whether `quantize_linears` has turned `layer`'s linears to fp8."""
    names: tuple[str, ...] = getattr(layer, "FP8_LINEARS", ())
    return bool(names) and isinstance(getattr(layer, names[0]), Fp8Linear)


# Triton kernels: their parameters are device pointers and tl.constexpr values, which Triton's
# JIT reads from the annotations it knows; nothing here types them for mypy (triton has no stubs).
# Constants are written out (448.0: E4M3_MAX, 1e-12: MIN_AMAX): a jitted function reads no globals.
if triton is not None:

    @triton.jit  # type: ignore[untyped-decorator]
    def _activate(ROW, cols, mask, width, ACT: tl.constexpr):  # type: ignore[no-untyped-def]
        """ACT (see ACTIVATIONS) of one chunk of a row, in float32; 0 where masked."""
        x = tl.load(ROW + cols, mask=mask, other=0.0).to(tl.float32)
        if ACT == 1:  # exact GELU
            y = 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))
        elif ACT == 2:  # tanh GELU: 0.5 * (1 + tanh(u)) == sigmoid(2u)
            y = x * tl.sigmoid(1.5957691216057308 * (x + 0.044715 * x * x * x))
        elif ACT == 3:
            y = tl.maximum(x, 0.0)
        elif ACT == 4:  # SiLU(gate) * up; the row is [gate | up], `width` wide each
            up = tl.load(ROW + width + cols, mask=mask, other=0.0).to(tl.float32)
            y = x / (1.0 + tl.exp(-x)) * up
        else:
            y = x
        return tl.where(mask, y, 0.0)

    @triton.jit  # type: ignore[untyped-decorator]
    def _activation_quantize_kernel(  # type: ignore[no-untyped-def]
        X, Q, S, stride_x, width, ACT: tl.constexpr, BLOCK: tl.constexpr, NUM_CHUNKS: tl.constexpr
    ):
        row = tl.program_id(0).to(tl.int64)
        src, dst = X + row * stride_x, Q + row * width
        if NUM_CHUNKS == 1:  # the whole row in registers: read once
            cols = tl.arange(0, BLOCK)
            mask = cols < width
            y = _activate(src, cols, mask, width, ACT)
            scale = tl.maximum(tl.max(tl.abs(y), axis=0), 1e-12) / 448.0
            q = tl.minimum(tl.maximum(y / scale, -448.0), 448.0)
            tl.store(dst + cols, q.to(Q.dtype.element_ty), mask=mask)
        else:  # a long row: its amax first, then the row again, scaled
            amax = tl.zeros([BLOCK], dtype=tl.float32)
            for chunk in range(NUM_CHUNKS):
                cols = chunk * BLOCK + tl.arange(0, BLOCK)
                amax = tl.maximum(amax, tl.abs(_activate(src, cols, cols < width, width, ACT)))
            scale = tl.maximum(tl.max(amax, axis=0), 1e-12) / 448.0
            for chunk in range(NUM_CHUNKS):
                cols = chunk * BLOCK + tl.arange(0, BLOCK)
                mask = cols < width
                y = _activate(src, cols, mask, width, ACT)
                q = tl.minimum(tl.maximum(y / scale, -448.0), 448.0)
                tl.store(dst + cols, q.to(Q.dtype.element_ty), mask=mask)
        tl.store(S + row, scale)
