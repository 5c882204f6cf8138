"""kembed.gateway.pool: the worker replicas behind one gateway: discovery, probes and the model check
(`workers`, `replicas`, `model_check`), a request's chunks fanned out and joined (`fanout`, `batches`),
each chunk's attempts, hedges and moves (`attempts`), its pacing (`pacing`), and one transport per
replica, unary gRPC or the data port's frames (`transports`).

The only gRPC in the gateway (with the golden tool); no HTTP framework.
"""
