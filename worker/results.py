"""`ResultHandle`: a launched batch whose rows may not be on the host yet. Torch-free, so the scheduler
(plain Python) types against the same class every engine's `step` returns."""

from abc import ABC, abstractmethod

import numpy as np

# A batch of at most this many sequences launched onto an idle device is a lone query's (or a few
# queries' on a worker otherwise idle): its every tenth of a millisecond shows, so its completion is
# caught at once (polled for on the event loop, or spun for by its waiter: a CUDA event's default
# synchronisation, the GIL released). Any other batch, a large one or one launched behind another,
# is waited for asleep (a blocking event): a busy worker then spins no core through its steps (H200,
# 8 gateway processes, 23,700 queries/s: 55 µs of worker CPU a query while every batch alone was
# polled). Torch-free, so the scheduler and the engine read the one rule.
LONE_MAX_SEQUENCES = 16


class ResultHandle(ABC):
    """What `step` hands back at once: the batch is launched, its rows land later.

    `is_ready()` never blocks: the scheduler polls it from the event loop. `wait()` blocks the calling
    thread until the rows are on the host (a waiter thread, or the loop once `is_ready()` said so)
    and returns them, [num_rows, dimensions] float32; call it once."""

    @abstractmethod
    def is_ready(self) -> bool: ...

    @abstractmethod
    def wait(self) -> np.ndarray: ...
