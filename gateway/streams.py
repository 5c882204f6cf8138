"""The gateway's data path to one worker replica: one long-lived `Stream` call carrying every Embed and
Score of this process, multiplexed by id.

A unary RPC costs both sides a new HTTP/2 stream, headers and call objects; on one stream a request
is one message each way (measured on an H200 host: a grpc.aio unary round trip ~0.67 ms at p50, one
message each way on an open stream ~0.19 ms). What a unary call gives per request is kept per
request: a deadline (sent along, and enforced here), cancellation (a `cancel` message frees the
request's place in the worker's queue), and a status code on failure, raised as the same
`grpc.aio.AioRpcError` a unary call raises, so balancing and retries treat both paths alike.

If the stream breaks (the worker died or is draining, the connection dropped), every request on it
fails UNAVAILABLE and is retried on another replica by the caller; the next request opens a new
stream. A worker that does not implement `Stream` answers UNIMPLEMENTED, which the caller takes as a
cue to use the unary RPCs for that replica. Mutated only on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging

import grpc

from kembed.proto import embedder_pb2 as pb
from kembed.proto.embedder_pb2_grpc import EmbedderStub

log = logging.getLogger(__name__)

_STATUS_BY_CODE = {status.value[0]: status for status in grpc.StatusCode}


class StreamUnsupported(Exception):
    """The worker does not implement `Stream` (an older version): use the unary RPCs for it."""


def rpc_error(status: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    """The error a unary call would raise with this status."""
    return grpc.aio.AioRpcError(status, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


class _Call:
    """One open Stream call: its requests awaiting an answer, and the task that reads answers."""

    def __init__(self, call: grpc.aio.StreamStreamCall) -> None:
        self.call = call
        self.pending: dict[int, asyncio.Future] = {}
        self.write_lock = asyncio.Lock()  # grpc.aio: one write in flight per call
        self.reader: asyncio.Task | None = None
        self.is_broken = False


class WorkerStream:
    """Requests to one replica over one Stream call, reopened on demand after it breaks."""

    def __init__(self, stub: EmbedderStub, address: str) -> None:
        self._stub = stub
        self._address = address
        self._current: _Call | None = None
        self._ids = itertools.count(1)
        self._readers: set[asyncio.Task] = set()

    def _open(self) -> _Call:
        if self._current is None or self._current.is_broken:
            current = _Call(self._stub.Stream())
            current.reader = asyncio.create_task(self._read(current), name="kembed-gateway-stream")
            self._readers.add(current.reader)
            current.reader.add_done_callback(self._readers.discard)
            self._current = current
        return self._current

    async def request(
        self, kind: str, message: pb.EmbedRequest | pb.ScoreRequest, timeout_s: float
    ) -> pb.EmbedResponse | pb.ScoreResponse:
        """The answer to one Embed (`kind` "embed") or Score ("score") request; raises its
        AioRpcError, or StreamUnsupported."""
        current = self._open()
        request_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        current.pending[request_id] = future
        outgoing = pb.StreamRequest(
            id=request_id, timeout_ms=max(1, int(timeout_s * 1000)), **{kind: message}
        )
        try:
            try:
                async with current.write_lock:
                    await current.call.write(outgoing)
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError) as error:
                self._break(current, error)
            async with asyncio.timeout(timeout_s):
                return await future
        except TimeoutError:
            self._cancel(current, request_id)
            raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded") from None
        except asyncio.CancelledError:  # the caller gave up (client left, a sibling chunk failed)
            self._cancel(current, request_id)
            raise
        finally:
            current.pending.pop(request_id, None)

    def _cancel(self, current: _Call, request_id: int) -> None:
        """Tell the worker to drop the request; fire and forget (its answer, if any, is ignored)."""
        if current.is_broken or current.pending.pop(request_id, None) is None:
            return
        cancel = pb.StreamRequest(id=request_id, cancel=pb.StreamCancel())

        async def send() -> None:
            with contextlib.suppress(Exception):  # a broken stream has dropped the request anyway
                async with current.write_lock:
                    await current.call.write(cancel)

        task = asyncio.create_task(send(), name="kembed-gateway-cancel")
        self._readers.add(task)
        task.add_done_callback(self._readers.discard)

    async def _read(self, current: _Call) -> None:
        error: BaseException | None = None
        try:
            while True:
                response = await current.call.read()
                if response is grpc.aio.EOF:
                    break
                future = current.pending.pop(response.id, None)
                if future is None or future.done():  # cancelled or timed out meanwhile
                    continue
                kind = response.WhichOneof("result")
                if kind == "error":
                    status = _STATUS_BY_CODE.get(response.error.code, grpc.StatusCode.UNKNOWN)
                    future.set_exception(rpc_error(status, response.error.message))
                else:
                    future.set_result(getattr(response, kind))
        except grpc.aio.AioRpcError as failure:
            error = failure
        except asyncio.CancelledError:
            error = rpc_error(grpc.StatusCode.UNAVAILABLE, "the gateway is closing")
            raise
        finally:
            self._break(current, error)

    def _break(self, current: _Call, error: BaseException | None) -> None:
        """The call is over: every request still on it fails UNAVAILABLE (retried elsewhere), or
        StreamUnsupported when the worker answered the call itself with UNIMPLEMENTED."""
        if not current.is_broken:
            current.is_broken = True
            current.call.cancel()
            if current.pending:
                log.warning(
                    "stream to worker %s ended with %d requests in flight: %s",
                    self._address,
                    len(current.pending),
                    error.code().name if isinstance(error, grpc.aio.AioRpcError) else "closed",
                )
        if isinstance(error, grpc.aio.AioRpcError) and error.code() == grpc.StatusCode.UNIMPLEMENTED:
            error = StreamUnsupported(f"worker {self._address} does not implement Stream")
        else:
            details = error.details() if isinstance(error, grpc.aio.AioRpcError) else "stream closed"
            error = rpc_error(grpc.StatusCode.UNAVAILABLE, f"stream to {self._address} ended: {details}")
        for future in current.pending.values():
            if not future.done():
                future.set_exception(error)
        current.pending.clear()

    async def close(self) -> None:
        if self._current is not None:
            self._break(self._current, None)
        for task in list(self._readers):
            task.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)
