"""kembed.proto: the gateway<->worker gRPC contract (package `kembed.v1`) and its generated stubs.

The only code the gateway and the worker share. Edit `embedder.proto`, run `make proto`, commit the
regenerated `embedder_pb2*.py`; a test fails when they are stale. Nothing here imports our other layers.
"""
