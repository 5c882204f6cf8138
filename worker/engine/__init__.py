"""kembed.worker.engine: the only layer that touches torch and CUDA.

`load_engine(config)` reads a local model directory and returns a `BaseEngine` (the eager `Engine`,
or the `CudaEngine` of CUDA graphs) whose `pack` builds host tensors for a ragged batch and whose
`step` launches it and returns a `ResultHandle` (worker/results.py) at once. It knows nothing of
gRPC, requests or queues.
"""

from kembed.worker.engine.base import BaseEngine
from kembed.worker.engine.engine import Engine, PackedBatch, load_engine
from kembed.worker.engine.lazy import LazyTensor

__all__ = ["BaseEngine", "Engine", "LazyTensor", "PackedBatch", "load_engine"]
