"""Host-side staging for the CUDA engine: padded batches, and the pinned ring they travel through.

A batch's inputs travel as one block of bytes, laid out per bucket (`InputLayout`): the four int64
arrays of `num_tokens` (ids, positions, token types, sequence ids) back to back, then the int32
`cu_seqlens` of `num_seqs + 2`. `pad_batch` (CPU, numpy, on the event loop) writes a batch straight
into such a block; a step copies it with one memcpy into a pinned slot and with one asynchronous copy
into the static device block, whose typed views the graphs read. Only the bucket's prefix moves.

`PinnedRing` is the pinned host memory, allocated once under a hard byte cap: each slot holds one
batch's inputs on their way to the device and its result on the way back. A slot is taken at launch
and given back when the result has been read, so a full ring is backpressure (launch waits), never
growth.
"""

import functools
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from kembed.worker.buckets import Bucket

if TYPE_CHECKING:
    from kembed.worker.engine.payload import PayloadIndex, PayloadPlan
    from kembed.worker.engine.spans import SpanIndex

_TOKEN_ARRAYS = 4  # input ids, position ids, token type ids, sequence ids: int64 each
_ALIGN = 64  # bytes; where a slot's output rows start after its inputs


@dataclass(frozen=True)
class InputLayout:
    """Where one bucket's inputs sit in a staging block. Every offset is a multiple of 4 bytes, and
    the int64 arrays' of 8, for any token count; a bucket's block is the prefix [0, num_bytes)."""

    num_seqs: int  # sequence slots of the bucket
    num_tokens: int  # padded tokens of the bucket

    @property
    def cu_seqlens_offset(self) -> int:
        return _TOKEN_ARRAYS * 8 * self.num_tokens

    @property
    def num_bytes(self) -> int:
        return self.cu_seqlens_offset + 4 * (self.num_seqs + 2)

    @classmethod
    def of(cls, bucket: Bucket) -> "InputLayout":
        return cls(bucket.num_seqs, bucket.num_tokens)

    def numpy_views(self, block: np.ndarray) -> tuple[np.ndarray, ...]:
        """(input_ids, position_ids, token_type_ids, seq_ids, cu_seqlens) views of a uint8 block."""
        tokens = block[: self.cu_seqlens_offset].view(np.int64).reshape(_TOKEN_ARRAYS, self.num_tokens)
        cu_seqlens = block[self.cu_seqlens_offset : self.num_bytes].view(np.int32)
        return (*tokens, cu_seqlens)

    def torch_views(self, block: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The same five views of a uint8 tensor (pinned host or device)."""
        tokens = block[: self.cu_seqlens_offset].view(torch.int64).view(_TOKEN_ARRAYS, self.num_tokens)
        cu_seqlens = block[self.cu_seqlens_offset : self.num_bytes].view(torch.int32)
        return (*tokens.unbind(0), cu_seqlens)

    def host_cu_seqlens(self, block: torch.Tensor) -> torch.Tensor:
        """The int32 offsets of a host block (what a per-batch attention plan reads)."""
        return block[self.cu_seqlens_offset : self.num_bytes].view(torch.int32)


def max_input_bytes(max_tokens: int, max_seqs: int) -> int:
    """Bytes of a block that holds any bucket up to (max_seqs, max_tokens)."""
    return InputLayout(max_seqs, max_tokens).num_bytes


@dataclass(frozen=True)
class PaddedBatch:
    """A ragged batch laid out in its bucket. Sequence slot `num_seqs` holds the padding tokens;
    slots after it are empty, so every padded shape is a valid ragged batch. The five arrays are
    views of `block`, the bytes a step copies."""

    num_seqs: int  # real sequences
    num_tokens: int  # real tokens
    bucket: Bucket  # padded shape it runs in (or the exact shape when no bucket holds the batch)
    is_bucketed: bool  # False: larger than every bucket, runs eagerly in its exact shape
    own_bucket: Bucket | None  # the table's bucket for its shape (hits count here); None past the table
    block: np.ndarray  # [InputLayout.of(bucket).num_bytes] uint8
    input_ids: np.ndarray  # [bucket.num_tokens] int64
    position_ids: np.ndarray  # [bucket.num_tokens] int64
    token_type_ids: np.ndarray  # [bucket.num_tokens] int64
    seq_ids: np.ndarray  # [bucket.num_tokens] int64
    cu_seqlens: np.ndarray  # [bucket.num_seqs + 2] int32
    spans: "SpanIndex | None" = None  # span pooling (spans.py): unbucketed, eager; None: one row a sequence
    # several outputs (payload.py): their index, or what builds it after the launch; None: dense rows alone
    payload: "PayloadIndex | PayloadPlan | None" = None


def pad_batch(
    token_ids: np.ndarray,
    lengths: np.ndarray,
    token_type_ids: np.ndarray | None,
    bucket: Bucket | None,
    own_bucket: Bucket | None = None,
    payload: "PayloadIndex | PayloadPlan | None" = None,
) -> PaddedBatch:
    """Lay the batch out in `bucket` (None: its exact shape, unbucketed). `own_bucket` is the
    table's bucket for the batch when pad-up chose a larger one (default: `bucket`). A lone sequence
    in a small bucket copies its shape's layout (`_lone_layout`) and writes only its ids."""
    num_seqs, num_tokens = len(lengths), int(lengths.sum())
    is_bucketed = bucket is not None
    own_bucket = own_bucket or bucket
    bucket = bucket or Bucket(num_seqs, num_tokens)
    layout = InputLayout.of(bucket)
    if is_bucketed and num_seqs == 1 and bucket.num_tokens <= LONE_LAYOUT_MAX_TOKENS:
        block = _lone_layout(bucket, num_tokens).copy()
        ids, positions, types, seq_ids, cu_seqlens = layout.numpy_views(block)
        ids[:num_tokens] = token_ids
        if token_type_ids is not None:
            types[:num_tokens] = token_type_ids
    else:
        block = np.empty(layout.num_bytes, dtype=np.uint8)
        ids, positions, types, seq_ids, cu_seqlens = layout.numpy_views(block)
        _lay_out(token_ids, lengths, token_type_ids, bucket, (ids, positions, types, seq_ids, cu_seqlens))
    return PaddedBatch(
        num_seqs=num_seqs,
        num_tokens=num_tokens,
        bucket=bucket,
        is_bucketed=is_bucketed,
        own_bucket=own_bucket,
        block=block,
        input_ids=ids,
        position_ids=positions,
        token_type_ids=types,
        seq_ids=seq_ids,
        cu_seqlens=cu_seqlens,
        payload=payload,
    )


# A lone query's layout is the same for every query of its length: positions, sequence ids, offsets
# and padding copied from one made per (bucket, length), its ids written alone. Two numpy calls
# instead of a dozen: pad_batch 32 -> 14 µs on the development machine, on the critical path of every lone
# query's step (docs/benchmarks.md, a lone batch). Small buckets only: 512 layouts of at most 16 KB.
LONE_LAYOUT_MAX_TOKENS = 512


@functools.lru_cache(maxsize=512)
def _lone_layout(bucket: Bucket, num_tokens: int) -> np.ndarray:
    """The block of one sequence of `num_tokens` tokens in `bucket`, its ids and token types zero
    (read-only: `pad_batch` copies it)."""
    layout = InputLayout.of(bucket)
    block = np.empty(layout.num_bytes, dtype=np.uint8)
    lengths = np.array([num_tokens], np.int32)
    _lay_out(np.zeros(num_tokens, np.int64), lengths, None, bucket, layout.numpy_views(block))
    block.flags.writeable = False
    return block


def _lay_out(
    token_ids: np.ndarray,
    lengths: np.ndarray,
    token_type_ids: np.ndarray | None,
    bucket: Bucket,
    views: tuple[np.ndarray, ...],
) -> None:
    """Write the batch into its block's five views (pad_batch's general case)."""
    ids, positions, types, seq_ids, cu_seqlens = views
    num_seqs, num_tokens = len(lengths), int(lengths.sum())
    cu_seqlens.fill(bucket.num_tokens)
    cu_seqlens[0] = 0
    np.cumsum(lengths, out=cu_seqlens[1 : num_seqs + 1])
    seq_ids[num_tokens:] = num_seqs
    seq_ids[:num_tokens] = np.repeat(np.arange(num_seqs), lengths)
    positions[num_tokens:] = 0
    positions[:num_tokens] = np.arange(num_tokens) - cu_seqlens[seq_ids[:num_tokens]]
    ids[num_tokens:] = 0
    ids[:num_tokens] = token_ids
    if token_type_ids is None:
        types.fill(0)
    else:
        types[num_tokens:] = 0
        types[:num_tokens] = token_type_ids


def neutral_batch(bucket: Bucket) -> PaddedBatch:
    """A valid batch of the bucket's shape with no real sequence: one all-padding sequence, ids and
    positions 0 (what a capture runs on when no real batch is at hand)."""
    empty = np.zeros(0, dtype=np.int32)
    return pad_batch(empty, empty, None, bucket)


class Slot:
    """One batch's pinned host memory, one allocation sized for the largest bucket: its inputs'
    block, then its output rows."""

    def __init__(self, max_tokens: int, max_seqs: int, output_size: int) -> None:
        input_bytes = max_input_bytes(max_tokens, max_seqs)
        output_offset = -(-input_bytes // _ALIGN) * _ALIGN
        output_bytes = (max_seqs + 1) * output_size * 4
        self.pinned = torch.empty(output_offset + output_bytes, dtype=torch.uint8, pin_memory=True)
        self.inputs = self.pinned[:input_bytes]  # [32 * max_tokens + 4 * (max_seqs + 2)] uint8
        self._inputs_np = self.inputs.numpy()  # the same bytes, for the host-to-host memcpy
        # [max_seqs + 1, output_size] float32
        self.output = self.pinned[output_offset:].view(torch.float32).view(max_seqs + 1, output_size)
        # Per-bucket views, made once (a torch view costs microseconds on the step's path); touched
        # by the launcher thread only.
        self._prefixes: dict[Bucket, torch.Tensor] = {}
        self._cu_seqlens: dict[Bucket, torch.Tensor] = {}
        self._staged: dict[tuple[int, int], torch.Tensor] = {}

    @property
    def num_bytes(self) -> int:
        return self.pinned.numel()

    def stage(self, batch: PaddedBatch) -> None:
        """Copy the batch's block into this slot (one host-to-host memcpy; the device copy follows)."""
        self._inputs_np[: batch.block.nbytes] = batch.block

    def stage_index(self, batch: PaddedBatch, index: "PayloadIndex") -> tuple[int, int] | None:
        """Stage the batch's gather index (payload.py) in this slot's spare input bytes, right after
        the batch's block (8-aligned); returns its byte range, or None when the index does not fit
        (it then goes on its own)."""
        at = -(-batch.block.nbytes // 8) * 8
        end = at + index.index.nbytes
        if end > self.inputs.numel():
            return None
        self._inputs_np[at:end].view(np.int64)[:] = index.index
        return at, end

    def staged(self, start: int, end: int) -> torch.Tensor:
        """The slot's input bytes [start, end), pinned (a staged batch, its index), made once per range."""
        view = self._staged.get((start, end))
        if view is None:
            if len(self._staged) >= 4096:
                self._staged.clear()
            view = self._staged[start, end] = self.inputs[start:end]
        return view

    def prefix(self, bucket: Bucket) -> torch.Tensor:
        """The staged bytes of a batch of `bucket` [InputLayout.of(bucket).num_bytes] uint8, pinned."""
        view = self._prefixes.get(bucket)
        if view is None:
            view = self._prefixes[bucket] = self.inputs[: InputLayout.of(bucket).num_bytes]
        return view

    def cu_seqlens(self, bucket: Bucket) -> torch.Tensor:
        """The staged batch's int32 offsets [bucket.num_seqs + 2], pinned: what a per-batch
        attention plan reads on the host (flashinfer)."""
        view = self._cu_seqlens.get(bucket)
        if view is None:
            view = self._cu_seqlens[bucket] = InputLayout.of(bucket).host_cu_seqlens(self.inputs)
        return view


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

    @property
    def num_in_use(self) -> int:
        """Slots holding a batch in flight now (lens: safe without the lock)."""
        return len(self.slots) - len(self._free)

    @property
    def has_free(self) -> bool:
        """A slot is free now, so `acquire` would not block (a len: safe without the lock)."""
        return len(self._free) > 0

    def acquire(self) -> Slot:
        with self._cond:
            self._cond.wait_for(lambda: self._free)
            return self._free.pop()

    def release(self, slot: Slot) -> None:
        with self._cond:
            self._free.append(slot)
            self._cond.notify()
