"""kembed.proto: what the gateway and the worker share, the only code they both import.

The gRPC contract (package `kembed.v1`: edit `embedder.proto`, run `make proto`, commit the
regenerated `embedder_pb2*.py`; a test fails when they are stale), the data port's framing, the
layout of several outputs a sequence, what a model directory says about tokenizing (`model_files`),
the routes particular to a task, the accuracy bar and the version. It imports nothing of ours, and
nothing heavier than numpy, protobuf and gRPC.
"""
