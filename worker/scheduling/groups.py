"""A group of requests admitted together, the unit the worker's queues hold: one data-port frame's
requests of one class, or one unary call's request. Plain numpy, no torch, no clock of its own.

Everything per request and per sequence is an array, so admitting, taking, answering and failing
cost a few numpy calls per group, whatever the number of requests in it. Request r is sequences
`seq_offsets[r] : seq_offsets[r + 1]`; sequence s is tokens `token_offsets[s] : token_offsets[s + 1]`.
Sequences are taken into batches in order (`take`), so a request's sequences go to the device in
order, and a batch holds a run of each group's waiting sequences. A request is answered once its
last sequence's row is back (`deliver`), whichever batch that was: an interactive lane's batch
may finish before the main path's. A request that fails, is cancelled or passes its deadline
(`finish`) leaves the queue at once (its sequences not yet taken are dropped), and what it still
counted against the queue cap is handed back.

The group tells its `sink` which of its requests were answered or failed: a data-port
connection's (frames.py), or a unary call's future (`FutureSink`).
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from kembed.worker.classes import Priority


class GroupSink(Protocol):
    """Who waits for a group's answers. Called on the event loop; must not block."""

    def answered(self, group: RequestGroup, requests: np.ndarray) -> None:
        """`requests` (indices into the group) have all their rows in `group.rows`."""

    def failed(self, group: RequestGroup, requests: np.ndarray, error: BaseException) -> None: ...


class RequestGroup:
    """Requests admitted together; see the module docstring."""

    def __init__(
        self,
        token_ids: np.ndarray,
        lengths: np.ndarray,
        num_sequences: np.ndarray | None,
        sink: GroupSink,
        *,
        priority: Priority,
        admitted_at: float,
        deadlines: np.ndarray | None = None,
        ids: np.ndarray | None = None,
        token_type_ids: np.ndarray | None = None,
        spans: list[np.ndarray | None] | None = None,
        outputs: np.ndarray | None = None,
        rows_per_seq: np.ndarray | None = None,
    ) -> None:
        num_seqs = len(lengths)
        self.token_ids = token_ids  # [num_tokens] int32
        self.lengths = lengths.astype(np.int32, copy=False)  # [num_seqs]
        self.token_offsets = np.zeros(num_seqs + 1, dtype=np.int64)  # [num_seqs + 1]
        np.cumsum(self.lengths, out=self.token_offsets[1:])
        # None: one sequence per request (the common case; sequence s is request s)
        self.request_of_seq: np.ndarray | None = None  # [num_seqs] int64
        if num_sequences is None:
            self.num_requests = num_seqs
            self.seq_offsets = np.arange(num_seqs + 1, dtype=np.int64)
            self.tokens_per_request = self.lengths.astype(np.int64)
        else:
            self.num_requests = len(num_sequences)
            self.seq_offsets = np.zeros(self.num_requests + 1, dtype=np.int64)
            np.cumsum(num_sequences, out=self.seq_offsets[1:])
            if self.num_requests != num_seqs:
                self.request_of_seq = np.repeat(np.arange(self.num_requests), num_sequences)
            self.tokens_per_request = np.diff(self.token_offsets[self.seq_offsets])
        self.token_type_ids = token_type_ids  # [num_tokens] int32, or None (all zeros)
        self.spans = spans  # per sequence, its k + 1 span bounds or None; None: no span pooling
        # rows per sequence: one, or one per span; row_offsets[s] is sequence s's first row
        self.row_offsets: np.ndarray | None = None  # [num_seqs + 1] int64; None: row s is sequence s
        # several outputs (kembed.proto.outputs): per sequence its Output bitmask, and the rows that
        # answer it (OutputShape.rows_of); None: dense rows alone
        self.outputs = outputs  # [num_seqs] uint8, or None
        if spans is not None:
            rows_per_seq = np.array([1 if bounds is None else len(bounds) - 1 for bounds in spans])
        if rows_per_seq is not None:
            self.row_offsets = np.zeros(num_seqs + 1, dtype=np.int64)
            np.cumsum(rows_per_seq, out=self.row_offsets[1:])
        self.sink = sink
        self.priority = priority
        self.admitted_at = admitted_at  # time.perf_counter() at admission
        self.deadlines = deadlines  # [num_requests] float64 perf_counter times (inf: none), or None
        self.ids = ids  # [num_requests] uint64, the caller's ids (frames), or None
        self.rows: np.ndarray | None = None  # [num_rows, width] float32 once a batch answered
        # queue state: sequences not yet taken, in order (positions from `_head` on)
        self._queue = np.arange(num_seqs, dtype=np.int64)
        self._head = 0
        # per request: sequences not yet answered, tokens still counted against the queue cap,
        # whether it is settled (answered, failed, cancelled), and whether a sequence was launched
        self.num_pending = np.diff(self.seq_offsets).astype(np.int32)
        self.tokens_left = self.tokens_per_request.copy()
        self.is_settled = np.zeros(self.num_requests, dtype=bool)
        self.num_live = self.num_requests
        self.num_queued_tokens = int(self.token_offsets[-1])  # its live requests' share of the queue cap
        self.is_queued = False  # admitted into a scheduler's queue (its tokens counted there)
        self.min_deadline = math.inf if deadlines is None else float(deadlines.min(initial=math.inf))

    @property
    def num_seqs(self) -> int:
        return len(self.lengths)

    @property
    def num_waiting(self) -> int:
        """Sequences not yet taken (of live requests)."""
        return len(self._queue) - self._head

    def next_lengths(self, limit: int) -> np.ndarray:
        """Tokens of the next `limit` sequences to take, in order."""
        return self.lengths[self._queue[self._head : self._head + limit]]

    def take(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """The next `count` waiting sequences (indices, increasing), and the requests whose first
        sequence is among them (they start now: the queue-wait metric)."""
        seqs = self._queue[self._head : self._head + count]
        self._head += count
        if self.request_of_seq is None:
            return seqs, seqs
        owners = self.request_of_seq[seqs]
        return seqs, owners[self.seq_offsets[owners] == seqs]

    def tokens_of(self, seqs: np.ndarray, values: np.ndarray | None = None) -> np.ndarray:
        """The token ids (or `values`, an array laid out as them) of `seqs`, back to back."""
        values = self.token_ids if values is None else values
        offsets = self.token_offsets
        first, last = int(seqs[0]), int(seqs[-1])
        if last - first + 1 == len(seqs):  # a run: one slice, no copy
            return values[offsets[first] : offsets[last + 1]]
        return np.concatenate([values[offsets[s] : offsets[s + 1]] for s in seqs.tolist()])

    def num_rows_of(self, seqs: np.ndarray) -> int:
        if self.row_offsets is None:
            return len(seqs)
        return int((self.row_offsets[seqs + 1] - self.row_offsets[seqs]).sum())

    def _store(self, seqs: np.ndarray, rows: np.ndarray) -> None:
        """Copy the rows of `seqs` into the group's own rows (allocated on the first batch)."""
        if self.rows is None:
            num_rows = self.num_seqs if self.row_offsets is None else int(self.row_offsets[-1])
            self.rows = np.empty((num_rows, rows.shape[1]), dtype=np.float32)
        if self.row_offsets is None:
            self.rows[seqs] = rows
            return
        at = 0
        for s in seqs.tolist():
            start, stop = int(self.row_offsets[s]), int(self.row_offsets[s + 1])
            self.rows[start:stop] = rows[at : at + stop - start]
            at += stop - start

    def deliver(self, seqs: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, int]:
        """Store the rows of `seqs` (a batch's, in their order); returns the requests that now have
        every row (newly answered) and the tokens handed back to the queue cap."""
        if self.rows is None and self.row_offsets is None and len(seqs) == self.num_seqs:
            self.rows = rows  # the whole group in one batch, in order: its rows as they came, uncopied
        else:
            self._store(seqs, rows)
        owners = seqs if self.request_of_seq is None else self.request_of_seq[seqs]
        live = ~self.is_settled[owners]
        if not live.all():  # rows of requests settled meanwhile (cancelled, expired) count for nothing
            seqs, owners = seqs[live], owners[live]
        tokens = self.lengths[seqs]
        if self.request_of_seq is None:  # each request once: plain indexing
            self.num_pending[owners] -= 1
            self.tokens_left[owners] -= tokens
            done = owners[self.num_pending[owners] == 0]
        else:
            np.subtract.at(self.num_pending, owners, 1)
            np.subtract.at(self.tokens_left, owners, tokens)
            touched = np.unique(owners)
            done = touched[self.num_pending[touched] == 0]
        released = int(tokens.sum())
        self._settle(done)
        self.num_queued_tokens -= released
        return done, released

    def finish(self, requests: np.ndarray) -> tuple[np.ndarray, int]:
        """Settle `requests` early (failed, cancelled, expired): those not settled yet, and the tokens
        they still counted, which go back to the queue cap. Their waiting sequences leave the queue."""
        requests = requests[~self.is_settled[requests]]
        if len(requests) == 0:
            return requests, 0
        released = int(self.tokens_left[requests].sum())
        self.tokens_left[requests] = 0
        self._settle(requests)
        self.num_queued_tokens -= released
        waiting = self._queue[self._head :]
        owners = waiting if self.request_of_seq is None else self.request_of_seq[waiting]
        self._queue, self._head = waiting[~self.is_settled[owners]], 0
        return requests, released

    def expired(self, now: float) -> np.ndarray:
        """Live requests whose deadline has passed; the group's next deadline is updated."""
        if self.deadlines is None:
            return np.empty(0, dtype=np.int64)
        live = ~self.is_settled
        late = np.flatnonzero(live & (self.deadlines <= now))
        ahead = self.deadlines[live & (self.deadlines > now)]
        self.min_deadline = float(ahead.min()) if len(ahead) else math.inf
        return late

    def _settle(self, requests: np.ndarray) -> None:
        self.is_settled[requests] = True
        self.num_live -= len(requests)

    def rows_of(self, requests: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(rows per request [len(requests)] int64, their rows back to back) of answered requests,
        `requests` increasing."""
        assert self.rows is not None, "answered requests have rows"
        if len(requests) == self.num_requests:  # all of them, as a group answered by one batch
            offsets = self._request_row_offsets()
            return np.diff(offsets), self.rows
        if self.row_offsets is None and self.request_of_seq is None:  # a row each
            return np.ones(len(requests), dtype=np.int64), self.rows[requests]
        offsets = self._request_row_offsets()
        starts = offsets[requests]
        counts = offsets[requests + 1] - starts
        # row i of the answer is row starts[k] + (i - first row of request k) of the group
        index = np.arange(int(counts.sum())) + np.repeat(starts - (np.cumsum(counts) - counts), counts)
        return counts, self.rows[index]

    def _request_row_offsets(self) -> np.ndarray:
        """[num_requests + 1]: request r's rows are rows[offsets[r] : offsets[r + 1]]."""
        return self.seq_offsets if self.row_offsets is None else self.row_offsets[self.seq_offsets]


@dataclass(slots=True)
class Segment:
    """A run of one group's sequences in a batch."""

    group: RequestGroup
    seqs: np.ndarray  # sequence indices in the group, increasing
    num_tokens: int
    started: np.ndarray  # the requests whose first sequence this is (indices in the group)


class FutureSink:
    """A one-request group's answer as a future (unary calls, tests): its rows [num_rows, width]."""

    def __init__(self, future: asyncio.Future[np.ndarray]) -> None:
        self.future = future

    def answered(self, group: RequestGroup, requests: np.ndarray) -> None:
        if not self.future.done():
            assert group.rows is not None
            self.future.set_result(group.rows)

    def failed(self, group: RequestGroup, requests: np.ndarray, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)


def pack_arguments(batch: list[Segment]) -> tuple[Any, ...]:
    """`pack`'s arguments for a batch: its token ids and lengths, then token types and spans where
    any sequence has them (a runner without them is called with two arguments)."""
    token_ids = _joined([seg.group.tokens_of(seg.seqs) for seg in batch])
    arrays: tuple[Any, ...] = (token_ids, _joined([seg.group.lengths[seg.seqs] for seg in batch]))
    has_types = any(seg.group.token_type_ids is not None for seg in batch)
    has_spans = any(seg.group.spans is not None for seg in batch)
    has_outputs = any(seg.group.outputs is not None for seg in batch)
    if has_types or has_spans or has_outputs:
        arrays += (_joined([_token_types(seg) for seg in batch]) if has_types else None,)
    if has_spans or has_outputs:
        arrays += ([_span(seg.group, s) for seg in batch for s in seg.seqs.tolist()] if has_spans else None,)
    if has_outputs:
        arrays += (_joined([_outputs(seg) for seg in batch]),)
    return arrays


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _token_types(seg: Segment) -> np.ndarray:
    group = seg.group
    if group.token_type_ids is None:  # all zeros: a group without pairs beside one with them
        return np.zeros(seg.num_tokens, np.int32)
    return group.tokens_of(seg.seqs, group.token_type_ids)


def _outputs(seg: Segment) -> np.ndarray:
    group = seg.group
    if group.outputs is None:  # dense alone: a dense group beside a multi-output one
        return np.zeros(len(seg.seqs), np.uint8)
    picked: np.ndarray = group.outputs[seg.seqs]
    return picked


def _span(group: RequestGroup, seq: int) -> np.ndarray | None:
    return None if group.spans is None else group.spans[seq]
