"""CUDA green contexts through the driver API (ctypes), for bench_lane_contention.py: the device's SMs
split into two disjoint groups, each with streams whose kernels run only on its SMs.

torch's own `torch.cuda.green_contexts.GreenContext.create(num_sms=k)` splits k SMs off the whole
device each time (its source; not tried), so two of them would overlap; splitting one SM resource into
a group and its remainder does not.
Measured on an H200 (driver 580): eager kernels launched on such a stream, and graphs captured on
one, run on its SMs only; a graph captured on an ordinary stream and replayed on one does not."""

import ctypes

import torch

_RESOURCE_BYTES = 256  # CUdevResource is 144 bytes in CUDA 12.4-13; room to spare
_SM_COUNT_OFFSET = 96  # CUdevResource.sm.smCount follows the type (4) and 92 bytes of padding
_SM_RESOURCE = 1  # CU_DEV_RESOURCE_TYPE_SM
_DEFAULT_STREAM = 1  # CU_GREEN_CTX_DEFAULT_STREAM, required by cuGreenCtxCreate
_NON_BLOCKING = 1  # CU_STREAM_NON_BLOCKING, required by cuGreenCtxStreamCreate


def _check(result: int, call: str) -> None:
    if result != 0:
        raise RuntimeError(f"{call} failed: CUresult {result}")


class SmGroup:
    """One green context: `num_sms` SMs of the device; `stream()` makes streams that run on them."""

    def __init__(self, driver: ctypes.CDLL, device: ctypes.c_int, resource: ctypes.Array) -> None:
        self._driver = driver
        self.num_sms = int.from_bytes(bytes(resource[_SM_COUNT_OFFSET : _SM_COUNT_OFFSET + 4]), "little")
        desc, self._context = ctypes.c_void_p(), ctypes.c_void_p()
        _check(driver.cuDevResourceGenerateDesc(ctypes.byref(desc), resource, 1), "cuDevResourceGenerateDesc")
        _check(
            driver.cuGreenCtxCreate(ctypes.byref(self._context), desc, device, _DEFAULT_STREAM),
            "cuGreenCtxCreate",
        )

    def stream(self, priority: int = 0) -> torch.cuda.ExternalStream:
        handle = ctypes.c_void_p()
        _check(
            self._driver.cuGreenCtxStreamCreate(ctypes.byref(handle), self._context, _NON_BLOCKING, priority),
            "cuGreenCtxStreamCreate",
        )
        return torch.cuda.ExternalStream(handle.value)


def split_sms(min_sms: int, device_index: int = 0) -> tuple[SmGroup, SmGroup]:
    """(a group of at least `min_sms` SMs, rounded up to the device's granularity; the rest)."""
    torch.cuda.init()
    driver = ctypes.CDLL("libcuda.so.1")
    device = ctypes.c_int()
    _check(driver.cuDeviceGet(ctypes.byref(device), device_index), "cuDeviceGet")
    whole = (ctypes.c_ubyte * _RESOURCE_BYTES)()
    _check(driver.cuDeviceGetDevResource(device, whole, _SM_RESOURCE), "cuDeviceGetDevResource")
    group, rest = (ctypes.c_ubyte * _RESOURCE_BYTES)(), (ctypes.c_ubyte * _RESOURCE_BYTES)()
    num_groups = ctypes.c_uint(1)
    _check(
        driver.cuDevSmResourceSplitByCount(group, ctypes.byref(num_groups), whole, rest, 0, min_sms),
        "cuDevSmResourceSplitByCount",
    )
    return SmGroup(driver, device, group), SmGroup(driver, device, rest)
