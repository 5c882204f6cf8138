"""kembed.worker: the GPU worker — gRPC server → FCFS token-budget scheduler → engine.

- `server` is the only module that touches gRPC/protobuf; it admits sequences and awaits results,
  never blocking the event loop on the device.
- `scheduler` is plain Python over token counts (no torch): first come, first served up to
  `max_batch_tokens`, packing batch N+1 while batch N runs.
- `engine` is the only package that touches torch/CUDA: model code, ragged attention, pooling, and
  the result handles (`results.ResultHandle`) it returns at once from `step`.
Configuration is one frozen `WorkerConfig`, parsed once from flags and environment (`cli`).
"""
