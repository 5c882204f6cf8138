"""Giving glibc's free heap memory back to the system once the large requests in flight are done.

A large request (one that tokenizes tens of thousands of characters, a body of megabytes) frees what
it allocated when it ends, but glibc keeps the freed blocks in its heaps (one per thread that
allocates: the event loop, each tokenization thread, the tokenizer library's own threads) for reuse,
and those heaps only shrink from their top. After 32 concurrent /tokenize requests of 65,000 CJK
characters, measured with mallinfo2: +0.5 MB in use, +54-72 MB free in the heaps, RSS +60-90 MiB;
`malloc_trim(0)` (5-12 ms, on a thread) returned 40-45 MiB of it. A gateway otherwise stays near its
idle size under steady load (docs/reliability.md, Memory under steady load), so the trim is done only
after large requests: when the last large one in flight has written its answer, at most once per
`min_interval_s`.
(Not `MALLOC_ARENA_MAX`: with 1 or 2 arenas the same load kept as much, and took longer.)
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
from collections.abc import Callable

LARGE_CHARS = 1 << 14  # characters tokenized by one request that make it large
LARGE_BODY_BYTES = 1 << 20  # body bytes that make a request large


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class HeapTrim:
    """Counts the large requests in flight, each from when it is found large (`hold`, from the
    request's own task on the event loop) to the end of that task, its answer written; when the
    last ends, `malloc_trim(0)` runs on a thread, at most once per `min_interval_s` (an end within
    the interval is trimmed at its close)."""

    def __init__(self, min_interval_s: float = 1.0) -> None:
        self._trim = _malloc_trim()
        self._min_interval_s = min_interval_s
        self._held: set[asyncio.Task[object]] = set()
        self._last_s = float("-inf")
        self._timer: asyncio.TimerHandle | None = None
        self.num_trims = 0

    def hold(self) -> None:
        """The calling task is a large request: a trim follows its end (and that of the others)."""
        task = asyncio.current_task()
        if self._trim is None or task is None or task in self._held:
            return
        self._held.add(task)
        task.add_done_callback(self._release)

    def _release(self, task: asyncio.Task[object]) -> None:
        self._held.discard(task)
        if not self._held and self._timer is None:
            loop = asyncio.get_running_loop()
            delay = max(0.0, self._last_s + self._min_interval_s - loop.time())
            self._timer = loop.call_later(delay, self._start, loop)

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        if self._held:  # another began meanwhile: its end trims
            return
        self._last_s = loop.time()
        self.num_trims += 1
        assert self._trim is not None
        loop.run_in_executor(None, self._trim, 0)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
