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

import math
from collections import deque

import numpy as np

from kembed.worker.classes import (
    INTERACTIVE_MAX_SEQUENCES,
    INTERACTIVE_MAX_TOKENS,
    ClassPolicy,
    Priority,
    classify,
)
from kembed.worker.scheduling.groups import RequestGroup, Segment

__all__ = [
    "INTERACTIVE_MAX_SEQUENCES",
    "INTERACTIVE_MAX_TOKENS",
    "ClassPolicy",
    "ClassQueues",
    "Priority",
    "RoundRobin",
    "batch_size",
    "classify",
]


def batch_size(batch: list[Segment]) -> tuple[int, int]:
    """(sequences, tokens) of a batch."""
    return sum(len(seg.seqs) for seg in batch), sum(seg.num_tokens for seg in batch)


class RoundRobin:
    """The groups with sequences not yet taken, in arrival order, and the rule that takes a batch
    from them (see the module docstring): in effect one sequence of each group in turn, then a
    second of each that has more, while they fit. A group is the unit of turns: one data-port
    frame's requests of a class (the gateway fills a frame round robin across its requests), or
    one unary request. Taking costs a few numpy calls per group that gives sequences."""

    def __init__(self) -> None:
        self._waiting: deque[RequestGroup] = deque()

    def __bool__(self) -> bool:
        return any(group.num_waiting for group in self._waiting)

    def __len__(self) -> int:
        return sum(1 for group in self._waiting if group.num_waiting)

    def push(self, group: RequestGroup) -> None:
        self._waiting.append(group)

    def pop_all(self) -> list[RequestGroup]:
        waiting, self._waiting = list(self._waiting), deque()
        return waiting

    def next_num_tokens(self) -> int | None:
        """Tokens of the sequence the next batch would take first (None: nothing waits)."""
        for group in self._waiting:
            if group.num_waiting:
                return int(group.next_lengths(1)[0])
        return None

    def take(self, max_tokens: int, max_sequences: int, *, at_least_one: bool = True) -> list[Segment]:
        """The next batch, as a run of sequences from each group that gives some, oldest group
        first. With `at_least_one`, a first sequence longer than `max_tokens` is taken alone;
        without, the batch may be empty (it fills the room another class left)."""
        if max_sequences <= 0:
            return []
        groups = [group for group in self._waiting if group.num_waiting]
        if len(groups) != len(self._waiting):
            self._waiting = deque(groups)
        if not groups:
            return []
        counts = _turns([g.next_lengths(max_sequences) for g in groups], max_tokens, max_sequences)
        if counts[0] == 0 and at_least_one:  # the oldest group's next sequence alone is over the budget
            counts[0] = 1
        batch: list[Segment] = []
        for group, count in zip(groups, counts.tolist(), strict=True):
            if count:
                seqs, started = group.take(count)
                batch.append(Segment(group, seqs, int(group.lengths[seqs].sum()), started))
        while self._waiting and not self._waiting[0].num_waiting:
            self._waiting.popleft()
        return batch


def _turns(lengths: list[np.ndarray], max_tokens: int, max_sequences: int) -> np.ndarray:
    """How many sequences each group gives when they take turns, one sequence a turn, group after
    group: the longest prefix of that order within `max_tokens` and `max_sequences`. `lengths`:
    each group's next sequences' tokens, oldest group first."""
    if len(lengths) == 1:
        within = int(np.searchsorted(np.cumsum(lengths[0]), max_tokens, side="right"))
        return np.array([min(within, max_sequences)])
    counts = np.array([len(group) for group in lengths])
    owner = np.repeat(np.arange(len(lengths)), counts)
    turn = np.arange(len(owner)) - np.repeat(np.cumsum(counts) - counts, counts)
    order = np.lexsort((owner, turn))  # by turn, then by group: the turn-taking order
    cumulative = np.cumsum(np.concatenate(lengths)[order])
    num_taken = min(int(np.searchsorted(cumulative, max_tokens, side="right")), max_sequences)
    return np.bincount(owner[order[:num_taken]], minlength=len(lengths))


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

    def push(self, group: RequestGroup, now: float) -> None:
        if group.priority == Priority.BULK and self.policy.is_enabled:
            if not self.bulk:
                self._bulk_served_at = now  # its wait starts now
            self.bulk.push(group)
        else:
            self._interactive_seen_at = now
            self.interactive.push(group)

    def pop_all(self) -> list[RequestGroup]:
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

    def take_lane(self, max_tokens: int, max_sequences: int) -> list[Segment]:
        """The interactive lane's next batch: interactive sequences only, none longer than
        `max_tokens` (such a one is left, with those behind it, to the main path)."""
        return self.interactive.take(max_tokens, max_sequences, at_least_one=False)

    def take(
        self, max_tokens: int, max_sequences: int, now: float, *, with_interactive: bool = True
    ) -> list[Segment]:
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
            num_seqs, num_tokens = batch_size(batch)
            batch += self.interactive.take(
                max_tokens - num_tokens, max_sequences - num_seqs, at_least_one=not batch
            )
        else:
            batch = self.interactive.take(max_tokens, max_sequences)
            num_seqs, num_tokens = batch_size(batch)
            batch += self.bulk.take(
                min(bulk_tokens, max_tokens - num_tokens), max_sequences - num_seqs, at_least_one=not batch
            )
        if any(seg.group.priority == Priority.BULK for seg in batch):
            self._bulk_served_at = now
        return batch

    def _head_needs_main(self) -> bool:
        head = self.interactive.next_num_tokens()
        return head is not None and head > self.lane_tokens
