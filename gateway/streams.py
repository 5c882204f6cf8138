"""The gateway's data path to one worker replica: one long-lived connection carrying every Embed and
Score of this process, multiplexed by id: the worker's data port (frames: a 4-byte length and a
`StreamRequest` / `StreamResponse`, over plain TCP) where it advertises one, else a gRPC `Stream`.

Per request, what a unary call gives is kept: a deadline (sent along, and enforced here),
cancellation (a `cancel` message frees the request's place in the worker's queue), and a status code
on failure, raised as the same `grpc.aio.AioRpcError` a unary call raises, so balancing and retries
treat every path alike. What is saved is the per-call cost: HTTP/2 stream set-up and call objects
(the gRPC stream), and with frames also grpc.aio's completion-queue thread, which wakes the event
loop for every read and write (60-130 µs a wake-up on an idle GPU host).

If the connection breaks (the worker died or is draining, the network dropped it), every request on
it fails UNAVAILABLE and is retried on another replica by the caller; the next request opens a new
connection. A worker without `Stream` answers UNIMPLEMENTED, raised as StreamUnsupported; a data
port that cannot be reached raises DataPortUnreachable: the caller then takes another path. With the
workers' shared token, a gRPC stream carries it as metadata and a data-port connection sends it in its
first frame. Mutated only on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
from collections.abc import Coroutine
from typing import Any, cast

import grpc
from google.protobuf.message import DecodeError

from kembed.proto import embedder_pb2 as pb
from kembed.proto.embedder_pb2_grpc import EmbedderStub
from kembed.proto.framing import FrameError, FrameReader, frame

log = logging.getLogger(__name__)

_STATUS_BY_CODE = {status.value[0]: status for status in grpc.StatusCode}


class StreamUnsupported(Exception):
    """The worker does not implement `Stream` (an older version): use the unary RPCs for it."""


class DataPortUnreachable(Exception):
    """No connection to the worker's data port (a network policy, a port not exposed): use gRPC."""


def rpc_error(status: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    """The error a unary call would raise with this status."""
    # grpc-stubs makes debug_error_string required; grpcio's default is None
    return grpc.aio.AioRpcError(status, grpc.aio.Metadata(), grpc.aio.Metadata(), details)  # type: ignore[call-arg]


class _Link:
    """One open connection: its requests awaiting an answer, and how to send on it."""

    def __init__(self) -> None:
        self.pending: dict[int, asyncio.Future[pb.EmbedResponse | pb.ScoreResponse]] = {}
        self.is_broken = False

    async def send(self, message: pb.StreamRequest) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class Multiplexed:
    """Requests to one replica over one connection, reopened on demand after it breaks."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._current: _Link | None = None
        self._opening: asyncio.Future[_Link] | None = None
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()  # readers and cancel messages

    async def _connect(self) -> _Link:
        raise NotImplementedError

    async def _link(self) -> _Link:
        if self._current is not None and not self._current.is_broken:
            return self._current
        if self._opening is None:  # one connection attempt, shared by the requests that wait for it
            self._opening = asyncio.ensure_future(self._connect())
            self._opening.add_done_callback(self._opened)
        return await asyncio.shield(self._opening)

    def connect_soon(self) -> None:
        """Open the connection now, in the background, so the first request does not wait for it
        (a failure is left for that request to meet, and fall back from)."""

        async def connect() -> None:
            with contextlib.suppress(Exception):
                await self._link()

        self._spawn(connect(), "kembed-gateway-connect")

    def _opened(self, opening: asyncio.Future[_Link]) -> None:
        self._opening = None
        if not opening.cancelled() and opening.exception() is None:
            self._current = opening.result()

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def request(
        self, kind: str, message: pb.EmbedRequest | pb.ScoreRequest, timeout_s: float
    ) -> pb.EmbedResponse | pb.ScoreResponse:
        """The answer to one Embed (`kind` "embed") or Score ("score") request; raises its
        AioRpcError, StreamUnsupported or DataPortUnreachable."""
        link = await self._link()
        request_id = next(self._ids)
        future: asyncio.Future[pb.EmbedResponse | pb.ScoreResponse] = (
            asyncio.get_running_loop().create_future()
        )
        link.pending[request_id] = future
        payload: dict[str, Any] = {kind: message}
        outgoing = pb.StreamRequest(id=request_id, timeout_ms=max(1, int(timeout_s * 1000)), **payload)
        try:
            try:
                await link.send(outgoing)
            except (OSError, grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError) as error:
                self._break(link, error)
            async with asyncio.timeout(timeout_s):
                return await future
        except TimeoutError:
            self._cancel(link, request_id)
            raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded") from None
        except asyncio.CancelledError:  # the caller gave up (client left, a sibling chunk failed)
            self._cancel(link, request_id)
            raise
        finally:
            link.pending.pop(request_id, None)

    def _cancel(self, link: _Link, request_id: int) -> None:
        """Tell the worker to drop the request; fire and forget (its answer, if any, is ignored)."""
        if link.is_broken or link.pending.pop(request_id, None) is None:
            return

        async def send() -> None:
            with contextlib.suppress(Exception):  # a broken connection has dropped the request anyway
                await link.send(pb.StreamRequest(id=request_id, cancel=pb.StreamCancel()))

        self._spawn(send(), "kembed-gateway-cancel")

    def _deliver(self, link: _Link, response: pb.StreamResponse) -> None:
        future = link.pending.pop(response.id, None)
        if future is None or future.done():  # cancelled or timed out meanwhile
            return
        kind = response.WhichOneof("result")
        if kind == "error":
            status = _STATUS_BY_CODE.get(response.error.code, grpc.StatusCode.UNKNOWN)
            future.set_exception(rpc_error(status, response.error.message))
        else:
            future.set_result(getattr(response, kind))

    def _break(self, link: _Link, error: BaseException | None) -> None:
        """The connection is over: every request still on it fails UNAVAILABLE (retried elsewhere),
        or StreamUnsupported when a gRPC worker answered the call itself with UNIMPLEMENTED."""
        if not link.is_broken:
            link.is_broken = True
            link.close()
            if link.pending:
                reason = error.code().name if isinstance(error, grpc.aio.AioRpcError) else repr(error)
                log.warning(
                    "connection to worker %s ended with %d requests in flight: %s",
                    self.address,
                    len(link.pending),
                    reason,
                )
        if isinstance(error, grpc.aio.AioRpcError) and error.code() == grpc.StatusCode.UNIMPLEMENTED:
            error = StreamUnsupported(f"worker {self.address} does not implement Stream")
        else:
            details = error.details() if isinstance(error, grpc.aio.AioRpcError) else str(error or "closed")
            error = rpc_error(grpc.StatusCode.UNAVAILABLE, f"connection to {self.address} ended: {details}")
        for future in link.pending.values():
            if not future.done():
                future.set_exception(error)
        link.pending.clear()

    async def close(self) -> None:
        if self._opening is not None:
            self._opening.cancel()
        if self._current is not None:
            self._break(self._current, None)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class _GrpcLink(_Link):
    def __init__(self, call: grpc.aio.StreamStreamCall[pb.StreamRequest, pb.StreamResponse]) -> None:
        super().__init__()
        self.call = call
        self._write_lock = asyncio.Lock()  # grpc.aio: one write in flight per call

    async def send(self, message: pb.StreamRequest) -> None:
        async with self._write_lock:
            await self.call.write(message)

    def close(self) -> None:
        self.call.cancel()


class WorkerStream(Multiplexed):
    """Over a gRPC `Stream` call; `metadata` goes with it (the workers' token)."""

    def __init__(self, stub: EmbedderStub, address: str, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(address)
        self._stub = stub
        self._metadata = metadata

    async def _connect(self) -> _Link:
        link = _GrpcLink(self._stub.Stream(metadata=self._metadata))
        self._spawn(self._read(link), "kembed-gateway-stream")
        return link

    async def _read(self, link: _GrpcLink) -> None:
        error: BaseException | None = None
        try:
            # grpc-stubs lacks grpc.aio.EOF, and so types read() as returning object
            while (response := await link.call.read()) is not grpc.aio.EOF:  # type: ignore[attr-defined]
                self._deliver(link, cast(pb.StreamResponse, response))
        except grpc.aio.AioRpcError as failure:
            error = failure
        except asyncio.CancelledError:
            error = rpc_error(grpc.StatusCode.UNAVAILABLE, "the gateway is closing")
            raise
        finally:
            self._break(link, error)


class _FrameLink(_Link, asyncio.Protocol):
    """A TCP connection of length-prefixed frames; answers are parsed as they arrive."""

    def __init__(self, owner: FrameStream, max_frame_bytes: int) -> None:
        _Link.__init__(self)
        self._owner = owner
        self._reader = FrameReader(max_frame_bytes)
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        try:
            bodies = self._reader.feed(data)
        except FrameError as error:
            self._owner._break(self, OSError(f"the worker broke the framing: {error}"))
            return
        for body in bodies:
            response = pb.StreamResponse()
            try:
                response.ParseFromString(body)
            except DecodeError:
                self._owner._break(self, OSError("the worker sent a frame that is not a StreamResponse"))
                return
            self._owner._deliver(self, response)

    def connection_lost(self, exc: Exception | None) -> None:
        self._owner._break(self, exc or OSError("the worker closed the connection"))

    async def send(self, message: pb.StreamRequest) -> None:
        if self._transport is None or self._transport.is_closing():
            raise OSError("the connection is closed")
        self._transport.write(frame(message.SerializeToString()))

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class FrameStream(Multiplexed):
    """Over a TCP connection to the worker's data port (host of its gRPC address, `port`); with
    `auth_token`, its first frame carries the token (a worker that asks for none ignores it)."""

    def __init__(
        self,
        address: str,
        host: str,
        port: int,
        max_frame_bytes: int,
        connect_timeout_s: float,
        auth_token: str = "",
    ) -> None:
        super().__init__(address)
        self.host, self.port = host, port
        self._max_frame_bytes = max_frame_bytes
        self._connect_timeout_s = connect_timeout_s
        self._auth_token = auth_token

    async def _connect(self) -> _Link:
        loop = asyncio.get_running_loop()
        link = _FrameLink(self, self._max_frame_bytes)
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                await loop.create_connection(lambda: link, self.host, self.port)
        except (OSError, TimeoutError) as error:
            raise DataPortUnreachable(
                f"worker {self.address}: no connection to its data port {self.host}:{self.port}: {error}"
            ) from None
        if self._auth_token:  # before any request: a worker that asks for it reads nothing else first
            try:
                await link.send(pb.StreamRequest(auth_token=self._auth_token))
            except OSError as error:
                raise DataPortUnreachable(f"worker {self.address}: its data port closed: {error}") from None
        return link


def data_port_host(address: str) -> str | None:
    """The host part of a gRPC target `host:port` (`[v6]:port` too), where the worker's data port
    listens; None for targets without one (`unix:`, `dns:///…` resolvers)."""
    if "/" in address or address.startswith("unix:"):
        return None
    host, separator, _ = address.rpartition(":")
    if not separator or not host:
        return None
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host
