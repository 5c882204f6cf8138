"""Coalescing chunks into RPCs: a window of RPCs in flight per replica; chunks that arrive while it is
full wait, then go together as one RPC.

A worker's gRPC server spends a fixed ~0.3 ms of CPU per RPC whatever it holds, and one event loop
serves them all, so one RPC per single-query request caps a worker at a few thousand requests a
second. Under load, queries that would have queued in the worker's scheduler anyway queue here
instead and share an RPC; when the window has room a chunk goes at once, alone, as before.
A group never holds more than one chunk may (`max_tokens`, `max_sequences`), and never splits
chunks. A window carries one class of work (`Part.priority`): each replica has one per RPC method
and class, so a query never waits here behind the bulk RPCs of an indexing job (the worker serves
it first, which it can do only once it has it). Waiting chunks are taken round robin across the
requests they belong to (`Part.owner`), each request's in order: a request that gave a chunk to a
group goes behind the others, so a query that arrives behind the 26 chunks of a 2048-text request
waits for one of them, not for all. Mutated only on the event loop.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
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
    owner: str = ""  # the request this chunk is part of (round robin unit); empty: request_id
    spans: Sequence[np.ndarray | None] | None = None  # span pooling (Embed): per sequence, bounds or None
    num_rows: int = 0  # rows its sequences are answered with; 0: one per sequence
    priority: int = 1  # its request's class (the contract's Priority: 1 interactive, 2 bulk)

    def __post_init__(self) -> None:
        if not self.owner:
            self.owner = self.request_id
        if not self.num_rows:
            self.num_rows = len(self.token_ids)

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
        # Waiting parts per owner, owners in turn order (the next group starts with the first).
        self._waiting: OrderedDict[str, deque[Part]] = OrderedDict()
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
        self._waiting.setdefault(part.owner, deque()).append(part)
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
        """Waiting parts round robin across owners, in turn order, while they fit in one chunk's
        limits: one part of each owner in turn, then a second of each with more, and so on. An owner
        that gave a part goes to the back; one whose next part did not fit keeps its place in front,
        so the next group starts with it (nothing waits for ever)."""
        group: list[Part] = []
        num_tokens = num_sequences = 0
        gave: list[str] = []  # owners that gave a part, in turn order
        is_full = False
        while self._waiting and not is_full:
            took_any = False
            for owner in list(self._waiting):
                parts = self._waiting[owner]
                while parts and parts[0].future is not None and parts[0].future.done():
                    parts.popleft()  # its request was cancelled
                if not parts:
                    del self._waiting[owner]
                    continue
                part = parts[0]
                if group and (
                    part.is_alone
                    or group[0].is_alone
                    or num_tokens + part.num_tokens > self._max_tokens
                    or num_sequences + part.num_sequences > self._max_sequences
                ):
                    is_full = True
                    continue  # a later owner's smaller part may still fit
                group.append(parts.popleft())
                num_tokens += part.num_tokens
                num_sequences += part.num_sequences
                took_any = True
                if owner not in gave:
                    gave.append(owner)
                if not parts:
                    del self._waiting[owner]
            if not took_any:
                break
        for owner in gave:  # behind those that gave nothing
            if owner in self._waiting:
                self._waiting.move_to_end(owner)
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
                for part in reversed(group):  # back in front, each to go alone
                    part.is_alone = True
                    self._waiting.setdefault(part.owner, deque()).appendleft(part)
                    self._waiting.move_to_end(part.owner, last=False)
            else:
                for part in group:
                    _settle(part, error=error)
        else:
            start = 0
            for part in group:
                _settle(part, rows=rows[start : start + part.num_rows])
                start += part.num_rows
        finally:
            self.num_inflight -= 1
            self._flush()

    async def close(self) -> None:
        for task in self._groups:
            task.cancel()
        await asyncio.gather(*self._groups, return_exceptions=True)
        for parts in self._waiting.values():
            for part in parts:
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
        assert rows is not None, "a part settles with its rows or an error"
        future.set_result(rows)
