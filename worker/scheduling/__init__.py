"""kembed.worker.scheduling: which sequences run next, plain Python and numpy over token counts: admission
and the class queues (`scheduler`, `queues`, `groups`), deadlines (`deadlines`), the device paths
that launch batches and wait for them off the event loop (`device_path`) and the watch on their steps
(`stalls`).

No torch, no gRPC: it drives an engine through the `BatchRunner` protocol and hands back results.
"""
