"""How one request's chunks are paced: a window of its tokens in flight, and a chunk that finds
every queue full waits for room instead of failing a request that was admitted.

A request of more tokens than the workers' queues hold (2048 texts of a few hundred tokens is
~500,000 tokens; a worker's queue holds 65,536) used to send all its chunks at once: those past the
queues' room were refused RESOURCE_EXHAUSTED by every replica, and the request failed 429 on an
idle fleet, as it would on every retry. Now at most `Window.max_tokens` of one request are in flight
(half of what the serving workers' queues take for bulk work, so that other requests, and other
gateways, find room beside it); the next chunk goes as one comes back, so the request is served at
the workers' pace. A chunk refused for full queues all the same (other gateways' work) is tried
again after a short, growing pause, for up to `max_queue_wait_s`, then the request fails 429 (a
request of one chunk fails at once: there is no work of it done to keep).
Mutated only on the event loop.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TypeVar

from kembed.gateway.errors import Overloaded

T = TypeVar("T")

FIRST_PAUSE_S = 0.02  # the first wait after a chunk found every queue full; doubled each time
MAX_PAUSE_S = 0.5


class Window:
    """Tokens of one request in flight, at most `max_tokens` (a chunk larger than that goes alone).
    Chunks go in the order they ask."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.held = 0
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    def _fits(self, num_tokens: int) -> bool:
        return self.held == 0 or self.held + num_tokens <= self.max_tokens

    async def acquire(self, num_tokens: int) -> None:
        if not self._waiting and self._fits(num_tokens):
            self.held += num_tokens
            return
        future = asyncio.get_running_loop().create_future()
        entry = (num_tokens, future)
        self._waiting.append(entry)
        try:
            await future
        except asyncio.CancelledError:  # its client left, or its deadline passed
            if future.done() and not future.cancelled():  # granted as it was cancelled: give it back
                self.release(num_tokens)
            elif entry in self._waiting:  # a release between the cancel and now dropped it already
                self._waiting.remove(entry)
            raise

    def release(self, num_tokens: int) -> None:
        self.held -= num_tokens
        while self._waiting and self._fits(self._waiting[0][0]):
            num_tokens, future = self._waiting.popleft()
            if not future.done():
                self.held += num_tokens
                future.set_result(None)


async def paced(
    send: Callable[[], Awaitable[T]], num_tokens: int, window: Window | None, max_wait_s: float
) -> T:
    """`send()` once the window has room for `num_tokens`, tried again while every queue is full
    (Overloaded), for up to `max_wait_s`."""
    if window is not None:
        await window.acquire(num_tokens)
    try:
        loop = asyncio.get_running_loop()
        pause, first_refused = FIRST_PAUSE_S, 0.0
        while True:
            try:
                return await send()
            except Overloaded:
                now = loop.time()
                first_refused = first_refused or now
                if now - first_refused + pause > max_wait_s:
                    raise
            await asyncio.sleep(pause)
            pause = min(2 * pause, MAX_PAUSE_S)
    finally:
        if window is not None:
            window.release(num_tokens)
