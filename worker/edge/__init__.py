"""kembed.worker.edge: requests in and answers out, the only worker modules that touch gRPC and protobuf:
the gRPC service and its Info and Health (`server`, `readiness`), the data port's frames (`frames`,
`frame_decoding`), gRPC Stream calls (`streams`), the shared token (`auth`), what makes a request
unservable (`validation`) and a sparse model's answers compacted (`vocabulary`).

It admits into the scheduler and awaits results; it never touches torch or blocks the event loop on
the device.
"""
