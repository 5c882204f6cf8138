"""kembed.worker: the GPU worker — gRPC server → token-budget scheduler → engine.

- `server` (gRPC), `streams` and `frames` (the data port) are the only modules that touch
  gRPC/protobuf; they validate and admit requests and await their results, never blocking the event
  loop on the device.
- `scheduler` is plain Python and numpy over token counts (no torch, no gRPC): admission against
  `max_queued_tokens` (overload refused at once), the interactive and bulk class queues, taken round
  robin across requests, and one loop giving each device path (the main one, an interactive lane)
  its next batch while the previous one runs.
- `engine` is the only package that touches torch/CUDA; it knows nothing of gRPC, requests or queues.
- The commands beside them (`admin`, `check_model`, `model_fetch`) serve no traffic.
It must not import `kembed.gateway` or `kembed.operator`; configuration is one frozen `WorkerConfig`,
parsed once from flags and environment (`cli`).
"""
