"""Padded batch shapes ("buckets") for CUDA graphs: a ragged batch runs in the smallest bucket that holds it.

Token counts pad up to multiples of 64 up to 1024 and of 256 above (a graph per 64 tokens where
batches are small and latency matters, coarser where padding is a small fraction); sequence counts
pad up to powers of two. Lookups index precomputed tables: no search on the hot path.

`BucketTable` also says which buckets batches can reach and in what order a start-up prewarm
captures them; `PadUpTable` maps a batch to the smallest *captured* bucket that holds it, so once
prewarm has run a batch whose own bucket has no graph replays a larger one instead of running eagerly.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, order=True)
class Bucket:
    """A padded batch shape. Every Python value a captured graph bakes in derives from these two."""

    num_seqs: int
    num_tokens: int

    def __str__(self) -> str:
        return f"{self.num_seqs}x{self.num_tokens}"

    @classmethod
    def parse(cls, text: str) -> "Bucket":
        """`"8x512"` → Bucket(8, 512); the form used on command lines and in the operator's spec."""
        seqs, _, tokens = text.strip().lower().partition("x")
        bucket = cls(int(seqs), int(tokens))
        if bucket.num_seqs < 1 or bucket.num_tokens < 1:
            raise ValueError(f"a bucket needs at least one sequence and one token, not {text!r}")
        return bucket

    @classmethod
    def parse_list(cls, text: str) -> tuple["Bucket", ...]:
        """`"1x128,8x512"` → the buckets in order, duplicates dropped; ValueError on a bad item."""
        return tuple(dict.fromkeys(cls.parse(item) for item in text.split(",") if item.strip()))


def token_sizes(
    max_tokens: int, fine_step: int = 64, fine_limit: int = 1024, coarse_step: int = 256
) -> list[int]:
    """Padded token counts up to (at least) max_tokens."""
    sizes = list(range(fine_step, min(fine_limit, max_tokens) + fine_step, fine_step))
    while sizes[-1] < max_tokens:
        sizes.append(sizes[-1] + coarse_step)
    return sizes


def _size_key(bucket: Bucket) -> tuple[int, int]:
    """What "smaller" means between buckets: fewer tokens (the work a replay does), then fewer
    sequences."""
    return bucket.num_tokens, bucket.num_seqs


class BucketTable:
    """Maps (num_seqs, num_tokens) to its Bucket, or None when the batch is larger than any bucket.

    `max_tokens` bounds any batch (a single sequence may be that long); `max_batch_tokens` bounds a
    batch of several sequences (the scheduler's token budget: it adds a sequence only while the sum
    stays within it), so buckets of several sequences above it are never reached and never prewarmed.
    """

    def __init__(self, max_tokens: int, max_seqs: int, max_batch_tokens: int | None = None) -> None:
        self.token_sizes = token_sizes(max_tokens)
        self.seq_sizes = [1 << i for i in range(max(max_seqs - 1, 0).bit_length() + 1)]
        self.max_tokens = self.token_sizes[-1]
        self.max_seqs = self.seq_sizes[-1]
        budget = max_tokens if max_batch_tokens is None else min(max_batch_tokens, max_tokens)
        self.max_batch_tokens = self.token_sizes[_ceil_index(self.token_sizes, budget)]  # as a bucket size
        # Index i holds the smallest size >= i, and that size's position in the list; [max + 1]
        # entries, built once.
        self._token_table, self._token_index = _ceil_tables(self.token_sizes)
        self._seq_table, self._seq_index = _ceil_tables(self.seq_sizes)

    def lookup(self, num_seqs: int, num_tokens: int) -> Bucket | None:
        if num_tokens > self.max_tokens or num_seqs > self.max_seqs:
            return None
        return Bucket(int(self._seq_table[num_seqs]), int(self._token_table[num_tokens]))

    def index(self, num_seqs: int, num_tokens: int) -> tuple[int, int] | None:
        """(row in seq_sizes, column in token_sizes) of the batch's bucket; None beyond the table."""
        if num_tokens > self.max_tokens or num_seqs > self.max_seqs:
            return None
        return int(self._seq_index[num_seqs]), int(self._token_index[num_tokens])

    def fits(self, bucket: Bucket) -> bool:
        """Whether the static buffers, sized for the largest bucket, can hold `bucket`."""
        return bucket.num_seqs <= self.max_seqs and bucket.num_tokens <= self.max_tokens

    def all(self) -> list[Bucket]:
        """Every bucket `lookup` can return: (S, T) needs a batch of more than S/2 sequences (fewer
        would land in S/2) with at least one token each, so T > S/2. Includes buckets only a direct
        caller reaches (several sequences past the batch budget)."""
        return [Bucket(s, t) for s in self.seq_sizes for t in self.token_sizes if 2 * t > s]

    def reachable(self) -> list[Bucket]:
        """Every bucket a scheduled batch can land in: one sequence up to `max_tokens`, several up to
        `max_batch_tokens`. What a start-up prewarm of `all` captures."""
        return [b for b in self.all() if b.num_seqs == 1 or b.num_tokens <= self.max_batch_tokens]

    def cover(self) -> list[Bucket]:
        """A few reachable buckets that hold every reachable batch within twice its own bucket's
        tokens: per sequence-count size, the smallest token size it can reach, then each next one
        the largest size at most twice the previous, up to the largest it can reach. A batch whose
        bucket lies between two of them pads to the upper one, at most 2x. Smallest first."""
        by_seqs: dict[int, list[int]] = {}
        for bucket in self.reachable():
            by_seqs.setdefault(bucket.num_seqs, []).append(bucket.num_tokens)
        cover = []
        for num_seqs, sizes in by_seqs.items():  # each list ascending, as token_sizes is
            picked = [sizes[0]]
            while picked[-1] < sizes[-1]:
                picked.append(max(t for t in sizes if t <= 2 * picked[-1]))
            cover += [Bucket(num_seqs, t) for t in picked]
        return sorted(cover, key=_size_key)

    def prewarm_order(self, first: Iterable[Bucket] = ()) -> list[Bucket]:
        """Every reachable bucket in the order a start-up prewarm captures them: `first` (the hot
        list; those that fit the table), then the cover (after it every batch has a graph at most
        2x its bucket), then the rest, smallest first. A budget that runs out cuts the tail."""
        fitting = [b for b in first if self.fits(b)]
        ordered = dict.fromkeys([*fitting, *self.cover(), *sorted(self.reachable(), key=_size_key)])
        return list(ordered)


class PadUpTable:
    """(num_seqs, num_tokens) → the smallest captured bucket that holds the batch's own bucket, so
    any batch of that shape (fewest tokens, then fewest sequences), or None when none does.

    Built from the captured set over the BucketTable's grid, in one pass from the largest cell down:
    a cell's answer is the smallest of its own captured buckets and its two larger neighbours'
    answers, since every bucket holding a cell's batches holds a neighbour's or sits in the cell.
    Rebuilt when a capture is added (hundreds of cells, microseconds); a lookup indexes it. A captured
    bucket off the grid (an admin prewarm of e.g. 3x100) sits in the largest cell it holds.
    """

    def __init__(self, table: BucketTable, captured: Iterable[Bucket] = ()) -> None:
        self._table = table
        rows, cols = len(table.seq_sizes), len(table.token_sizes)
        own: list[list[Bucket | None]] = [[None] * cols for _ in range(rows)]
        for bucket in captured:
            cell = _floor_cell(table, bucket)
            if cell is not None:
                i, j = cell
                current = own[i][j]
                if current is None or _size_key(bucket) < _size_key(current):
                    own[i][j] = bucket
        best: list[list[Bucket | None]] = [[None] * (cols + 1) for _ in range(rows + 1)]
        for i in range(rows - 1, -1, -1):
            for j in range(cols - 1, -1, -1):
                candidates = [b for b in (own[i][j], best[i + 1][j], best[i][j + 1]) if b is not None]
                best[i][j] = min(candidates, key=_size_key) if candidates else None
        self._best = best

    def lookup(self, num_seqs: int, num_tokens: int) -> Bucket | None:
        cell = self._table.index(num_seqs, num_tokens)
        return None if cell is None else self._best[cell[0]][cell[1]]


def _floor_cell(table: BucketTable, bucket: Bucket) -> tuple[int, int] | None:
    """The largest grid cell whose batches `bucket` holds; None if it holds none (or is beyond)."""
    if not table.fits(bucket):
        return None
    i = _floor_index(table.seq_sizes, bucket.num_seqs)
    j = _floor_index(table.token_sizes, bucket.num_tokens)
    return None if i < 0 or j < 0 else (i, j)


def _floor_index(sizes: Sequence[int], value: int) -> int:
    return max((k for k, size in enumerate(sizes) if size <= value), default=-1)


def _ceil_index(sizes: Sequence[int], value: int) -> int:
    return next(k for k, size in enumerate(sizes) if size >= value)


def _ceil_tables(sizes: list[int]) -> tuple[np.ndarray, np.ndarray]:
    table = np.empty(sizes[-1] + 1, dtype=np.int64)
    index = np.empty(sizes[-1] + 1, dtype=np.int64)
    low = 0
    for k, size in enumerate(sizes):
        table[low : size + 1] = size
        index[low : size + 1] = k
        low = size + 1
    return table, index
