"""The data port's framing, part of the contract (embedder.proto, `RequestFrame` / `ResultFrame`): each
message is a 4-byte little-endian length, then that many bytes of a serialized message.

A ResultFrame carries a batch's rows (64 queries of a 1024-dimension model: 256 KiB), so neither end
copies them more than it must: a worker writes the `rows` field last, straight from its array
(`result_frame`), and a gateway takes them as a view of the frame (`split_rows`) before it parses the
small rest. Any other valid encoding of a ResultFrame is read too, by parsing it whole.
"""

from __future__ import annotations

import struct

_LENGTH = struct.Struct("<I")
_ROWS_FIELD = 3  # ResultFrame.rows
_ROWS_TAG = bytes([_ROWS_FIELD << 3 | 2])  # field 3, length-delimited


class FrameError(Exception):
    """The peer broke the framing: a frame over the limit. Close the connection."""


def frame(body: bytes) -> bytes:
    """One serialized message as a frame."""
    return _LENGTH.pack(len(body)) + body


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def result_frame(head: bytes, rows: memoryview) -> list[bytes | memoryview]:
    """The pieces of one frame holding a ResultFrame: `head`, the serialized message without its rows,
    then the rows field (the rows' bytes, not copied), for one `writelines`."""
    field = _ROWS_TAG + _varint(rows.nbytes)
    return [_LENGTH.pack(len(head) + len(field) + rows.nbytes), head, field, rows]


def split_rows(body: bytes | memoryview) -> tuple[memoryview, memoryview | None]:
    """(the ResultFrame without its rows, its rows) when the rows field comes last, as workers write it;
    (the whole body, None) otherwise, to be parsed whole. Walks the top-level fields only."""
    view = memoryview(body)
    at, end = 0, len(view)
    while at < end:
        start = at
        tag, at = _read_varint(view, at)
        wire = tag & 7
        if wire == 0:
            _, at = _read_varint(view, at)
        elif wire == 2:
            length, at = _read_varint(view, at)
            if tag >> 3 == _ROWS_FIELD and at + length == end:
                return view[:start], view[at:end]
            at += length
        else:  # not a field ResultFrame has: let the parser say so
            break
    return view, None


def _read_varint(view: memoryview, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(view):
            return value, len(view) + 1  # truncated: the caller's bounds check ends the walk
        byte = view[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


class FrameReader:
    """Cuts a byte stream into frame bodies, whatever the pieces it arrives in. A frame that arrives
    whole within one piece is handed out as a view of that piece, not copied."""

    def __init__(self, max_frame_bytes: int) -> None:
        self.max_frame_bytes = max_frame_bytes  # may change between feeds (the worker's first frame)
        self._buffer = bytearray()

    def feed(self, data: bytes, max_frames: int | None = None) -> list[bytes | memoryview]:
        """The bodies of the frames `data` completes, in order, at most `max_frames` of them (the rest
        stays buffered for the next feed); raises FrameError for a frame longer than the limit (known
        from its length, before its bytes are buffered)."""
        try:
            if not self._buffer:  # frames within `data` are views of it (bytes: immutable)
                views, used = self._cut(memoryview(data), max_frames)
                if used < len(data):
                    self._buffer += data[used:]
                return list(views)
            self._buffer += data
            with memoryview(self._buffer) as view:  # the buffer is reused: its frames are copied out
                views, used = self._cut(view, max_frames)
                bodies: list[bytes | memoryview] = [bytes(body) for body in views]
                for body in views:
                    body.release()
        except FrameError:
            self._buffer.clear()
            raise
        del self._buffer[:used]
        return bodies

    def _cut(self, view: memoryview, max_frames: int | None) -> tuple[list[memoryview], int]:
        """Views of the whole frames at the start of `view`, and the bytes they take."""
        bodies: list[memoryview] = []
        start = 0
        while len(view) - start >= 4 and (max_frames is None or len(bodies) < max_frames):
            (length,) = _LENGTH.unpack_from(view, start)
            if length > self.max_frame_bytes:
                for body in bodies:  # no view may outlive the buffer being cleared
                    body.release()
                raise FrameError(f"a frame of {length} bytes is over the limit of {self.max_frame_bytes}")
            stop = start + 4 + length
            if len(view) < stop:
                break
            bodies.append(view[start + 4 : stop])
            start = stop
        return bodies, start
