"""Coalescing chunks into RPCs: a window of RPCs in flight per replica; chunks that arrive while it is
full wait, then go together as one RPC.

A worker's gRPC server spends a fixed ~0.3 ms of CPU per RPC whatever it holds, and one event loop
serves them all, so one RPC per single-query request caps a worker at a few thousand requests a
second. Under load, queries that would have queued in the worker's scheduler anyway queue here
instead and share an RPC; when the window has room a chunk goes at once, alone, as before.
A group never holds more than one chunk may (`max_tokens`, `max_sequences`), and never splits or
reorders chunks. Mutated only on the event loop.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(eq=False, slots=True)
class Part:
    """One chunk of one request, as it waits for an RPC and rides in one."""

    request_id: str
    token_ids: Sequence[np.ndarray]  # one int32 array per sequence
    token_type_ids: Sequence[np.ndarray] | None  # pairs (Score) only
    num_tokens: int
    deadline: float  # loop.time() by which its request must be answered
    is_alone: bool = False  # sent in an RPC of its own (after a group it was in was refused)
    future: asyncio.Future[np.ndarray] | None = field(default=None)

    @property
    def num_sequences(self) -> int:
        return len(self.token_ids)


Rpc = Callable[[list[Part]], Awaitable[np.ndarray]]
"""Sends parts as one RPC; returns their rows, [total sequences, width], in order."""


class RpcWindow:
    """The RPCs of one method to one replica: at most `max_inflight` at once (0: no limit)."""

    def __init__(
        self,
        rpc: Rpc,
        *,
        max_inflight: int,
        max_tokens: int,
        max_sequences: int,
        is_refused_for_one: Callable[[BaseException], bool],
    ) -> None:
        self._rpc = rpc
        self._max_inflight = max_inflight
        self._max_tokens = max_tokens
        self._max_sequences = max_sequences
        # An error that one part may have caused for all (a worker refusing a batch as invalid): the
        # group's parts are then sent again one by one, so each gets its own answer.
        self._is_refused_for_one = is_refused_for_one
        self._waiting: deque[Part] = deque()
        self._groups: set[asyncio.Task[None]] = set()
        self.num_inflight = 0

    def _has_room(self) -> bool:
        return self._max_inflight == 0 or self.num_inflight < self._max_inflight

    async def call(self, part: Part) -> np.ndarray:
        """The rows of `part`'s sequences. Raises what its RPC raised."""
        if not self._waiting and self._has_room():
            # The common case at low load: this chunk's own RPC, in the caller's task (no hand-off).
            self.num_inflight += 1
            try:
                return await self._rpc([part])
            finally:
                self.num_inflight -= 1
                self._flush()
        part.future = asyncio.get_running_loop().create_future()
        self._waiting.append(part)
        self._flush()
        return await part.future  # cancelled: the part is skipped when its turn comes

    def _flush(self) -> None:
        """Send waiting parts, grouped, while the window has room."""
        while self._has_room():
            group = self._take_group()
            if not group:
                return
            self.num_inflight += 1
            task = asyncio.create_task(self._send(group), name="kembed-gateway-rpc")
            self._groups.add(task)
            task.add_done_callback(self._groups.discard)

    def _take_group(self) -> list[Part]:
        """Waiting parts first come, first served while they fit in one chunk's limits."""
        group: list[Part] = []
        num_tokens = num_sequences = 0
        while self._waiting:
            part = self._waiting[0]
            if part.future is not None and part.future.done():  # its request was cancelled
                self._waiting.popleft()
                continue
            if group and (
                part.is_alone
                or group[0].is_alone
                or num_tokens + part.num_tokens > self._max_tokens
                or num_sequences + part.num_sequences > self._max_sequences
            ):
                break
            group.append(self._waiting.popleft())
            num_tokens += part.num_tokens
            num_sequences += part.num_sequences
        return group

    async def _send(self, group: list[Part]) -> None:
        try:
            rows = await self._rpc(group)
        except asyncio.CancelledError:  # the pool is closing
            for part in group:
                if part.future is not None:
                    part.future.cancel()
            raise
        except Exception as error:
            if len(group) > 1 and self._is_refused_for_one(error):
                for part in reversed(group):
                    part.is_alone = True
                    self._waiting.appendleft(part)
            else:
                for part in group:
                    _settle(part, error=error)
        else:
            start = 0
            for part in group:
                _settle(part, rows=rows[start : start + part.num_sequences])
                start += part.num_sequences
        finally:
            self.num_inflight -= 1
            self._flush()

    async def close(self) -> None:
        for task in self._groups:
            task.cancel()
        await asyncio.gather(*self._groups, return_exceptions=True)
        for part in self._waiting:
            if part.future is not None:
                part.future.cancel()
        self._waiting.clear()


def _settle(part: Part, *, rows: np.ndarray | None = None, error: BaseException | None = None) -> None:
    future = part.future
    assert future is not None, "a waiting part has a future"
    if future.done():  # cancelled meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(rows)
