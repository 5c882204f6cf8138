"""The engines' result handles (`ResultHandle`, worker/results.py): `LazyTensor`, a host buffer the
device fills, and `to_host` that launches such a copy. The CUDA engine's ring slots have their own
(`CudaLazyTensor`, cuda_engine.py)."""

import numpy as np
import torch

from kembed.worker.results import ResultHandle


class LazyTensor(ResultHandle):
    """A host (pinned, on CUDA) buffer that the device fills asynchronously, plus the event that says when.

    `step` returns one at once; `wait()` blocks the calling thread (never the event loop: the
    scheduler calls it from a waiter thread) until the copy has landed, then hands back a numpy view.
    `keepalive` holds the device tensors the copy reads from until the copy has completed.

    CUDA's default synchronisation spins a core until the event fires, a whole step's worth of CPU
    per batch on the waiter thread; an event made with `blocking=True` puts the waiter to sleep in
    the driver instead, and wakes it later, which costs a lone batch a slower wake-up but under load
    saves the worker about half its CPU per request (docs/benchmarks-history.md). So eager steps'
    events block; the CUDA engine's replays spin for a short batch alone on the device and block
    for any other (cuda_engine.py, SPIN_MAX_TOKENS), and the event loop polls a small batch alone
    itself (a query, no spin of its own: device_path.py).
    """

    def __init__(
        self, host: torch.Tensor, event: "torch.cuda.Event | None", keepalive: tuple[object, ...] = ()
    ) -> None:
        self._host = host
        self._event = event
        self._keepalive = keepalive

    def is_ready(self) -> bool:
        """Without an event (a CPU step, computed inside `step`) the rows are there already."""
        return self._event is None or bool(self._event.query())

    def wait(self) -> np.ndarray:
        if self._event is not None:
            self._event.synchronize()
        self._keepalive = ()
        return self._host.numpy()


def to_host(rows: torch.Tensor) -> LazyTensor:
    """`rows` as a LazyTensor: on a CPU as they are; on a GPU copied into a fresh pinned buffer on the
    current stream, with a blocking event (its waiter sleeps, not spins) and `rows` kept alive until
    the copy has completed. For eager steps; replays use the ring's slots."""
    if rows.device.type != "cuda":
        return LazyTensor(rows, None)
    host = torch.empty(rows.shape, dtype=torch.float32, pin_memory=True)
    host.copy_(rows, non_blocking=True)
    event = torch.cuda.Event(blocking=True)
    event.record()
    return LazyTensor(host, event, keepalive=(rows,))
