"""How chunks reach one worker replica: its data port (`FrameTransport`) or, for a worker that has
none or cannot be reached there, unary gRPC calls (`UnaryTransport`). One of the two per replica,
chosen when the replica's Info is read (workers.py), never per call.

The data port is one TCP connection per replica and gateway process, carrying every chunk of the
process (embedder.proto's RequestFrame and ResultFrame, each behind a 4-byte length). Chunks sent
during one turn of the event loop leave together in one frame, so under load a frame carries many
requests and the worker does its Python work per frame, not per request; at low load a chunk
leaves at once, alone. A frame holds one kind (embed, score) and one class of work (interactive,
bulk); a bulk request's chunks travel in a frame of their own, so the worker, which takes turns
between frames, serves concurrent indexing requests in turn rather than one after the other. With
`max_inflight_frames`, chunks that find that many frames of their class unanswered wait for one to
be answered and go together in the next (fewer, fuller frames for the worker; a wait here instead
of in its queue), so a query never waits here behind an indexing job's frames. The worker answers a
frame per batch step with every request of this connection the step finished, in any order; each
answer is delivered by id.

Per request, what a unary call gives is kept: a deadline (sent along as `timeouts_ms`; the service
enforces it here too), cancellation (a caller that gives up sends its id in the next frame's
`cancel_ids`, which frees its place in the worker's queue), and a status code on failure, raised as
the same `grpc.aio.AioRpcError` a unary call raises, so balancing and retries treat both alike. If
the connection breaks (the worker died or drains, the network dropped it), every request on it fails
UNAVAILABLE, to be retried on another replica; the next request opens a new connection. With the
workers' shared token, a connection's first frame carries it. A worker closes a connection silent
for the bound its Info advertises (`frame_idle_timeout_ms`) with nothing in flight; a connection
that has sent nothing for a third of it sends an empty frame, so the worker never closes it under a
request about to leave (which would fail UNAVAILABLE and mark the replica down), and a query after
a quiet spell finds the connection open rather than paying a reconnect. Mutated only on the event
loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import socket
from collections.abc import Sequence
from typing import Protocol, cast

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from kembed.gateway.pool.batches import Part, pack
from kembed.gateway.vectors import decode_embeddings, decode_scores
from kembed.proto import embedder_pb2 as pb
from kembed.proto.embedder_pb2_grpc import EmbedderStub
from kembed.proto.framing import FrameError, FrameReader, frame, split_rows

log = logging.getLogger(__name__)

_STATUS_BY_CODE = {status.value[0]: status for status in grpc.StatusCode}
_FRAME_KINDS = {"embed": pb.FRAME_KIND_EMBED, "score": pb.FRAME_KIND_SCORE}
MAX_FRAME_TOKENS = 1 << 20  # a frame's tokens at most (4 MiB of ids): a flush of more sends several


def rpc_error(status: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    """The error a unary call would raise with this status."""
    # grpc-stubs makes debug_error_string required; grpcio's default is None
    return grpc.aio.AioRpcError(status, grpc.aio.Metadata(), grpc.aio.Metadata(), details)  # type: ignore[call-arg]


class Transport(Protocol):
    """One replica's data path."""

    name: str  # "frames" or "unary", as /info shows it

    async def request(self, kind: str, part: Part, timeout_s: float) -> np.ndarray:
        """The rows of `part` ("embed": vectors, "score": logits); raises its AioRpcError."""

    def submit(self, kind: str, part: Part, timeout_s: float) -> asyncio.Future[np.ndarray]:
        """`request` as a future, sent now; cancelling it cancels the request."""

    async def close(self) -> None: ...


class UnaryTransport:
    """An Embed or Score RPC per chunk (a worker without a data port, or one that cannot be reached)."""

    name = "unary"

    def __init__(self, stub: EmbedderStub, metadata: tuple[tuple[str, str], ...]) -> None:
        self._stub = stub
        self._metadata = metadata

    async def request(self, kind: str, part: Part, timeout_s: float) -> np.ndarray:
        batch = pack(part.token_ids, part.token_type_ids, part.spans)
        request_id = part.request_id
        if kind == "embed":
            embedded = pb.EmbedRequest(
                batch=batch,
                request_id=request_id,
                priority=cast("pb.Priority", part.priority),  # the enum's int value
                outputs=part.outputs,
                task=part.task,
            )
            response = await self._stub.Embed(embedded, timeout=timeout_s, metadata=self._metadata)
            # a worker without span pooling answers one row per sequence: refused here
            return decode_embeddings(response, response.num_sequences if part.num_rows < 0 else part.num_rows)
        scored = pb.ScoreRequest(
            batch=batch, request_id=request_id, priority=cast("pb.Priority", part.priority)
        )
        response = await self._stub.Score(scored, timeout=timeout_s, metadata=self._metadata)
        return decode_scores(response, part.num_sequences)

    def submit(self, kind: str, part: Part, timeout_s: float) -> asyncio.Future[np.ndarray]:
        return asyncio.ensure_future(self.request(kind, part, timeout_s))

    async def close(self) -> None:
        pass


class FrameTransport(asyncio.Protocol):
    """The data port of one replica at host:port (see the module docstring)."""

    name = "frames"

    def __init__(
        self,
        address: str,
        host: str,
        port: int,
        *,
        max_frame_bytes: int,
        connect_timeout_s: float,
        max_inflight_frames: int = 0,
        auth_token: str = "",
        worker_idle_timeout_s: float = 0.0,
    ) -> None:
        self.address, self.host, self.port = address, host, port
        self._max_frame_bytes = max_frame_bytes
        self._connect_timeout_s = connect_timeout_s
        self._max_inflight_frames = max_inflight_frames
        self._auth_token = auth_token
        # the worker closes a connection silent for worker_idle_timeout_s (0: never): a frame leaves
        # once nothing has for a third of it, two thirds of the bound ahead of the worker's close
        self._keep_alive_s = worker_idle_timeout_s / 3
        self._keep_alive_timer: asyncio.TimerHandle | None = None
        self._last_write_at = 0.0  # loop time
        self._transport: asyncio.Transport | None = None
        self._opening: asyncio.Future[None] | None = None
        self._reader = FrameReader(max_frame_bytes)
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[np.ndarray]] = {}  # sent or waiting, by id
        self._waiting: dict[tuple[str, int], list[tuple[int, Part]]] = {}  # by kind and class
        self._cancels: list[int] = []
        self._is_flush_due = False
        # with max_inflight_frames: requests of each frame not yet answered, each request's frame,
        # and each class's frames unanswered
        self._frame_sizes: dict[int, tuple[int, int]] = {}  # frame -> (class, requests left)
        self._frame_of: dict[int, int] = {}
        self._num_unanswered: dict[int, int] = {}
        self._frames = itertools.count()
        self.num_frames_sent = 0

    # --- the connection ---

    async def connect(self) -> None:
        """Open the connection (the first call does; the others wait for it); OSError if it cannot."""
        if self._transport is not None and not self._transport.is_closing():
            return
        if self._opening is None:
            self._opening = asyncio.ensure_future(self._open())
        opening = self._opening
        try:
            await asyncio.shield(opening)
        finally:
            if opening.done() and self._opening is opening:
                self._opening = None

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                await loop.create_connection(lambda: self, self.host, self.port)
        except TimeoutError:
            raise OSError(
                f"no connection to {self.host}:{self.port} within {self._connect_timeout_s:g} s"
            ) from None
        if self._auth_token:  # before any request: a worker that asks for it reads nothing else first
            self._write(pb.RequestFrame(auth_token=self._auth_token))

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # a TCP connection's: a stream transport
        self._reader = FrameReader(self._max_frame_bytes)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._keep_alive_s:
            loop = asyncio.get_running_loop()
            self._last_write_at = loop.time()
            self._keep_alive_timer = loop.call_later(self._keep_alive_s, self._keep_alive)

    def _keep_alive(self) -> None:
        """An empty frame if nothing has left for `_keep_alive_s`; then look again when it could be due."""
        self._keep_alive_timer = None
        if self._transport is None or self._transport.is_closing():
            return
        loop = asyncio.get_running_loop()
        if loop.time() - self._last_write_at >= self._keep_alive_s:
            self._write(pb.RequestFrame())  # 4 bytes: the worker's idle clock starts again
        delay = max(self._last_write_at + self._keep_alive_s - loop.time(), 0.001)
        self._keep_alive_timer = loop.call_later(delay, self._keep_alive)

    def connection_lost(self, exc: Exception | None) -> None:
        self._break(f"connection to worker {self.address} ended: {exc or 'closed by the worker'}")

    def _break(self, reason: str) -> None:
        """Every request on the connection fails UNAVAILABLE (the caller retries elsewhere)."""
        self._transport = None
        if self._keep_alive_timer is not None:
            self._keep_alive_timer.cancel()
            self._keep_alive_timer = None
        if self._pending:
            log.warning("%s, with %d requests in flight", reason, len(self._pending))
        error = rpc_error(grpc.StatusCode.UNAVAILABLE, reason)
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)
        self._waiting = {}
        self._cancels.clear()
        self._frame_sizes.clear()
        self._frame_of.clear()
        self._num_unanswered.clear()

    async def close(self) -> None:
        if self._opening is not None:
            self._opening.cancel()
        if self._transport is not None:
            self._transport.close()
            self._break(f"connection to worker {self.address} closed by the gateway")

    # --- requests ---

    async def request(self, kind: str, part: Part, timeout_s: float) -> np.ndarray:
        """The deadline travels in the frame (`part.deadline`); `timeout_s` is not used here."""
        try:
            await self.connect()
        except OSError as error:
            raise rpc_error(grpc.StatusCode.UNAVAILABLE, f"worker {self.address}: {error}") from None
        return await self._enqueue(kind, part)

    def submit(self, kind: str, part: Part, timeout_s: float) -> asyncio.Future[np.ndarray]:
        """The request's own future while the connection is open (no task around it: a chunk's
        attempts wait on it directly); a task that connects first otherwise."""
        if self._transport is None or self._transport.is_closing():
            return asyncio.ensure_future(self.request(kind, part, timeout_s))
        return self._enqueue(kind, part)

    def _enqueue(self, kind: str, part: Part) -> asyncio.Future[np.ndarray]:
        number = next(self._ids)
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        self._pending[number] = future
        self._waiting.setdefault((kind, part.priority), []).append((number, part))
        self._flush_soon()
        future.add_done_callback(functools.partial(self._settled, number))
        return future

    def _settled(self, number: int, future: asyncio.Future[np.ndarray]) -> None:
        """A cancelled request (the caller gave up: client left, deadline, a sibling failed, a hedge
        won) leaves in the next frame's cancels, which frees its place in the worker's queue."""
        if future.cancelled() and self._pending.pop(number, None) is not None:
            self._cancels.append(number)
            self._answered(number)
            self._flush_soon()

    def _flush_soon(self) -> None:
        if not self._is_flush_due:
            self._is_flush_due = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """Send what waits: a frame per kind and class whose window has room, and the cancels."""
        self._is_flush_due = False
        if self._transport is None:
            return
        now = asyncio.get_running_loop().time()
        limit = self._max_inflight_frames
        for (kind, priority), waiting in list(self._waiting.items()):
            live = [(number, part) for number, part in waiting if number in self._pending]
            if not live or (limit and self._num_unanswered.get(priority, 0) >= limit):
                self._waiting[kind, priority] = live
                continue
            del self._waiting[kind, priority]
            for entries in _by_size(live, by_owner=priority == pb.PRIORITY_BULK):
                self._write(self._frame(kind, priority, entries, now))
        if self._cancels:
            cancels, self._cancels = self._cancels, []
            self._write(pb.RequestFrame(cancel_ids=np.array(cancels, "<u8").tobytes()))

    def _frame(
        self, kind: str, priority: int, entries: list[tuple[int, Part]], now: float
    ) -> pb.RequestFrame:
        parts = [part for _, part in entries]
        numbers = [number for number, _ in entries]
        sequences = [ids for part in parts for ids in part.token_ids]
        message = pb.RequestFrame(
            kind=_FRAME_KINDS[kind],
            ids=np.array(numbers, "<u8").tobytes(),
            timeouts_ms=np.array([max(1, int((p.deadline - now) * 1000)) for p in parts], "<u4").tobytes(),
            priorities=np.full(len(parts), priority, "u1").tobytes(),
            num_sequences=np.array([len(p.token_ids) for p in parts], "<u4").tobytes(),
            lengths=np.array([len(ids) for ids in sequences], "<u4").tobytes(),
            token_ids=np.concatenate(sequences).astype("<i4", copy=False).tobytes(),
        )
        if kind == "score":
            message.token_type_ids = _types(parts)
        if any(part.outputs for part in parts):
            message.outputs = np.array([part.outputs for part in parts], "u1").tobytes()
        if any(part.task_number for part in parts):
            message.tasks = np.array([part.task_number for part in parts], "u1").tobytes()
        if any(part.spans is not None for part in parts):
            bounds = [b for part in parts for b in (part.spans or [None] * part.num_sequences)]
            message.num_spans = np.array([0 if b is None else len(b) - 1 for b in bounds], "<u4").tobytes()
            message.span_bounds = np.concatenate(
                [np.asarray(b, "<u4") for b in bounds if b is not None] or [np.empty(0, "<u4")]
            ).tobytes()
        if self._max_inflight_frames:
            frame_number = next(self._frames)
            self._frame_sizes[frame_number] = (priority, len(numbers))
            self._frame_of.update(dict.fromkeys(numbers, frame_number))
            self._num_unanswered[priority] = self._num_unanswered.get(priority, 0) + 1
        return message

    def _write(self, message: pb.RequestFrame) -> None:
        assert self._transport is not None
        self._transport.write(frame(message.SerializeToString()))
        self.num_frames_sent += 1
        if self._keep_alive_s:
            self._last_write_at = asyncio.get_running_loop().time()

    def _answered(self, number: int) -> None:
        """A request of a counted frame is settled: the frame leaves the window with its last."""
        frame_number = self._frame_of.pop(number, None)
        if frame_number is None:
            return
        priority, left = self._frame_sizes[frame_number]
        if left > 1:
            self._frame_sizes[frame_number] = (priority, left - 1)
            return
        del self._frame_sizes[frame_number]
        self._num_unanswered[priority] -= 1
        if self._waiting:
            self._flush_soon()

    # --- answers ---

    def data_received(self, data: bytes) -> None:
        try:
            bodies = self._reader.feed(data)
        except FrameError as error:
            self._fail_connection(f"the worker broke the framing: {error}")
            return
        for body in bodies:
            head, rows = split_rows(body)  # the rows as a view of the frame, not a copy
            result = pb.ResultFrame()
            try:
                result.ParseFromString(bytes(head))  # small: the rows are left out
            except DecodeError:
                self._fail_connection("the worker sent a frame that is not a ResultFrame")
                return
            self._deliver(result, result.rows if rows is None else rows)

    def _deliver(self, result: pb.ResultFrame, rows_bytes: bytes | memoryview) -> None:
        if result.ids:
            numbers = np.frombuffer(result.ids, "<u8").tolist()
            counts = np.frombuffer(result.num_rows, "<u4").tolist()
            rows = np.frombuffer(rows_bytes, "<f4").reshape(-1, result.width)
            at = 0
            for number, count in zip(numbers, counts, strict=True):
                future = self._pending.pop(number, None)
                if future is not None and not future.done():
                    future.set_result(rows[at : at + count])
                at += count
                self._answered(number)
        for error in result.errors:
            status = _STATUS_BY_CODE.get(error.code, grpc.StatusCode.UNKNOWN)
            failure = rpc_error(status, error.message)
            for number in np.frombuffer(error.ids, "<u8").tolist():
                future = self._pending.pop(number, None)
                if future is not None and not future.done():
                    future.set_exception(failure)
                self._answered(number)

    def _fail_connection(self, reason: str) -> None:
        if self._transport is not None:
            self._transport.close()
        self._break(f"worker {self.address}: {reason}")


def _by_size(entries: list[tuple[int, Part]], *, by_owner: bool) -> list[list[tuple[int, Part]]]:
    """Entries cut into frames of at most MAX_FRAME_TOKENS tokens (a part never split); with
    `by_owner`, each request's parts in frames of their own."""
    if by_owner:
        owners: dict[str, list[tuple[int, Part]]] = {}
        for entry in entries:
            owners.setdefault(entry[1].owner, []).append(entry)
        return [frame for own in owners.values() for frame in _by_size(own, by_owner=False)]
    frames: list[list[tuple[int, Part]]] = [[]]
    num_tokens = 0
    for entry in entries:
        if frames[-1] and num_tokens + entry[1].num_tokens > MAX_FRAME_TOKENS:
            frames.append([])
            num_tokens = 0
        frames[-1].append(entry)
        num_tokens += entry[1].num_tokens
    return frames


def _types(parts: Sequence[Part]) -> bytes:
    """Every part's token types back to back (zeros for a part without: not a pair)."""
    types = [
        t
        for part in parts
        for t in (part.token_type_ids or [np.zeros(len(ids), np.int32) for ids in part.token_ids])
    ]
    return np.concatenate(types).astype("<i4", copy=False).tobytes()


def data_port_host(address: str) -> str | None:
    """The host part of a gRPC target `host:port` (`[v6]:port` too), where the worker's data port
    listens; None for targets without one (`unix:`, `dns:///…` resolvers)."""
    if "/" in address or address.startswith("unix:"):
        return None
    host, separator, _ = address.rpartition(":")
    if not separator or not host:
        return None
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


async def close_quietly(transport: Transport) -> None:
    with contextlib.suppress(Exception):
        await transport.close()
