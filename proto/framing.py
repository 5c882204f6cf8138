"""The data port's framing, part of the contract (embedder.proto, `Stream`): each message is a 4-byte
little-endian length, then that many bytes of a serialized StreamRequest or StreamResponse."""

from __future__ import annotations

import struct

_LENGTH = struct.Struct("<I")


class FrameError(Exception):
    """The peer broke the framing: a frame over the limit. Close the connection."""


def frame(body: bytes) -> bytes:
    """One serialized message as a frame."""
    return _LENGTH.pack(len(body)) + body


class FrameReader:
    """Cuts a byte stream into frame bodies, whatever the pieces it arrives in."""

    def __init__(self, max_frame_bytes: int) -> None:
        self.max_frame_bytes = max_frame_bytes  # may change between feeds (the worker's first frame)
        self._buffer = bytearray()

    def feed(self, data: bytes, max_frames: int | None = None) -> list[bytes]:
        """The bodies of the frames `data` completes, in order, at most `max_frames` of them (the rest
        stays buffered for the next feed); raises FrameError for a frame longer than the limit (known
        from its length, before its bytes are buffered)."""
        buffer = self._buffer
        buffer += data
        bodies: list[bytes] = []
        start = 0
        while len(buffer) - start >= 4 and (max_frames is None or len(bodies) < max_frames):
            (length,) = _LENGTH.unpack_from(buffer, start)
            if length > self.max_frame_bytes:
                buffer.clear()
                raise FrameError(f"a frame of {length} bytes is over the limit of {self.max_frame_bytes}")
            end = start + 4 + length
            if len(buffer) < end:
                break
            bodies.append(bytes(buffer[start + 4 : end]))
            start = end
        del buffer[:start]
        return bodies
