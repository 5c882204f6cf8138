"""The worker's waiting work and the rule that forms the next batch from it: plain Python over token
counts, no torch, no clock of its own (callers pass `now`).

Requests come in two classes (`Priority`). INTERACTIVE is a search-time query, whose every
millisecond shows; BULK is (re-)indexing, where only throughput counts. Each class is a `RoundRobin`
queue: requests in arrival order, a batch taking one sequence of each waiting request in turn, then a
second of each that has more, each request's sequences in order. A step (`ClassQueues.take`):

1. takes waiting interactive sequences first, up to the token budget and the sequence cap;
2. fills the room left with bulk, but while interactive traffic is about (waiting now, or seen in
   the last `interactive_hold_s`) with at most `bulk_step_tokens` of bulk: a query that arrives
   then waits behind short steps, not behind full bulk ones (a step in flight cannot be recalled);
3. never starves bulk: when bulk has waited `bulk_max_wait_s` without a sequence launched, the next
   step takes bulk first (up to `bulk_step_tokens`, at least one sequence), then interactive fills
   what is left; and a step with no interactive work takes at least one bulk sequence, whatever its
   length.

With an interactive lane (a CUDA engine's second stream, whose steps run beside the main path's
instead of behind them) the rule changes: while the main path is busy, interactive sequences go to
the lane (`take_lane`), and the main path takes bulk alone, in full steps (no cap, no hold: no query
waits behind them). An idle main path still takes interactive work itself (no lane hop), and so
does it with an interactive sequence longer than the lane's steps.

With the classes off (`ClassPolicy.is_enabled` False) every request joins one queue: plain first
come, first served (round robin across requests).
"""

from __future__ import annotations

import asyncio
import enum
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

# A request that does not say its class (a plain gRPC client) is INTERACTIVE when it is at most this
# large, BULK otherwise: a search-time query embeds one text, a handful with query expansion.
INTERACTIVE_MAX_SEQUENCES = 8
INTERACTIVE_MAX_TOKENS = 1024


class Priority(enum.IntEnum):
    """A request's class; the values are the gRPC contract's `Priority`."""

    UNSPECIFIED = 0
    INTERACTIVE = 1
    BULK = 2

    @property
    def label(self) -> str:
        """The metrics' `class` label: "interactive" or "bulk"."""
        return "bulk" if self == Priority.BULK else "interactive"


def classify(said: int, num_sequences: int, num_tokens: int) -> Priority:
    """The class of a request: what the caller said, else by size (see the constants above)."""
    if said in (Priority.INTERACTIVE, Priority.BULK):
        return Priority(said)
    if num_sequences <= INTERACTIVE_MAX_SEQUENCES and num_tokens <= INTERACTIVE_MAX_TOKENS:
        return Priority.INTERACTIVE
    return Priority.BULK


@dataclass(frozen=True)
class ClassPolicy:
    """How the two classes share the worker (see the module docstring; each field in WorkerConfig)."""

    is_enabled: bool = True
    bulk_step_tokens: int = 1024  # most bulk tokens in a step while interactive traffic is about
    interactive_hold_s: float = 1.0  # how long after an interactive request bulk steps stay short
    bulk_max_wait_s: float = 0.5  # bulk waiting this long without a launch goes first
    bulk_queue_share: float = 0.75  # bulk is admitted while the queue is below this share of its cap
    max_bulk_inflight: int = 0  # while interactive is about: steps in flight before a query-less one (0: any)


@dataclass(eq=False)
class Request:
    token_ids: np.ndarray  # [num_tokens] int32, sequences back to back
    offsets: np.ndarray  # [num_seqs + 1] int64, where each sequence starts
    future: asyncio.Future[np.ndarray]
    token_type_ids: np.ndarray | None = None  # [num_tokens] int32 (pair segments), or all zeros
    spans: list[np.ndarray | None] | None = None  # per sequence: its span boundaries, or None
    rows: list[np.ndarray | None] = field(default_factory=list)  # [dim], or [num_spans, dim]
    num_pending: int = 0  # sequences not yet answered
    num_queued_tokens: int = 0  # tokens of this request still counted against the admission cap
    admitted_at: float = 0.0  # time.perf_counter() at admission
    is_started: bool = False  # one of its sequences has been launched
    priority: Priority = Priority.INTERACTIVE
    num_taken: int = 0  # its first num_taken sequences have been taken into batches

    @property
    def num_seqs(self) -> int:
        return len(self.offsets) - 1


@dataclass(frozen=True)
class QueuedSequence:
    request: Request
    index: int  # position within its request

    @property
    def num_tokens(self) -> int:
        offsets = self.request.offsets
        return int(offsets[self.index + 1] - offsets[self.index])

    def token_ids(self) -> np.ndarray:
        offsets = self.request.offsets
        return self.request.token_ids[offsets[self.index] : offsets[self.index + 1]]

    def spans(self) -> np.ndarray | None:
        spans = self.request.spans
        return None if spans is None else spans[self.index]

    def token_type_ids(self) -> np.ndarray:
        offsets = self.request.offsets
        types = self.request.token_type_ids
        if types is None:
            return np.zeros(self.num_tokens, dtype=np.int32)
        return types[offsets[self.index] : offsets[self.index + 1]]


class RoundRobin:
    """The queue of requests with sequences not yet taken, in arrival order, and the rule that
    takes a batch from it (see the module docstring). Taking costs O(sequences taken)."""

    def __init__(self) -> None:
        self._waiting: deque[Request] = deque()

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def __len__(self) -> int:
        return len(self._waiting)

    def push(self, request: Request) -> None:
        self._waiting.append(request)

    def pop_all(self) -> list[Request]:
        waiting, self._waiting = list(self._waiting), deque()
        return waiting

    def next_num_tokens(self) -> int | None:
        """Tokens of the sequence the next batch would take first (None: nothing waits)."""
        for request in self._waiting:
            if not request.future.done():
                return int(request.offsets[request.num_taken + 1] - request.offsets[request.num_taken])
        return None

    def take(self, max_tokens: int, max_sequences: int, *, at_least_one: bool = True) -> list[QueuedSequence]:
        """The next batch; a request finished early (cancelled, failed) is dropped when reached.
        With `at_least_one`, a first sequence longer than `max_tokens` is taken alone; without, the
        batch may be empty (it fills the room another class left)."""
        batch: list[QueuedSequence] = []
        num_tokens = 0
        taken: list[Request] = []  # requests that gave a sequence, oldest first

        def fits(request: Request) -> bool:
            n = int(request.offsets[request.num_taken + 1] - request.offsets[request.num_taken])
            if not batch and at_least_one:
                return True
            return num_tokens + n <= max_tokens and len(batch) < max_sequences

        def take_one(request: Request) -> None:
            nonlocal num_tokens
            seq = QueuedSequence(request, request.num_taken)
            request.num_taken += 1
            batch.append(seq)
            num_tokens += seq.num_tokens

        is_full = False
        while self._waiting:  # the first round, over the queue from its oldest request
            request = self._waiting[0]
            if request.future.done():
                self._waiting.popleft()
                continue
            if not fits(request):
                is_full = True
                break
            take_one(self._waiting.popleft())
            taken.append(request)
        # Every waiting request has given one: later rounds go over them again, oldest first.
        more = [r for r in taken if r.num_taken < r.num_seqs]
        while more and not is_full:
            for request in more:
                if not fits(request):
                    is_full = True
                    break
                take_one(request)
            more = [r for r in more if r.num_taken < r.num_seqs]
        for request in reversed(taken):  # those with sequences left keep their place at the front
            if request.num_taken < request.num_seqs:
                self._waiting.appendleft(request)
        return batch


class ClassQueues:
    """The two classes' queues and the rule that takes the next batch from them (module docstring)."""

    def __init__(self, policy: ClassPolicy, lane_tokens: int = 0) -> None:
        self.policy = policy
        # the interactive lane's step budget (0: no lane); only with the classes on
        self.lane_tokens = lane_tokens if policy.is_enabled else 0
        self.interactive = RoundRobin()
        self.bulk = RoundRobin()
        self._interactive_seen_at = -math.inf
        self._bulk_served_at = -math.inf  # a bulk launch, or bulk's queue turning non-empty

    def __bool__(self) -> bool:
        return bool(self.interactive) or bool(self.bulk)

    def push(self, request: Request, now: float) -> None:
        if request.priority == Priority.BULK and self.policy.is_enabled:
            if not self.bulk:
                self._bulk_served_at = now  # its wait starts now
            self.bulk.push(request)
        else:
            self._interactive_seen_at = now
            self.interactive.push(request)

    def pop_all(self) -> list[Request]:
        return self.interactive.pop_all() + self.bulk.pop_all()

    def is_interactive_about(self, now: float) -> bool:
        return bool(self.interactive) or now - self._interactive_seen_at < self.policy.interactive_hold_s

    def is_holding_bulk(self, num_inflight: int, now: float) -> bool:
        """Whether the next step, which would hold no query, waits for a step in flight to finish:
        while interactive traffic is about, a query that arrives waits for every step already
        launched, so at most `max_bulk_inflight` of them are launched ahead of it."""
        limit = self.policy.max_bulk_inflight
        return (
            self.policy.is_enabled
            and not self.lane_tokens
            and limit > 0
            and num_inflight >= limit
            and not self.interactive
            and bool(self.bulk)
            and self.is_interactive_about(now)
        )

    def has_lane_work(self) -> bool:
        """Whether the lane could take a sequence now."""
        head = self.interactive.next_num_tokens()
        return bool(self.lane_tokens) and head is not None and head <= self.lane_tokens

    def take_lane(self, max_tokens: int, max_sequences: int) -> list[QueuedSequence]:
        """The interactive lane's next batch: interactive sequences only, none longer than
        `max_tokens` (such a one is left, with those behind it, to the main path)."""
        return self.interactive.take(max_tokens, max_sequences, at_least_one=False)

    def take(
        self, max_tokens: int, max_sequences: int, now: float, *, with_interactive: bool = True
    ) -> list[QueuedSequence]:
        """The next batch: at most `max_tokens` tokens (but one longer sequence alone) and
        `max_sequences` sequences. With a lane, `with_interactive` False leaves interactive
        sequences to it (all but one longer than its steps): the batch is bulk alone, in full."""
        if not self.policy.is_enabled:
            return self.interactive.take(max_tokens, max_sequences)
        if self.lane_tokens and not with_interactive and not self._head_needs_main():
            batch = self.bulk.take(max_tokens, max_sequences)
            if batch:
                self._bulk_served_at = now
            return batch
        bulk_tokens = max_tokens
        if not self.lane_tokens and self.is_interactive_about(now):
            bulk_tokens = min(self.policy.bulk_step_tokens, max_tokens)
        if self.bulk and now - self._bulk_served_at >= self.policy.bulk_max_wait_s:
            batch = self.bulk.take(bulk_tokens, max_sequences)
            num_tokens = sum(seq.num_tokens for seq in batch)
            batch += self.interactive.take(
                max_tokens - num_tokens, max_sequences - len(batch), at_least_one=not batch
            )
        else:
            batch = self.interactive.take(max_tokens, max_sequences)
            num_tokens = sum(seq.num_tokens for seq in batch)
            batch += self.bulk.take(
                min(bulk_tokens, max_tokens - num_tokens), max_sequences - len(batch), at_least_one=not batch
            )
        if any(seq.request.priority == Priority.BULK for seq in batch):
            self._bulk_served_at = now
        return batch

    def _head_needs_main(self) -> bool:
        head = self.interactive.next_num_tokens()
        return head is not None and head > self.lane_tokens
