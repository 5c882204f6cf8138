"""Splitting a request's sequences into chunks, a chunk as it travels to a worker (`Part`), and
packing a chunk into the wire's TokenBatch (the unary RPCs)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kembed.proto import embedder_pb2 as pb


@dataclass(frozen=True, slots=True)
class Chunk:
    """Sequences [start, stop) of one request, sent to one replica as one RPC."""

    start: int
    stop: int
    num_tokens: int

    @property
    def num_sequences(self) -> int:
        return self.stop - self.start


@dataclass(eq=False, slots=True)
class Part:
    """One chunk of one request, as it travels to a worker replica."""

    request_id: str
    token_ids: Sequence[np.ndarray]  # one int32 array per sequence
    token_type_ids: Sequence[np.ndarray] | None  # pairs (Score) only
    num_tokens: int
    deadline: float  # loop.time() by which its request must be answered
    priority: int = 1  # its request's class (the contract's Priority: 1 interactive, 2 bulk)
    spans: Sequence[np.ndarray | None] | None = None  # span pooling (Embed): per sequence, bounds or None
    num_rows: int = 0  # rows its sequences are answered with; 0: one per sequence; -1: the worker says
    outputs: int = 0  # the contract's Output bitmask (kembed.proto.outputs); 0: dense rows alone
    task: str = ""  # a multi-task model's adapter (Info.tasks); "": the worker's default
    task_number: int = 0  # the same as a RequestFrame names it: 0 the default, t + 1 Info.tasks[t]
    owner: str = ""  # the request this chunk is part of; empty: request_id

    def __post_init__(self) -> None:
        if not self.num_rows:
            self.num_rows = len(self.token_ids)
        if not self.owner:
            self.owner = self.request_id

    @property
    def num_sequences(self) -> int:
        return len(self.token_ids)


def split_into_chunks(lengths: Sequence[int], *, max_tokens: int, max_sequences: int) -> list[Chunk]:
    """Consecutive chunks, in order, of at most `max_tokens` tokens and `max_sequences` sequences.

    A sequence is never split: one longer than `max_tokens` (possible only when chunk_tokens is set
    below the model's max length) travels alone in its own chunk.
    """
    chunks: list[Chunk] = []
    start = 0
    num_tokens = 0
    for i, length in enumerate(lengths):
        if i > start and (num_tokens + length > max_tokens or i - start >= max_sequences):
            chunks.append(Chunk(start, i, num_tokens))
            start, num_tokens = i, 0
        num_tokens += length
    if len(lengths) > start:
        chunks.append(Chunk(start, len(lengths), num_tokens))
    return chunks


def pack(
    token_ids: Sequence[np.ndarray],
    token_type_ids: Sequence[np.ndarray] | None = None,
    spans: Sequence[np.ndarray | None] | None = None,
) -> pb.TokenBatch:
    """A ragged TokenBatch: ids concatenated as int32 little-endian bytes plus one length each;
    `spans` (per sequence None, or its k + 1 span bounds) asks for span pooling, k rows for it."""
    batch = pb.TokenBatch(
        token_ids=np.concatenate(token_ids).astype("<i4", copy=False).tobytes(),
        lengths=[len(ids) for ids in token_ids],
    )
    if token_type_ids is not None:
        batch.token_type_ids = np.concatenate(token_type_ids).astype("<i4", copy=False).tobytes()
    if spans is not None:
        batch.num_spans.extend(0 if bounds is None else len(bounds) - 1 for bounds in spans)
        batch.span_bounds.extend(int(b) for bounds in spans if bounds is not None for b in bounds)
    return batch


def num_rows(spans: Sequence[np.ndarray | None]) -> int:
    """Rows a worker answers for sequences with these spans: one per span, one per sequence without."""
    return sum(1 if bounds is None else len(bounds) - 1 for bounds in spans)
