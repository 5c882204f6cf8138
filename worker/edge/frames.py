"""The worker's data port: many requests in each frame, both ways (embedder.proto's RequestFrame and
ResultFrame over plain TCP, each message behind a 4-byte length).

A frame's requests are decoded, checked and admitted with numpy over the whole frame, as one
request group per class (groups.py): no Python object, task or future per request. Answers go
back a frame per batch step and connection: every request of the connection that a step (or
admission, or a deadline) settled, ids and rows as contiguous arrays. So the worker's Python cost
is per frame and per batch, whatever the number of requests in them; grpc.aio's poller thread, which
wakes the loop for every read and write, is not on this path either.

Per request, what a unary call gives is kept: a deadline (`timeouts_ms`, enforced by the
scheduler), cancellation (`cancel_ids`, or the connection's end: the requests leave the queue), and
a status code of its own. A request that is wrong (an empty sequence, an id outside the vocabulary,
too long) fails alone with INVALID_ARGUMENT and a message naming its problem; a frame whose arrays
disagree in size fails all its requests. Hostile input: a frame longer than `max_frame_bytes` or
bytes that do not parse close the connection (its requests are cancelled). With a token (`auth`),
the first frame must carry it (`auth_token`, nothing else) within `AUTH_TIMEOUT_S`; until then a
frame may hold `MAX_AUTH_FRAME_BYTES` at most. A connection that sends no frame for `idle_timeout_s`
while none of its requests is in flight is closed (a gateway sends an empty frame on an idle
connection well within that bound, so that only forgotten or silent connections end). On drain,
new requests fail UNAVAILABLE (the gateway retries them elsewhere), those in flight are answered,
then the connections end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
import time
from typing import cast

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from kembed.proto import embedder_pb2 as pb
from kembed.proto.framing import FrameError, FrameReader, frame, result_frame
from kembed.worker.classes import Priority
from kembed.worker.edge.auth import TokenCheck
from kembed.worker.edge.frame_decoding import (
    FrameArrays,
    check_kind,
    frame_arrays,
    frame_classes,
    frame_outputs,
    frame_spans,
    frame_tasks,
    output_rows,
    request_problems,
)
from kembed.worker.edge.validation import frame_is_clean
from kembed.worker.edge.vocabulary import compact
from kembed.worker.errors import InvalidInput, Unavailable, WorkerError
from kembed.worker.info import ModelInfo
from kembed.worker.scheduling.groups import RequestGroup
from kembed.worker.scheduling.scheduler import Scheduler

log = logging.getLogger(__name__)

AUTH_TIMEOUT_S = 10.0  # a connection that has not shown the token by then is closed
MAX_AUTH_FRAME_BYTES = 4096  # a token frame is tiny; nothing larger is buffered from a stranger


def _code(error: BaseException) -> int:
    status = grpc.StatusCode[error.status] if isinstance(error, WorkerError) else grpc.StatusCode.INTERNAL
    code: int = status.value[0]
    return code


class FrameConnection(asyncio.Protocol):
    """One caller's connection to the data port, and the sink of its requests' answers: what the
    scheduler settles during one turn of the loop leaves in one ResultFrame."""

    def __init__(
        self,
        service: FrameService,
        max_frame_bytes: int,
        auth: TokenCheck | None = None,
        idle_timeout_s: float = 0.0,
    ) -> None:
        self._service = service
        self._max_frame_bytes = max_frame_bytes
        self._auth = auth  # None once the caller has shown the token (or none is needed)
        self._idle_timeout_s = idle_timeout_s  # 0: never closed for being idle
        self._idle_since = 0.0  # loop time of the last whole frame, or of the last request settled
        self._idle_timer: asyncio.TimerHandle | None = None
        # Until the token is shown, a frame may hold MAX_AUTH_FRAME_BYTES and only the first is cut.
        self._reader = FrameReader(MAX_AUTH_FRAME_BYTES if auth is not None else max_frame_bytes)
        self._transport: asyncio.Transport | None = None
        self._auth_timer: asyncio.TimerHandle | None = None
        self.live: set[RequestGroup] = set()  # groups with requests not yet settled
        self._answered: list[tuple[RequestGroup, np.ndarray]] = []
        self._failed: list[tuple[np.ndarray, int, str]] = []  # ids, status code, message
        self._is_flush_due = False

    # --- the byte stream ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # a server socket's: a stream transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        loop = asyncio.get_running_loop()
        if self._auth is not None:
            self._auth_timer = loop.call_later(
                AUTH_TIMEOUT_S, self._refuse, "no token within the time allowed"
            )
        if self._idle_timeout_s:
            self._idle_since = loop.time()
            self._idle_timer = loop.call_later(self._idle_timeout_s, self._check_idle)
        self._service.connections.add(self)

    def data_received(self, data: bytes) -> None:
        try:
            if self._auth is not None:
                first = self._reader.feed(data, max_frames=1)
                if not first or not self._accept_token(first[0]):
                    return
                data = b""  # already buffered: what followed the token frame is read below
                self._idle_since = self._now()
            bodies = self._reader.feed(data)
        except FrameError as error:
            self._refuse(str(error))
            return
        if bodies:  # whole frames only: a frame trickled in byte by byte does not keep it open
            self._idle_since = self._now()
        for body in bodies:
            message = pb.RequestFrame()
            try:
                message.ParseFromString(body)  # type: ignore[arg-type]  # upb parses any buffer, uncopied
            except DecodeError:
                self._refuse("a frame is not a RequestFrame")
                return
            self._service.receive(message, self)

    def _accept_token(self, body: bytes | memoryview) -> bool:
        """The first frame of a connection that must show the token: it is that, or the end."""
        message = pb.RequestFrame()
        try:
            message.ParseFromString(bytes(body))  # a token frame: a few bytes
        except DecodeError:
            message.Clear()
        assert self._auth is not None
        if message.ids or message.cancel_ids or not self._auth.matches(message.auth_token):
            self._refuse("the first frame does not carry the worker's token")
            return False
        self._auth = None
        if self._auth_timer is not None:
            self._auth_timer.cancel()
        self._reader.max_frame_bytes = self._max_frame_bytes
        return True

    def _now(self) -> float:
        return asyncio.get_running_loop().time() if self._idle_timeout_s else 0.0

    def _check_idle(self) -> None:
        """Close the connection if it has been idle for the bound, else look again when it could be."""
        loop = asyncio.get_running_loop()
        idle_s = loop.time() - self._idle_since
        if self.live:  # requests in flight: not idle; the clock restarts when the last is settled
            idle_s = 0.0
        elif idle_s >= self._idle_timeout_s:
            self._idle_timer = None
            peer = self._transport.get_extra_info("peername") if self._transport else None
            log.info("closing data connection from %s: no frame for %.1f s", peer, idle_s)
            self.end()
            return
        self._idle_timer = loop.call_later(self._idle_timeout_s - idle_s, self._check_idle)

    def _refuse(self, reason: str) -> None:
        peer = self._transport.get_extra_info("peername") if self._transport else None
        log.warning("closing data connection from %s: %s", peer, reason)
        if self._transport is not None:
            self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._auth_timer, self._idle_timer):
            if timer is not None:
                timer.cancel()
        self._service.connections.discard(self)
        for group in list(self.live):  # nobody waits for their answers: free their places
            self._service.scheduler.cancel(group, np.flatnonzero(~group.is_settled))
        self.live.clear()
        self._service.check_drained()

    def end(self) -> None:
        if self._transport is not None:
            self._transport.close()

    # --- the sink (groups.GroupSink) ---

    def answered(self, group: RequestGroup, requests: np.ndarray) -> None:
        self._answered.append((group, requests))
        self._settled(group)

    def failed(self, group: RequestGroup, requests: np.ndarray, error: BaseException) -> None:
        assert group.ids is not None, "a frame's groups carry their ids"
        self.fail(group.ids[requests], error)
        self._settled(group)

    def fail(self, ids: np.ndarray, error: BaseException) -> None:
        """Answer `ids` with `error` (in the next ResultFrame)."""
        message = (
            str(error) if isinstance(error, WorkerError) else "internal error in the worker (see its log)"
        )
        self._failed.append((ids, _code(error), message))
        self._flush_soon()

    def _settled(self, group: RequestGroup) -> None:
        if group.num_live == 0:
            self.live.discard(group)
            if not self.live:
                self._idle_since = self._now()
                self._service.check_drained()
        self._flush_soon()

    def _flush_soon(self) -> None:
        if not self._is_flush_due:
            self._is_flush_due = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """One ResultFrame with everything settled since the last."""
        self._is_flush_due = False
        answered, self._answered = self._answered, []
        failed, self._failed = self._failed, []
        if self._transport is None or self._transport.is_closing():
            return
        result = pb.ResultFrame()
        rows: np.ndarray | None = None
        if answered:
            ids, counts, parts = [], [], []
            for group, requests in answered:
                assert group.ids is not None
                ids.append(group.ids[requests])
                num_rows, own = group.rows_of(requests)
                if self._service.is_sparse_vocabulary:  # its nonzero weights alone leave the worker
                    num_rows, own = compact(num_rows, own)
                counts.append(num_rows)
                parts.append(own)
            result.ids = _joined(ids, "<u8")
            result.num_rows = _joined(counts, "<u4")
            result.width = parts[0].shape[1]
            rows = np.ascontiguousarray(parts[0] if len(parts) == 1 else np.concatenate(parts), dtype="<f4")
        for ids_failed, code, message in failed:
            result.errors.add(ids=ids_failed.astype("<u8").tobytes(), code=code, message=message)
        head = result.SerializeToString()
        if rows is None:
            self._transport.write(frame(head))
        else:  # the rows field last, written from the array itself (framing.result_frame)
            self._transport.writelines(result_frame(head, rows.data.cast("B")))


def _joined(arrays: list[np.ndarray], dtype: str) -> bytes:
    return (arrays[0] if len(arrays) == 1 else np.concatenate(arrays)).astype(dtype, copy=False).tobytes()


class FrameService:
    """Decodes frames into request groups, admits them into the scheduler, cancels and drains."""

    def __init__(self, scheduler: Scheduler, info: ModelInfo) -> None:
        self.scheduler = scheduler
        self._info = info
        self.is_sparse_vocabulary = info.sparse_vocabulary  # answers compacted (vocabulary.py)
        self.connections: set[FrameConnection] = set()
        self._is_draining = False
        self._drained = asyncio.Event()  # set once draining and nothing is in flight

    def check_drained(self) -> None:
        """Called when a connection's last request in flight is settled."""
        if self._is_draining and not any(connection.live for connection in self.connections):
            self._drained.set()

    def receive(self, message: pb.RequestFrame, connection: FrameConnection) -> None:
        if message.cancel_ids:
            self._cancel(np.frombuffer(message.cancel_ids, "<u8"), connection)
        if not message.ids:
            return
        ids = np.frombuffer(message.ids, "<u8")
        try:
            for group in self._decode(message, ids, connection):
                connection.live.add(group)
                self.scheduler.admit(group)
                if group.num_live == 0:
                    connection.live.discard(group)
        except WorkerError as error:  # the whole frame: a kind this model lacks, arrays that disagree
            connection.fail(ids, error)

    def _cancel(self, ids: np.ndarray, connection: FrameConnection) -> None:
        for group in list(connection.live):
            assert group.ids is not None
            hits = np.flatnonzero(np.isin(group.ids, ids) & ~group.is_settled)
            if len(hits):
                self.scheduler.cancel(group, hits)
                if group.num_live == 0:
                    connection.live.discard(group)
        self.check_drained()

    def _decode(
        self, message: pb.RequestFrame, ids: np.ndarray, connection: FrameConnection
    ) -> list[RequestGroup]:
        """The frame's valid requests as one group per class; the invalid ones answered at once."""
        if self._is_draining:
            raise Unavailable("worker is shutting down")
        check_kind(message.kind, self._info)
        if message.kind == pb.FRAME_KIND_SCORE and (message.num_spans or message.span_bounds):
            raise InvalidInput("span pooling (num_spans, span_bounds) is for embed requests, not score")
        arrays = frame_arrays(message, len(ids))
        num_sequences, lengths, token_ids, types, priorities, timeouts = arrays
        seq_outputs = frame_outputs(message, num_sequences, self._info)
        tasks = frame_tasks(message, num_sequences, lengths, self._info)
        valid = None
        if not frame_is_clean(num_sequences, lengths, token_ids, types, self._info) or message.num_spans:
            valid = self._check_each(message, arrays, ids, connection)
        now = time.perf_counter()
        classes = frame_classes(num_sequences, lengths, priorities)
        deadlines = None
        if timeouts is not None and timeouts.any():
            deadlines = np.where(timeouts > 0, now + timeouts / 1000, math.inf)
        if isinstance(classes, Priority) and valid is None:  # the gateway's frame: one class, all valid
            spans = frame_spans(message, lengths, None) if message.num_spans else None
            many = None if len(num_sequences) == len(lengths) else num_sequences
            group = RequestGroup(
                token_ids, lengths, many, connection, priority=classes, admitted_at=now,
                deadlines=deadlines, ids=ids, token_type_ids=types if tasks is None else tasks, spans=spans,
                **output_rows(seq_outputs, lengths, self._info),
            )  # fmt: skip
            return [group]
        if isinstance(classes, Priority):
            classes = np.full(len(ids), classes)
        groups = []
        for klass in (Priority.INTERACTIVE, Priority.BULK):
            chosen = classes == klass
            if valid is not None:
                chosen &= valid
            if not chosen.any():
                continue
            everything = bool(chosen.all())
            seq_mask = None if everything else np.repeat(chosen, num_sequences)
            token_mask = None if seq_mask is None else np.repeat(seq_mask, lengths)

            def pick(values: np.ndarray | None, mask: np.ndarray | None) -> np.ndarray | None:
                return values if values is None or mask is None else values[mask]

            picked_seqs = pick(num_sequences, None if everything else chosen)
            picked_lengths = pick(lengths, seq_mask)
            assert picked_seqs is not None and picked_lengths is not None
            spans = None
            if message.num_spans:
                spans = frame_spans(message, picked_lengths, seq_mask)
            groups.append(
                RequestGroup(
                    token_ids if token_mask is None else token_ids[token_mask],
                    picked_lengths,
                    None if len(picked_seqs) == len(picked_lengths) else picked_seqs,
                    connection,
                    priority=Priority(klass),
                    admitted_at=now,
                    deadlines=pick(deadlines, None if everything else chosen),
                    ids=ids if everything else ids[chosen],
                    token_type_ids=pick(types if tasks is None else tasks, token_mask),
                    spans=spans,
                    **output_rows(pick(seq_outputs, seq_mask), picked_lengths, self._info),
                )
            )
        return groups

    def _check_each(
        self, message: pb.RequestFrame, arrays: FrameArrays, ids: np.ndarray, connection: FrameConnection
    ) -> np.ndarray:
        """Which requests are valid; the others are answered INVALID_ARGUMENT, each with its reason.
        Only for a frame that failed the whole-frame check (rare), or that asks for span pooling."""
        valid = np.ones(len(ids), dtype=bool)
        for r, problem in request_problems(message, arrays, self._info).items():
            valid[r] = False
            connection.fail(ids[r : r + 1], InvalidInput(problem))
        return valid

    async def drain(self, timeout_s: float) -> None:
        """Refuse new requests (UNAVAILABLE), let those in flight finish (up to `timeout_s`), end
        every connection."""
        self._is_draining = True
        self.check_drained()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._drained.wait(), timeout_s)
        await asyncio.sleep(0)  # the last answers' frame goes out first
        for connection in list(self.connections):
            connection.end()


async def serve_frames(
    service: FrameService,
    host: str,
    port: int,
    max_frame_bytes: int,
    auth_token: str = "",
    idle_timeout_s: float = 0.0,
) -> tuple[asyncio.Server, int]:
    """The data port's listening server on host:port (0 picks a free port), and the port it got.
    With `auth_token`, every connection must show it first; with `idle_timeout_s`, one silent that
    long with nothing in flight is closed."""
    loop = asyncio.get_running_loop()
    auth = TokenCheck(auth_token) if auth_token else None
    listener = await loop.create_server(
        lambda: FrameConnection(service, max_frame_bytes, auth, idle_timeout_s), host, port
    )
    return listener, listener.sockets[0].getsockname()[1]
