"""The attention backends by name: the ones every worker has, and `cuda_backends`, the varlen kernels
usable on a GPU (flash-attn, flashinfer and triton only when installed and usable there). Their names
are the worker's `attention_backend` choices (config.py), less `auto`."""

import logging

import torch

from kembed.worker.engine.layers.attention import (
    Attention,
    AttentionShape,
    FlashAttn4Attention,
    FlashInferAttention,
    SdpaLoopAttention,
    SdpaPaddedAttention,
    TorchVarlenAttention,
    flash_attn_4_backend,
    flashinfer_backend,
    torch_varlen_backend,
)
from kembed.worker.engine.layers.triton_attention import HEAD_DIMS, TritonAttention, triton_attention_backend

log = logging.getLogger(__name__)

ATTENTION_BACKENDS: dict[str, Attention] = {"sdpa": SdpaLoopAttention(), "sdpa-padded": SdpaPaddedAttention()}
# Backends that take packed sequences natively: the only ones CUDA graphs can replay, since
# they need no per-batch gather indices whose size depends on the longest sequence.
VARLEN_BACKENDS: dict[str, Attention] = {}
if (_varlen := torch_varlen_backend()) is not None:
    VARLEN_BACKENDS["torch-varlen"] = _varlen
ATTENTION_BACKENDS.update(VARLEN_BACKENDS)


def cuda_backends(
    device: torch.device, shape: AttentionShape | None = None, *, compile_kernels: bool = False
) -> dict[str, Attention]:
    """Every varlen backend usable on `device` (for `shape`'s heads when given), in order of preference
    before timing. `compile_kernels`: let flashinfer build kernels it lacks (minutes with nvcc).
    A `shape` whose scores carry a relative-position bias keeps only the backends that add it
    (`Attention.bias_kinds`); the others are dropped, and logged."""
    backends: dict[str, Attention] = dict(VARLEN_BACKENDS)
    major, _ = torch.cuda.get_device_capability(device)
    if major in (9, 10):  # FA4 has kernels for Hopper (sm90) and Blackwell (sm100) only
        if (fa4 := flash_attn_4_backend()) is not None:
            backends["flash-attn"] = fa4
        else:
            log.info("flash-attn-4 is not installed: attention backend flash-attn unavailable")
    ours = triton_attention_backend()
    if ours is not None and (shape is None or shape.head_dim in HEAD_DIMS):
        backends["triton"] = ours
    if major >= 8 and (shape is None or shape.head_dim in FlashInferAttention.HEAD_DIMS):
        if (flashinfer := flashinfer_backend(device, compile_kernels)) is not None:
            backends["flashinfer"] = flashinfer
        else:
            log.info("flashinfer-python is not installed: attention backend flashinfer unavailable")
    if shape is not None and shape.bias:
        dropped = [name for name, attention in backends.items() if shape.bias not in attention.bias_kinds]
        if dropped:
            log.info(
                "attention backends %s add no %s position bias: not used for this model",
                ", ".join(dropped),
                shape.bias,
            )
        backends = {name: b for name, b in backends.items() if name not in dropped}
    if shape is not None and shape.window is not None:
        for name in list(backends):
            reason = window_refusal(backends[name], shape)
            if reason is not None:
                log.info("attention backend %s is not used for this model: %s", name, reason)
                del backends[name]
    return backends


# Every varlen backend by name and class, installed here or not (what `bias_backends` reads).
_VARLEN_CLASSES: dict[str, type[Attention]] = {
    "torch-varlen": TorchVarlenAttention,
    "flash-attn": FlashAttn4Attention,
    "flashinfer": FlashInferAttention,
    "triton": TritonAttention,
}


def bias_backends(bias: str) -> list[str]:
    """The varlen backends that add a position bias of kind `bias` (AttentionShape.bias), whether
    installed here or not: what serves such a model in CUDA graphs (check-model says it)."""
    return [name for name, cls in _VARLEN_CLASSES.items() if bias in cls.bias_kinds]


def window_refusal(backend: Attention, shape: AttentionShape) -> str | None:
    """Why `backend` cannot serve `shape`'s sliding window exactly; None when it can (or there is none)."""
    if shape.window is None:
        return None
    reason = backend.window_refusal(shape.is_causal)
    if reason is None:
        return None
    kind = "causal" if shape.is_causal else "symmetric"
    return f"its layers have a {kind} sliding window of {shape.window} tokens, and this backend: {reason}"
