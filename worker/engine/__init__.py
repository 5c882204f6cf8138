"""kembed.worker.engine: the only layer that touches torch and CUDA.

`load_engine(config)` reads a local model directory and returns an `Engine` whose `pack` builds
host tensors for a ragged batch and whose `step` launches it and returns a `LazyTensor` at once.
It knows nothing of gRPC, requests or queues.
"""

from kembed.worker.engine.engine import Engine, PackedBatch, load_engine
from kembed.worker.engine.lazy import LazyTensor

__all__ = ["Engine", "LazyTensor", "PackedBatch", "load_engine"]
