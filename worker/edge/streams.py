"""Many Embed/Score requests multiplexed over one long-lived connection: a gRPC `Stream` call, or a
plain TCP connection of frames (frames.py), answered by the same code.

A gateway process keeps one such connection per replica open and sends every chunk over it; the
answer to a request is a `StreamResponse` with the request's id, in completion order. It saves what a
unary RPC costs per call on both sides (an HTTP/2 stream, headers, call objects, the interceptor);
frames also save grpc.aio's wake-ups of the event loop from its own thread (docs/benchmarks.md, the
request path).

- Each request runs in its own task, so a slow batch never holds up the reading of the next one.
- grpc.aio allows one write in flight per call: a stream's answers are written under one lock.
- A request's deadline (`timeout_ms`) is enforced here too, so a request the gateway has given up on
  stops holding queue space; a `cancel` message, or the stream's end, cancels its task, which frees
  its place in the scheduler at once.
- Errors become a `StreamError` with the status code a unary call would have ended with; the stream
  itself stays up.
- On shutdown, `drain` answers new requests UNAVAILABLE (the gateway retries them elsewhere), lets
  the ones in flight finish, then ends each stream, so a rolling restart loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import grpc

from kembed.proto import embedder_pb2 as pb
from kembed.worker.errors import WorkerError

log = logging.getLogger(__name__)

Handler = Callable[[Any], Awaitable[Any]]
"""Answers one request message (an EmbedRequest or ScoreRequest) with its response message."""


def _code(status: grpc.StatusCode) -> int:
    code: int = status.value[0]
    return code


class Connection(Protocol):
    """One caller's multiplexed requests: a gRPC Stream call or a frame connection (frames.py)."""

    tasks: dict[int, asyncio.Task[None]]  # its requests in flight, by id

    async def write(self, response: pb.StreamResponse) -> None: ...

    async def end(self) -> None:
        """Close it from the worker's side (drain): the caller sees UNAVAILABLE or end of file."""


class _GrpcStream:
    """One open Stream call: its handler task, its requests' tasks by id, and its one writer."""

    def __init__(self, context: grpc.aio.ServicerContext[pb.StreamRequest, pb.StreamResponse]) -> None:
        self.context = context
        self.handler = asyncio.current_task()
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self._write_lock = asyncio.Lock()

    async def write(self, response: pb.StreamResponse) -> None:
        async with self._write_lock:  # grpc.aio: one write in flight per call
            await self.context.write(response)

    async def end(self) -> None:
        with contextlib.suppress(Exception):  # ends the call on the wire: the caller reads UNAVAILABLE
            await self.context.abort(grpc.StatusCode.UNAVAILABLE, "worker is shutting down")
        if self.handler is not None:  # it may still wait in read(): wake it to leave
            self.handler.cancel()
            await asyncio.gather(self.handler, return_exceptions=True)


class StreamServer:
    """Serves multiplexed requests (`Stream` calls and frame connections) with the same handlers as
    the unary Embed and Score."""

    def __init__(self, embed: Handler, score: Handler) -> None:
        self._handlers = {"embed": embed, "score": score}
        self._connections: set[Connection] = set()
        self._is_draining = False

    def open(self, connection: Connection) -> None:
        self._connections.add(connection)

    def close(self, connection: Connection) -> None:
        """The connection is gone: its requests are cancelled (freeing their queue space)."""
        self._connections.discard(connection)
        for task in list(connection.tasks.values()):
            task.cancel()

    def dispatch(self, message: pb.StreamRequest, connection: Connection) -> None:
        """Start answering one request, or cancel one (`cancel` set)."""
        tasks = connection.tasks
        kind = message.WhichOneof("kind")
        if kind is None and message.auth_token:  # a caller's token, here where none is asked for
            return
        if kind == "cancel":
            task = tasks.pop(message.id, None)
            if task is not None:
                task.cancel()
            return
        task = asyncio.create_task(self._answer(message, kind, connection))
        tasks[message.id] = task
        task.add_done_callback(functools.partial(_forget, tasks, message.id))

    async def serve(self, context: grpc.aio.ServicerContext[pb.StreamRequest, pb.StreamResponse]) -> None:
        """One gRPC Stream call, until the caller closes or cancels it, or the worker drains."""
        stream = _GrpcStream(context)
        self.open(stream)
        try:
            while True:
                message = await context.read()
                # the caller is done sending: answer what is in flight (grpc-stubs lacks grpc.aio.EOF)
                if message is grpc.aio.EOF:  # type: ignore[attr-defined]
                    await asyncio.gather(*stream.tasks.values(), return_exceptions=True)
                    return
                self.dispatch(message, stream)
        finally:
            self.close(stream)

    async def _answer(self, message: pb.StreamRequest, kind: str, stream: Connection) -> None:
        request_id = message.id
        try:
            if self._is_draining:
                raise _Refused(grpc.StatusCode.UNAVAILABLE, "worker is shutting down")
            if kind not in self._handlers:
                raise _Refused(
                    grpc.StatusCode.INVALID_ARGUMENT, "a stream request must hold embed, score or cancel"
                )
            timeout = message.timeout_ms / 1000 if message.timeout_ms else None
            async with asyncio.timeout(timeout):
                result = await self._handlers[kind](getattr(message, kind))
            response = pb.StreamResponse(id=request_id, **{kind: result})
        except TimeoutError:
            response = _error(
                request_id, grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded in the worker"
            )
        except WorkerError as exc:
            response = _error(request_id, grpc.StatusCode[exc.status], str(exc))
        except _Refused as exc:
            response = _error(request_id, exc.status, exc.message)
        except Exception:
            log.exception("stream request %d failed", request_id)
            response = _error(
                request_id, grpc.StatusCode.INTERNAL, "internal error in the worker (see its log)"
            )
        with contextlib.suppress(Exception):  # the stream ended meanwhile: nobody waits for the answer
            await stream.write(response)

    async def drain(self, timeout_s: float) -> None:
        """Refuse new requests, let those in flight finish (up to `timeout_s`), end the connections."""
        self._is_draining = True
        in_flight = [task for connection in self._connections for task in connection.tasks.values()]
        if in_flight:  # those arriving from now on are refused at once, so this set only shrinks
            await asyncio.wait(in_flight, timeout=timeout_s)
        await asyncio.gather(*(connection.end() for connection in list(self._connections)))


def _forget(tasks: dict[int, asyncio.Task[None]], key: int, done: asyncio.Task[None]) -> None:
    if tasks.get(key) is done:  # an id reused after a cancel must not drop the newer task
        del tasks[key]


class _Refused(Exception):
    def __init__(self, status: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def _error(request_id: int, status: grpc.StatusCode, message: str) -> pb.StreamResponse:
    return pb.StreamResponse(id=request_id, error=pb.StreamError(code=_code(status), message=message))
