"""Ragged attention over packed sequences: metadata built once per batch, backends behind one call.

Sequences are packed back to back (`cu_seqlens`), never padded between each other: every linear
layer runs on exactly the real tokens. `sdpa` (one call per sequence) is the CPU path and
`sdpa-padded` (q/k/v gathered into a [batch, heads, max_seqlen, head_dim] block for the attention
product only) the eager GPU fallback. Every backend is an `Attention`: the same call,
`attention(q, k, v, meta, causal, window, bias)` on packed [num_tokens, heads, head_dim] tensors (k and
v may have fewer heads: grouped-query attention; `window`, `bias`: below), and `plan_batch`, a no-op
but where `plans_batches`. The
varlen kernels take packed sequences natively, so CUDA graphs can replay them:
`torch-varlen` (torch's bundled flash attention) and `flash-attn` (FlashAttention 4 from the
`flash-attn-4` package, CuTe DSL kernels for Hopper and Blackwell, compiled on first use) and
`flashinfer` (flashinfer's ragged prefill, `flashinfer-python`; its kernels are compiled with nvcc
on first use, minutes per head size, and it needs a host-side plan per batch: `plan_batch`) and
`triton` (triton_attention.py: a Triton kernel of our own).

Sliding windows (ModernBERT's and Gemma 3's local layers, Mistral's): with `window` w a query sees the
keys of its sequence at most w positions before it and, unless causal, at most w after it (a band
2w + 1 wide, or w + 1 causal); None is no window. A backend that cannot serve a window exactly says
why in `window_refusal`, and is then not chosen for a windowed model (attention_backends.py). Where a
window is longer than every sequence of a batch the band holds every key, the same as full attention;
the backends still apply it as given (no shortcut that a later, longer batch would have to undo).

A family whose scores carry a relative-position bias (relative_bias.py) passes it as the call's
`bias`; a backend serves the kinds it names in `bias_kinds` and raises for any other, and the engine
never chooses it for a model of another kind (attention_backends.py).
"""

import inspect
import itertools
import os
import warnings
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from kembed.worker.engine.layers.relative_bias import DISENTANGLED, DISTANCE, AttentionBias


@dataclass(frozen=True)
class AttentionShape:
    """What an attention backend's speed depends on, besides the batch: read off the model config."""

    num_heads: int
    num_kv_heads: int  # < num_heads: grouped-query attention
    head_dim: int
    is_causal: bool
    bias: str = ""  # the kind of relative-position bias its scores carry (relative_bias.py); "": none
    window: int | None = None  # the sliding window of the model's local layers (tokens each side), if any


@dataclass(frozen=True)
class AttentionMetadata:
    """Per-batch index tensors, built on the CPU by `build_metadata` before the forward pass."""

    cu_seqlens: torch.Tensor  # [num_seqs + 1] int32, offsets of each sequence in the packed tokens
    max_seqlen: int  # longest sequence of the batch
    seq_ids: torch.Tensor  # [num_tokens] int64, which sequence each token belongs to
    pad_index: torch.Tensor | None  # [num_seqs * max_seqlen] int64 into packed+1 (last = zero row)
    unpad_index: torch.Tensor | None  # [num_tokens] int64 into the padded block
    key_mask: torch.Tensor | None  # [num_seqs, 1, 1, max_seqlen] bool; None when no padding
    host_cu_seqlens: tuple[int, ...]  # cu_seqlens as Python ints, for per-sequence loops on the CPU

    @property
    def num_seqs(self) -> int:
        return self.cu_seqlens.shape[0] - 1

    def to(self, device: torch.device) -> "AttentionMetadata":
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device, non_blocking=True)

        return AttentionMetadata(
            cu_seqlens=self.cu_seqlens.to(device, non_blocking=True),
            max_seqlen=self.max_seqlen,
            seq_ids=self.seq_ids.to(device, non_blocking=True),
            pad_index=move(self.pad_index),
            unpad_index=move(self.unpad_index),
            key_mask=move(self.key_mask),
            host_cu_seqlens=self.host_cu_seqlens,
        )


class Attention(ABC):
    """An attention backend: `attention(q, k, v, meta, causal, window, bias) -> out` over the packed
    tokens of a batch (`window`: the module docstring). A backend that needs a plan made on the host
    per batch (flashinfer) sets `plans_batches`; the engine then calls `plan_batch` with the batch's
    host offsets before every forward, eager or replayed. For every other backend `plan_batch` does
    nothing. `bias`: an additive bias of the scores, of a kind in `bias_kinds` (a backend raises for
    any other)."""

    plans_batches: bool = False
    bias_kinds: tuple[str, ...] = ()  # the AttentionBias kinds it adds exactly

    @abstractmethod
    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        meta: AttentionMetadata,
        causal: bool,
        window: int | None = None,
        bias: AttentionBias | None = None,
    ) -> torch.Tensor: ...

    def window_refusal(self, causal: bool) -> str | None:
        """None where this backend serves a sliding window exactly (causal or, not causal, symmetric),
        else why not. A backend serves none unless it says so."""
        return "it has no sliding-window attention"

    def refuse_bias(self, bias: AttentionBias | None) -> None:
        """Raise unless this backend serves `bias` (None: always)."""
        if bias is not None and bias.kind not in self.bias_kinds:
            raise ValueError(f"{type(self).__name__} adds no {bias.kind} attention bias")

    def plan_batch(self, cu_seqlens: torch.Tensor, scratch: object | None = None) -> None:
        """Plan the next forward: `cu_seqlens` is the batch's int32 offsets on the host (pinned, as the
        engine's slots are), padding slot included; `scratch` an object that lives as long as the
        batch is in flight (None: the call's own). Nothing to plan here."""
        return None


# (num_heads, num_kv_heads, head_dim, dtype, causal, window: -1 for none)
_Shape = tuple[int, int, int, torch.dtype, bool, int]


def window_mask(length: int, causal: bool, window: int | None, device: torch.device) -> torch.Tensor:
    """[length, length] bool, True where query row i may see key column j: j <= i when causal, and
    |i - j| <= window with a window."""
    rows = torch.arange(length, device=device)[:, None]
    cols = torch.arange(length, device=device)[None, :]
    mask = cols <= rows if causal else torch.ones(length, length, dtype=torch.bool, device=device)
    if window is not None:
        mask = mask & ((rows - cols).abs() <= window)
    return mask


def build_metadata(lengths: np.ndarray) -> tuple[AttentionMetadata, np.ndarray]:
    """Metadata for a ragged batch, plus each token's position within its sequence ([num_tokens])."""
    num_seqs = len(lengths)
    cu_seqlens = np.zeros(num_seqs + 1, dtype=np.int64)
    np.cumsum(lengths, out=cu_seqlens[1:])
    num_tokens = int(cu_seqlens[-1])
    max_seqlen = int(lengths.max())
    seq_ids = np.repeat(np.arange(num_seqs), lengths)
    positions = np.arange(num_tokens) - cu_seqlens[seq_ids]
    if num_seqs * max_seqlen == num_tokens:  # all lengths equal: the packed block is already dense
        pad_index = unpad_index = key_mask = None
    else:
        unpad = seq_ids * max_seqlen + positions
        pad = np.full(num_seqs * max_seqlen, num_tokens, dtype=np.int64)
        pad[unpad] = np.arange(num_tokens)
        mask = np.arange(max_seqlen)[None, :] < lengths[:, None]
        pad_index = torch.from_numpy(pad)
        unpad_index = torch.from_numpy(unpad)
        key_mask = torch.from_numpy(mask).view(num_seqs, 1, 1, max_seqlen)
    meta = AttentionMetadata(
        cu_seqlens=torch.from_numpy(cu_seqlens.astype(np.int32)),
        max_seqlen=max_seqlen,
        seq_ids=torch.from_numpy(seq_ids),
        pad_index=pad_index,
        unpad_index=unpad_index,
        key_mask=key_mask,
        host_cu_seqlens=tuple(cu_seqlens.tolist()),
    )
    return meta, positions


class SdpaLoopAttention(Attention):
    """CPU attention: one SDPA call per sequence on views of the packed tensors, so no FLOP is spent
    on padding. The per-call overhead (tens of microseconds) is small against a CPU forward pass;
    on a GPU it would not be, which is what `sdpa-padded` and the varlen kernels are for. A window is
    a banded mask per sequence; a bias is materialised per sequence ([heads, len, len])."""

    bias_kinds = (DISTANCE, DISENTANGLED)

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        meta: AttentionMetadata,
        causal: bool,
        window: int | None = None,
        bias: AttentionBias | None = None,
    ) -> torch.Tensor:
        out = q.new_empty(q.shape)
        is_gqa = k.shape[1] != q.shape[1]
        scale = None if bias is None else bias.scale
        for start, end in itertools.pairwise(meta.host_cu_seqlens):
            if start == end:  # an empty padding slot of a bucketed batch
                continue
            # [len, heads, head_dim] -> [1, heads, len, head_dim]
            qs, ks, vs = (x[start:end].transpose(0, 1).unsqueeze(0) for x in (q, k, v))
            if bias is None and window is None:
                attn = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, enable_gqa=is_gqa)
            else:  # an explicit mask: sdpa takes is_causal only without one
                # the band, even where it holds the whole sequence (then it is full attention)
                allowed = (
                    window_mask(end - start, causal, window, q.device)
                    if window is not None
                    else ~_above_diagonal(end - start, q.device)
                    if causal
                    else None
                )
                mask: torch.Tensor | None = allowed
                if bias is not None:
                    additive = bias.sequence(start, end).to(q.dtype).unsqueeze(0)
                    mask = additive if allowed is None else additive.masked_fill(~allowed, float("-inf"))
                attn = F.scaled_dot_product_attention(
                    qs, ks, vs, attn_mask=mask, scale=scale, enable_gqa=is_gqa
                )
            out[start:end] = attn[0].transpose(0, 1)
        return out

    def window_refusal(self, causal: bool) -> str | None:
        return None


class SdpaPaddedAttention(Attention):
    """Packed q/k/v gathered into a padded [num_seqs, heads, max_seqlen, head_dim] block for the
    attention product only, then scattered back: the eager GPU fallback, and the GPU path of a bias
    no varlen kernel adds (a [num_seqs, heads, max_seqlen, max_seqlen] block per call). A window is a
    band over the block's positions (those within each sequence), and'ed with the key mask."""

    bias_kinds = (DISTANCE, DISENTANGLED)

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        meta: AttentionMetadata,
        causal: bool,
        window: int | None = None,
        bias: AttentionBias | None = None,
    ) -> torch.Tensor:
        _, num_heads, head_dim = q.shape
        num_seqs, max_seqlen = meta.num_seqs, meta.max_seqlen

        def padded(x: torch.Tensor) -> torch.Tensor:
            if meta.pad_index is not None:
                x = torch.cat([x, x.new_zeros(1, *x.shape[1:])])[meta.pad_index]
            return x.view(num_seqs, max_seqlen, *x.shape[1:]).transpose(1, 2)

        mask: torch.Tensor | None = meta.key_mask
        if window is not None:  # padded query rows may see no key at all: their rows are dropped
            band = window_mask(max_seqlen, causal, window, q.device)
            mask = band if mask is None else mask & band
        elif causal and mask is not None:
            mask = mask & ~_above_diagonal(max_seqlen, q.device)
        if bias is not None:  # the additive form: -inf where the boolean mask says no
            additive = bias.padded(meta.pad_index, num_seqs, max_seqlen).to(q.dtype)
            if mask is None and causal:
                mask = ~_above_diagonal(max_seqlen, q.device)
            mask = additive if mask is None else additive.masked_fill(~mask, float("-inf"))
        out = F.scaled_dot_product_attention(
            padded(q),
            padded(k),
            padded(v),
            attn_mask=mask,
            is_causal=causal and mask is None,
            scale=None if bias is None else bias.scale,
            enable_gqa=k.shape[1] != num_heads,
        )
        out = out.transpose(1, 2).reshape(num_seqs * max_seqlen, num_heads, head_dim)
        return out if meta.unpad_index is None else out[meta.unpad_index]

    def window_refusal(self, causal: bool) -> str | None:
        return None


def _above_diagonal(length: int, device: torch.device) -> torch.Tensor:
    """[length, length] bool, True where a key comes after its query (what causal attention hides)."""
    return torch.ones(length, length, dtype=torch.bool, device=device).triu(1)


class TorchVarlenAttention(Attention):
    """torch's varlen flash attention (`torch.nn.attention.varlen.varlen_attn`), adapted to the running
    torch's signature."""

    def __init__(self, varlen_attn: Callable[..., Any]) -> None:
        self._varlen_attn = varlen_attn
        params = inspect.signature(varlen_attn).parameters
        self._has_window = "window_size" in params  # newer torch: causal is a (-1, 0) window
        self._has_gqa = "enable_gqa" in params

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        meta: AttentionMetadata,
        causal: bool,
        window: int | None = None,
        bias: AttentionBias | None = None,
    ) -> torch.Tensor:
        self.refuse_bias(bias)
        kwargs: dict[str, Any] = {}
        if window is not None:  # (left, right), both inclusive: flash attention's local window
            if not self._has_window:
                raise ValueError(f"torch-varlen: {self.window_refusal(causal)}")
            kwargs["window_size"] = (window, 0 if causal else window)
        elif self._has_window:
            kwargs["window_size"] = (-1, 0) if causal else (-1, -1)
        else:
            kwargs["is_causal"] = causal
        if k.shape[1] != q.shape[1]:
            if self._has_gqa:
                kwargs["enable_gqa"] = True
            else:  # older torch: materialise the shared heads
                k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
                v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        cu = meta.cu_seqlens
        # a tuple only with return_aux, which is never passed
        out: torch.Tensor = self._varlen_attn(q, k, v, cu, cu, meta.max_seqlen, meta.max_seqlen, **kwargs)
        return out

    def window_refusal(self, causal: bool) -> str | None:
        return None if self._has_window else f"torch {torch.__version__}'s varlen_attn has no window_size"


def torch_varlen_backend() -> TorchVarlenAttention | None:
    """torch's varlen flash attention, or None when this torch has none."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return TorchVarlenAttention(varlen_attn)


class FlashAttn4Attention(Attention):
    """FlashAttention 4's varlen forward (package `flash-attn-4`, module flash_attn.cute)."""

    def __init__(self, flash_attn_varlen_func: Callable[..., Any]) -> None:
        self._varlen_func = flash_attn_varlen_func
        self._has_window = "window_size" in inspect.signature(flash_attn_varlen_func).parameters

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        meta: AttentionMetadata,
        causal: bool,
        window: int | None = None,
        bias: AttentionBias | None = None,
    ) -> torch.Tensor:
        self.refuse_bias(bias)
        cu = meta.cu_seqlens
        kwargs: dict[str, Any] = {}
        if window is not None:  # (left, right), inclusive; causal makes it (window, 0) in FA4 too
            if not self._has_window:
                raise ValueError(f"flash-attn: {self.window_refusal(causal)}")
            kwargs["window_size"] = (window, 0 if causal else window)
        out = self._varlen_func(
            q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu,
            max_seqlen_q=meta.max_seqlen, max_seqlen_k=meta.max_seqlen, causal=causal, **kwargs,
        )  # fmt: skip
        result: torch.Tensor = out[0] if isinstance(out, tuple) else out
        return result

    def window_refusal(self, causal: bool) -> str | None:
        return None if self._has_window else "this flash-attn-4's flash_attn_varlen_func has no window_size"


def flash_attn_4_backend() -> FlashAttn4Attention | None:
    """FlashAttention 4, or None when it is not installed. Importing it takes seconds (CuTe DSL), so
    only CUDA workers ask."""
    try:
        with warnings.catch_warnings():  # its CuTe DSL imports deprecated aliases of itself
            warnings.simplefilter("ignore", DeprecationWarning)
            from flash_attn.cute.interface import flash_attn_varlen_func
    except ImportError:
        return None
    # The DSL warns once per compiled kernel about an argument it treats as a compile-time constant.
    warnings.filterwarnings("ignore", message="Argument aux_data", category=UserWarning)
    return FlashAttn4Attention(flash_attn_varlen_func)


class FlashInferAttention(Attention):
    """flashinfer's ragged prefill (`BatchPrefillWithRaggedKVCacheWrapper`, FA3 kernels on Hopper) as an
    `Attention`. Unlike the other backends it needs a plan per batch, made on the host from the
    batch's offsets: the plan (tile and split schedule) is copied into a device buffer that the
    kernel, and so a captured graph, reads. The engine calls `plan_batch` before every forward, eager
    or replayed; callers that pass `meta.host_cu_seqlens` (tests, the auto probes) are planned from
    those on the first call. One wrapper per batch shape (token count, sequence slots; every layer
    shares it), in CUDA-graph mode, so its buffers stay put and every plan for that shape is laid
    out alike. A plan is written into pinned host memory and copied asynchronously; each in-flight
    batch (`scratch`, the engine's pinned slot) gets its own such buffer, so planning batch N+1
    never overwrites what batch N's copy has not read yet.
    """

    HEAD_DIMS = (64, 128, 256)  # what its prefill kernels are compiled for
    _INT_WORKSPACE_BYTES = 2 << 20  # the plan's index arrays: ~16 bytes a token and a few KiB
    _FLOAT_WORKSPACE_BYTES = 256 << 20  # split-KV partial outputs; shared (one stream runs them)
    plans_batches = True

    def __init__(
        self, device: torch.device, *, compile_kernels: bool, wrapper_class: type[Any] | None = None
    ) -> None:
        if wrapper_class is None:
            from flashinfer import BatchPrefillWithRaggedKVCacheWrapper

            wrapper_class = BatchPrefillWithRaggedKVCacheWrapper
        self._wrapper_class = wrapper_class
        self.device = device
        self.compile_kernels = compile_kernels  # False: use kernels already built, never run nvcc
        self._float_workspace: torch.Tensor | None = None
        self._wrappers: dict[tuple[int, int], dict[_Shape, _Planned]] = {}
        self._pinned: weakref.WeakKeyDictionary[object, torch.Tensor] = weakref.WeakKeyDictionary()
        self._step = 0
        # the next forward's (token count, sequence slots), offsets and scratch, from plan_batch
        self._pending: tuple[tuple[int, int], torch.Tensor, object | None] | None = None

    def plan_batch(self, cu_seqlens: torch.Tensor, scratch: object | None = None) -> None:
        """Plan the next forward (`Attention.plan_batch`); without `scratch`, in a fresh pinned buffer."""
        self._step += 1
        key = (int(cu_seqlens[-1]), cu_seqlens.shape[0] - 1)
        self._pending = (key, cu_seqlens, scratch)
        for planned in self._wrappers.get(key, {}).values():
            self._plan(planned, cu_seqlens, scratch)

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        meta: AttentionMetadata,
        causal: bool,
        window: int | None = None,
        bias: AttentionBias | None = None,
    ) -> torch.Tensor:
        self.refuse_bias(bias)
        if window is not None and not causal:
            raise ValueError(f"flashinfer: {self.window_refusal(causal)}")
        key = (q.shape[0], meta.cu_seqlens.shape[0] - 1)
        shape: _Shape = (
            q.shape[1],
            k.shape[1],
            q.shape[2],
            q.dtype,
            causal,
            -1 if window is None else window,
        )
        planned = self._wrappers.setdefault(key, {}).get(shape)
        if planned is None:
            planned = self._wrappers[key][shape] = self._new_wrapper(key, shape)
        if meta.host_cu_seqlens:  # a caller outside the engine: plan when the offsets change
            if planned.offsets != meta.host_cu_seqlens:
                offsets = torch.tensor(meta.host_cu_seqlens, dtype=torch.int32)
                self._plan(planned, offsets, None, meta.host_cu_seqlens)
        elif planned.step != self._step:
            if self._pending is None or self._pending[0] != key:
                raise RuntimeError(f"flashinfer attention on a batch of {key} was not planned (plan_batch)")
            self._plan(planned, *self._pending[1:])
        out: torch.Tensor = planned.wrapper.run(q, k, v)
        return out

    def window_refusal(self, causal: bool) -> str | None:
        """flashinfer's `window_left` bounds the keys before a query only: a causal window is served
        (every layer's plan made with its own), a symmetric one is not."""
        return None if causal else "its window_left bounds keys on the left only, not a symmetric window"

    @torch.inference_mode(False)  # plain tensors: planning may run outside inference mode too
    def _new_wrapper(self, key: tuple[int, int], shape: _Shape) -> "_Planned":
        if self._float_workspace is None:
            size = self._FLOAT_WORKSPACE_BYTES
            self._float_workspace = torch.empty(size, dtype=torch.uint8, device=self.device)
        indptr = torch.zeros(key[1] + 1, dtype=torch.int32, device=self.device)
        wrapper = self._wrapper_class(
            self._float_workspace, "NHD", use_cuda_graph=True, qo_indptr_buf=indptr, kv_indptr_buf=indptr
        )
        int_workspace = torch.empty(self._INT_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        wrapper.reset_workspace_buffer(self._float_workspace, int_workspace)
        if not hasattr(wrapper, _PLAN_HOST_BUFFER):  # without it, batches in flight could share one
            raise RuntimeError(f"this flashinfer's wrapper has no {_PLAN_HOST_BUFFER}; kembed needs 0.7.x")
        return _Planned(wrapper, shape)

    def _plan(
        self,
        planned: "_Planned",
        cu_seqlens: torch.Tensor,
        scratch: object | None,
        offsets: tuple[int, ...] = (),
    ) -> None:
        num_heads, num_kv_heads, head_dim, dtype, causal, window_left = planned.shape
        # the window only where there is one: the plan's other arguments as they always were
        window = {} if window_left < 0 else {"window_left": window_left}
        wrapper = planned.wrapper
        # flashinfer writes the plan into this pinned buffer, then copies it to the device on the
        # stream: one buffer per in-flight batch (the attribute is flashinfer's own, 0.7.x).
        setattr(wrapper, _PLAN_HOST_BUFFER, self._pinned_buffer(scratch))
        first = planned.step < 0
        disable_jit = first and not self.compile_kernels and "FLASHINFER_DISABLE_JIT" not in os.environ
        if disable_jit:  # building the kernel module here would take minutes: refuse instead
            os.environ["FLASHINFER_DISABLE_JIT"] = "1"
        try:
            wrapper.plan(
                cu_seqlens, cu_seqlens, num_heads, num_kv_heads, head_dim,
                causal=causal, q_data_type=dtype, non_blocking=True, **window,
            )  # fmt: skip
        except Exception as error:
            if disable_jit and "JIT" in str(error):
                raise RuntimeError(
                    f"flashinfer's kernels for head_dim {head_dim} {dtype} are not built yet: start once "
                    "with --attention-backend flashinfer (nvcc compiles them, minutes) or install "
                    "flashinfer-jit-cache"
                ) from error
            raise
        finally:
            if disable_jit:
                del os.environ["FLASHINFER_DISABLE_JIT"]
        planned.step, planned.offsets = self._step, offsets

    def _pinned_buffer(self, scratch: object | None) -> torch.Tensor:
        def fresh() -> torch.Tensor:
            pin = self.device.type == "cuda"  # (a CPU-only torch cannot pin)
            return torch.empty(self._INT_WORKSPACE_BYTES, dtype=torch.uint8, pin_memory=pin)

        if scratch is None:
            return fresh()
        if scratch not in self._pinned:
            self._pinned[scratch] = fresh()
        return self._pinned[scratch]


# The wrapper's pinned host buffer that plan() writes before copying it to the device (flashinfer 0.7.x).
_PLAN_HOST_BUFFER = "_pin_memory_int_workspace_buffer"


@dataclass(eq=False)
class _Planned:
    """One flashinfer wrapper, the step it was last planned for, and the offsets it was planned from
    when a caller outside the engine gave them."""

    wrapper: Any  # flashinfer's BatchPrefillWithRaggedKVCacheWrapper (untyped)
    shape: _Shape
    step: int = -1
    offsets: tuple[int, ...] = ()


def flashinfer_backend(device: torch.device, compile_kernels: bool) -> FlashInferAttention | None:
    try:
        import flashinfer  # noqa: F401
    except ImportError:
        return None
    return FlashInferAttention(device, compile_kernels=compile_kernels)
