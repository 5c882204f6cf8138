"""kembed.worker.engine: the only layer that touches torch and CUDA.

`load_engine(config)` reads a local model directory, resolves the device, dtype and attention backend
once, and returns a `BaseEngine` (the eager `Engine`, or the `CudaEngine` of CUDA graphs per padded
bucket) whose `pack` lays a ragged batch into host buffers and whose `step` launches it and returns a
`ResultHandle` (worker/results.py) at once, never waiting on the device. It knows nothing of gRPC,
requests, classes or queues (of `kembed.proto` it reads only the numpy layout of several outputs).
"""

from kembed.worker.engine.base import BaseEngine
from kembed.worker.engine.engine import Engine, PackedBatch, load_engine
from kembed.worker.engine.lazy import LazyTensor

__all__ = ["BaseEngine", "Engine", "LazyTensor", "PackedBatch", "load_engine"]
