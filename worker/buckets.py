"""Padded batch shapes ("buckets") for CUDA graphs: a ragged batch runs in the smallest bucket that holds it.

Token counts pad up to multiples of 64 up to 1024 and of 256 above (a graph per 64 tokens where
batches are small and latency matters, coarser where padding is a small fraction); sequence counts
pad up to powers of two. Lookups index precomputed tables: no search on the hot path.
"""

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
        seqs, _, tokens = text.lower().partition("x")
        return cls(int(seqs), int(tokens))


def token_sizes(max_tokens: int, fine_step: int = 64, fine_limit: int = 1024, coarse_step: int = 256):
    """Padded token counts up to (at least) max_tokens."""
    sizes = list(range(fine_step, min(fine_limit, max_tokens) + fine_step, fine_step))
    while sizes[-1] < max_tokens:
        sizes.append(sizes[-1] + coarse_step)
    return sizes


class BucketTable:
    """Maps (num_seqs, num_tokens) to its Bucket, or None when the batch is larger than any bucket."""

    def __init__(self, max_tokens: int, max_seqs: int) -> None:
        self.token_sizes = token_sizes(max_tokens)
        self.seq_sizes = [1 << i for i in range(max(max_seqs - 1, 0).bit_length() + 1)]
        self.max_tokens = self.token_sizes[-1]
        self.max_seqs = self.seq_sizes[-1]
        # Index i holds the smallest size >= i; [max + 1] entries, built once.
        self._token_table = _ceil_table(self.token_sizes)
        self._seq_table = _ceil_table(self.seq_sizes)

    def lookup(self, num_seqs: int, num_tokens: int) -> Bucket | None:
        if num_tokens > self.max_tokens or num_seqs > self.max_seqs:
            return None
        return Bucket(int(self._seq_table[num_seqs]), int(self._token_table[num_tokens]))

    def all(self) -> list[Bucket]:
        """Every bucket that can hold a real batch (at most one sequence per token)."""
        return [Bucket(s, t) for s in self.seq_sizes for t in self.token_sizes if s <= t]


def _ceil_table(sizes: list[int]) -> np.ndarray:
    table = np.empty(sizes[-1] + 1, dtype=np.int64)
    low = 0
    for size in sizes:
        table[low : size + 1] = size
        low = size + 1
    return table
