"""`ResultHandle`: a launched batch whose rows may not be on the host yet. Torch-free, so the scheduler
(plain Python) types against the same class every engine's `step` returns."""

from abc import ABC, abstractmethod

import numpy as np


class ResultHandle(ABC):
    """What `step` hands back at once: the batch is launched, its rows land later.

    `is_ready()` never blocks: the scheduler polls it from the event loop. `wait()` blocks the calling
    thread until the rows are on the host (a waiter thread, or the loop once `is_ready()` said so)
    and returns them, [num_rows, dimensions] float32; call it once."""

    @abstractmethod
    def is_ready(self) -> bool: ...

    @abstractmethod
    def wait(self) -> np.ndarray: ...
