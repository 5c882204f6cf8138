"""The worker's data port: `Stream`'s messages over plain TCP, one frame each.

A frame is a 4-byte little-endian length, then that many bytes of a serialized `StreamRequest` (in)
or `StreamResponse` (out). Requests are answered by the same `StreamServer` as the gRPC `Stream`,
so ids, deadlines, cancellation, error codes and draining are the same; only the carriage differs.
The point is what it leaves out: grpc.aio completes every read and write on a poller thread that
must wake the event loop, several wake-ups per request, each 60-130 µs on a GPU host when idle; here
a request arrives as one socket read on the loop and its answer leaves with one `write` that does
not wait.

Hostile input: a frame longer than `max_frame_bytes` or bytes that do not parse close the
connection (its requests are cancelled); nothing else is read from a peer that breaks the framing.
With a token (`auth`, the worker's token when data calls need it), the first frame must be one
carrying it (`StreamRequest.auth_token`, nothing else) and arrive within `AUTH_TIMEOUT_S`; until
then a frame may hold `MAX_AUTH_FRAME_BYTES` at most, and anything else closes the connection.
"""

from __future__ import annotations

import asyncio
import logging
import socket

from google.protobuf.message import DecodeError

from kembed.proto import embedder_pb2 as pb
from kembed.proto.framing import FrameError, FrameReader, frame
from kembed.worker.auth import TokenCheck
from kembed.worker.streams import StreamServer

log = logging.getLogger(__name__)

AUTH_TIMEOUT_S = 10.0  # a connection that has not shown the token by then is closed
MAX_AUTH_FRAME_BYTES = 4096  # a token frame is tiny; nothing larger is buffered from a stranger


class FrameConnection(asyncio.Protocol):
    """One caller's connection to the data port."""

    def __init__(self, server: StreamServer, max_frame_bytes: int, auth: TokenCheck | None = None) -> None:
        self._server = server
        self._max_frame_bytes = max_frame_bytes
        self._auth = auth  # None once the caller has shown the token (or none is needed)
        # Until the token is shown, a frame may hold MAX_AUTH_FRAME_BYTES and only the first is cut.
        self._reader = FrameReader(MAX_AUTH_FRAME_BYTES if auth is not None else max_frame_bytes)
        self._transport: asyncio.Transport | None = None
        self._auth_timer: asyncio.TimerHandle | None = None
        self.tasks: dict[int, asyncio.Task[None]] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._auth is not None:
            self._auth_timer = asyncio.get_running_loop().call_later(
                AUTH_TIMEOUT_S, self._refuse, "no token within the time allowed"
            )
        self._server.open(self)

    def data_received(self, data: bytes) -> None:
        try:
            if self._auth is not None:
                first = self._reader.feed(data, max_frames=1)
                if not first or not self._accept_token(first[0]):
                    return
                data = b""  # already buffered: what followed the token frame is read below
            bodies = self._reader.feed(data)
        except FrameError as error:
            self._refuse(str(error))
            return
        for body in bodies:
            message = pb.StreamRequest()
            try:
                message.ParseFromString(body)
            except DecodeError:
                self._refuse("a frame is not a StreamRequest")
                return
            self._server.dispatch(message, self)

    def _accept_token(self, body: bytes) -> bool:
        """The first frame of a connection that must show the token: it is that, or the end."""
        parsed = pb.StreamRequest()
        try:
            parsed.ParseFromString(body)
            message: pb.StreamRequest | None = parsed
        except DecodeError:
            message = None
        assert self._auth is not None
        if (
            message is None
            or message.WhichOneof("kind") is not None
            or not self._auth.matches(message.auth_token)
        ):
            self._refuse("the first frame does not carry the worker's token")
            return False
        self._auth = None
        if self._auth_timer is not None:
            self._auth_timer.cancel()
        self._reader.max_frame_bytes = self._max_frame_bytes
        return True

    def _refuse(self, reason: str) -> None:
        peer = self._transport.get_extra_info("peername") if self._transport else None
        log.warning("closing data connection from %s: %s", peer, reason)
        if self._transport is not None:
            self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._auth_timer is not None:
            self._auth_timer.cancel()
        self._server.close(self)

    async def write(self, response: pb.StreamResponse) -> None:
        if self._transport is None or self._transport.is_closing():
            return
        self._transport.write(frame(response.SerializeToString()))

    async def end(self) -> None:
        if self._transport is not None:
            self._transport.close()


async def serve_frames(
    server: StreamServer, host: str, port: int, max_frame_bytes: int, auth_token: str = ""
) -> tuple[asyncio.Server, int]:
    """The data port's listening server on host:port (0 picks a free port), and the port it got.
    With `auth_token`, every connection must show it first."""
    loop = asyncio.get_running_loop()
    auth = TokenCheck(auth_token) if auth_token else None
    listener = await loop.create_server(lambda: FrameConnection(server, max_frame_bytes, auth), host, port)
    return listener, listener.sockets[0].getsockname()[1]
