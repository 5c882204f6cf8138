"""Programmatic dependent launch (PDL) for our Triton kernels (fused.py, fused_decoder.py).

A kernel launched with PDL may start while the kernel before it in the stream is still finishing;
it prepares what does not depend on that kernel (its program ids, weight loads) and then waits in
`gdc_wait` until the previous kernel has completed and its writes are visible. Measured on an H200
(triton 3.6.0), a chain of small Triton kernels inside a CUDA graph went from 2.03 to 1.60 µs a
kernel. cuBLAS GEMMs and attention kernels are not PDL-launched, so the gain is at the boundaries
into our kernels; CUDA graphs captured with PDL launches keep the programmatic edges.

The rules every kernel here keeps, which make PDL safe in any chain: each program calls `gdc_wait`
before it loads activations or writes anything, so a PDL kernel never completes before the kernel
before it has (completion stays transitive along the stream). Only a norm's weights are loaded
before the wait, which is why the norms take weights that no kernel has just written (the model's
parameters; a caller with a weight computed just before passes `use_pdl=False`).
`gdc_launch_dependents` after the last load of activations only lets the next PDL kernel start
early; that kernel's own `gdc_wait` still waits for this one to complete and flush.

PDL is used where the GPU has compute capability >= 9.0 and Triton has `gdc_wait`, decided once per
device. `KEMBED_PDL=0` in the environment turns it off (read once, at the first launch; `1`, the
default, leaves it to the device), so a run can be measured with and without it.
"""

import functools
import logging
import os

import torch

try:
    import triton
except ImportError:  # CPU-only torch builds ship without Triton
    triton = None

# The grid-dependency instructions, which the kernels call under their PDL constexpr. Where Triton
# lacks them (HAS_GDC false, so PDL is never asked for) no-ops stand in: Triton's JIT resolves every
# name a kernel mentions, even in a branch its constexpr rules out.
HAS_GDC = False
if triton is not None:
    try:
        from triton.language.extra.cuda import gdc_launch_dependents as gdc_launch_dependents
        from triton.language.extra.cuda import gdc_wait as gdc_wait

        HAS_GDC = True
    except ImportError:

        @triton.jit
        def gdc_wait():  # type: ignore[no-untyped-def]
            pass

        @triton.jit
        def gdc_launch_dependents():  # type: ignore[no-untyped-def]
            pass


log = logging.getLogger(__name__)

ENV_SWITCH = "KEMBED_PDL"
MIN_CAPABILITY = (9, 0)  # Hopper: griddepcontrol is an sm_90 instruction


def is_supported(device: torch.device) -> bool:
    """Whether this device and this Triton can launch our kernels with PDL."""
    return HAS_GDC and device.type == "cuda" and torch.cuda.get_device_capability(device) >= MIN_CAPABILITY


@functools.cache
def is_switched_on() -> bool:
    """KEMBED_PDL, read once: 1 (the default) leaves PDL to the device, 0 turns it off."""
    switch = os.environ.get(ENV_SWITCH, "1")
    if switch not in ("0", "1"):
        raise ValueError(f"{ENV_SWITCH}={switch!r}: expected 0 (PDL off) or 1 (PDL where supported)")
    return switch == "1"


@functools.cache
def is_enabled(device_index: int) -> bool:
    """Whether our kernels launch with PDL on this CUDA device (decided once, and logged)."""
    device = torch.device("cuda", device_index)
    enabled = is_switched_on() and is_supported(device)
    log.info(
        "PDL for the Triton kernels on %s: %s (%s=%s, compute capability %s, triton gdc_wait %s)",
        device, "on" if enabled else "off", ENV_SWITCH, int(is_switched_on()),
        torch.cuda.get_device_capability(device), "present" if HAS_GDC else "absent",
    )  # fmt: skip
    return enabled


def launch_options(device: torch.device, pdl: bool | None = None) -> dict[str, bool]:
    """Keyword arguments for a launch of one of our kernels on `device`: the kernel's `PDL`
    constexpr, plus Triton's `launch_pdl` when on. `pdl` None: the device's choice (above);
    True or False forces it (tests and benchmarks compare the two launches)."""
    if pdl is None:
        pdl = is_enabled(device.index if device.index is not None else torch.cuda.current_device())
    elif pdl and not is_supported(device):
        raise ValueError(f"PDL asked for on {device}, which (or whose Triton) does not support it")
    return {"PDL": True, "launch_pdl": True} if pdl else {"PDL": False}
