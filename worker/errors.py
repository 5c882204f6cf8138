"""The worker's error hierarchy, translated to gRPC status codes once, in the server's interceptor.

Kept free of grpc so the scheduler and engine can raise these; each class names its status code.
"""


class WorkerError(Exception):
    """Base class; `status` is the name of the grpc.StatusCode the server answers with."""

    status = "INTERNAL"


class InvalidInput(WorkerError):
    """The request itself is wrong (bad lengths, out-of-vocabulary id, too long)."""

    status = "INVALID_ARGUMENT"


class Overloaded(WorkerError):
    """Admission refused: queued tokens would pass `max_queued_tokens`. Refused at once, not queued."""

    status = "RESOURCE_EXHAUSTED"


class Unavailable(WorkerError):
    """The worker is starting or shutting down."""

    status = "UNAVAILABLE"


class DeadlineExceeded(WorkerError):
    """A request's deadline passed before it was answered; its place in the queue is freed."""

    status = "DEADLINE_EXCEEDED"


class Unsupported(WorkerError):
    """The served model or this worker version does not do what was asked (e.g. scoring)."""

    status = "UNIMPLEMENTED"


class StartupError(Exception):
    """The configuration cannot be served on this machine (no CUDA device, a backend not installed,
    an unsupported model): the worker says why in one line and exits 2, before serving anything."""
