"""Host-side staging for the CUDA engine: padded batches, and the pinned ring they travel through.

`pad_batch` turns a ragged batch into the arrays of its bucket (CPU, numpy, on the event loop).
`PinnedRing` is the pinned host memory, allocated once under a hard byte cap: each slot holds one
batch's inputs on their way to the device and its result on the way back. A slot is taken at launch
and given back when the result has been read, so a full ring is backpressure (launch waits), never
growth.
"""

import threading
from dataclasses import dataclass

import numpy as np
import torch

from kembed.worker.buckets import Bucket


@dataclass(frozen=True)
class PaddedBatch:
    """A ragged batch laid out in its bucket. Sequence slot `num_seqs` holds the padding tokens;
    slots after it are empty, so every padded shape is a valid ragged batch."""

    num_seqs: int  # real sequences
    num_tokens: int  # real tokens
    bucket: Bucket  # padded shape (or the exact shape when no bucket holds the batch)
    is_bucketed: bool  # False: larger than every bucket, runs eagerly in its exact shape
    input_ids: np.ndarray  # [bucket.num_tokens] int64
    position_ids: np.ndarray  # [bucket.num_tokens] int64
    token_type_ids: np.ndarray  # [bucket.num_tokens] int64
    cu_seqlens: np.ndarray  # [bucket.num_seqs + 2] int32
    seq_ids: np.ndarray  # [bucket.num_tokens] int64


def pad_batch(
    token_ids: np.ndarray,
    lengths: np.ndarray,
    token_type_ids: np.ndarray | None,
    bucket: Bucket | None,
) -> PaddedBatch:
    num_seqs, num_tokens = len(lengths), int(lengths.sum())
    is_bucketed = bucket is not None
    bucket = bucket or Bucket(num_seqs, num_tokens)
    padded_tokens = bucket.num_tokens
    cu_seqlens = np.full(bucket.num_seqs + 2, padded_tokens, dtype=np.int32)
    cu_seqlens[0] = 0
    np.cumsum(lengths, out=cu_seqlens[1 : num_seqs + 1])
    seq_ids = np.full(padded_tokens, num_seqs, dtype=np.int64)
    seq_ids[:num_tokens] = np.repeat(np.arange(num_seqs), lengths)
    positions = np.zeros(padded_tokens, dtype=np.int64)
    positions[:num_tokens] = np.arange(num_tokens) - cu_seqlens[seq_ids[:num_tokens]]
    ids = np.zeros(padded_tokens, dtype=np.int64)
    ids[:num_tokens] = token_ids
    types = np.zeros(padded_tokens, dtype=np.int64)
    if token_type_ids is not None:
        types[:num_tokens] = token_type_ids
    return PaddedBatch(num_seqs, num_tokens, bucket, is_bucketed, ids, positions, types, cu_seqlens, seq_ids)


class Slot:
    """One batch's pinned host buffers, sized for the largest bucket."""

    def __init__(self, max_tokens: int, max_seqs: int, output_size: int) -> None:
        def pinned(*shape, dtype):
            return torch.empty(*shape, dtype=dtype, pin_memory=True)

        self.input_ids = pinned(max_tokens, dtype=torch.int64)  # [max_tokens]
        self.position_ids = pinned(max_tokens, dtype=torch.int64)  # [max_tokens]
        self.token_type_ids = pinned(max_tokens, dtype=torch.int64)  # [max_tokens]
        self.seq_ids = pinned(max_tokens, dtype=torch.int64)  # [max_tokens]
        self.cu_seqlens = pinned(max_seqs + 2, dtype=torch.int32)  # [max_seqs + 2]
        self.output = pinned(max_seqs + 1, output_size, dtype=torch.float32)  # [max_seqs + 1, out]

    @property
    def num_bytes(self) -> int:
        tensors = (
            self.input_ids,
            self.position_ids,
            self.token_type_ids,
            self.seq_ids,
            self.cu_seqlens,
            self.output,
        )
        return sum(t.numel() * t.element_size() for t in tensors)

    def stage(self, batch: PaddedBatch) -> None:
        """Copy the padded arrays into this slot (host to host; the device copy follows)."""
        tokens, seqs = batch.bucket.num_tokens, batch.bucket.num_seqs
        self.input_ids[:tokens].numpy()[:] = batch.input_ids
        self.position_ids[:tokens].numpy()[:] = batch.position_ids
        self.token_type_ids[:tokens].numpy()[:] = batch.token_type_ids
        self.seq_ids[:tokens].numpy()[:] = batch.seq_ids
        self.cu_seqlens[: seqs + 2].numpy()[:] = batch.cu_seqlens


class PinnedRing:
    """A fixed set of pinned slots under a byte cap; `acquire` blocks while all are in flight."""

    def __init__(self, depth: int, max_tokens: int, max_seqs: int, output_size: int, max_bytes: int) -> None:
        first = Slot(max_tokens, max_seqs, output_size)
        depth = min(depth, max_bytes // first.num_bytes)
        if depth < 1:
            raise ValueError(
                f"pinned memory cap {max_bytes} bytes is below one batch slot ({first.num_bytes} bytes)"
            )
        self.slots = [first] + [Slot(max_tokens, max_seqs, output_size) for _ in range(depth - 1)]
        self._free = list(self.slots)
        self._cond = threading.Condition()

    @property
    def reserved_bytes(self) -> int:
        return sum(slot.num_bytes for slot in self.slots)

    @property
    def in_use_bytes(self) -> int:
        with self._cond:
            return sum(slot.num_bytes for slot in self.slots if slot not in self._free)

    def acquire(self) -> Slot:
        with self._cond:
            self._cond.wait_for(lambda: self._free)
            return self._free.pop()

    def release(self, slot: Slot) -> None:
        with self._cond:
            self._free.append(slot)
            self._cond.notify()
