"""A multi-output batch's answer: each sequence's outputs gathered from the flat block a
multi-output forward writes (heads.FlatLayout) into its rows, as kembed/proto/outputs.py lays them out.

The index is built on the host when the batch is packed: a dozen numpy calls whatever the batch's
size, and fewer when every sequence asks the same outputs (the masks are then scalars); a batch of
one sequence reuses the index built for its length, outputs and bucket the first time. On the
device the answer is two gathers after the forward (a replay, or an eager run), nothing zeroed:
one `index_select` of a source row for every answer row (dense, ColBERT, token vectors; a sparse
or padding row takes one of the flat block's zero rows), then one `index_copy_` of the sparse
weights into their rows (a batch of one: a slice copy, its weights being one run). The CUDA
engine stages a batch of one's index after its inputs, so the one input copy carries it; a larger
batch's index is built and copied while its graph runs (`PayloadPlan`). Zeroing a
block, advanced-index assignments and an index per output kind cost host time in every batch,
which is what the dense step is compared against (docs/benchmarks.md, BGE-M3's sparse and ColBERT
outputs).
"""

import functools
from dataclasses import dataclass

import numpy as np
import torch

from kembed.proto.outputs import COLBERT, DENSE, SPARSE, TOKENS, OutputShape


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """starts[i] + [0, counts[i]) for each i, back to back (int64)."""
    total = int(counts.sum())
    firsts = np.cumsum(counts) - counts
    return np.repeat(starts - firsts, counts) + np.arange(total, dtype=np.int64)


def zero_rows(num_tokens: int, width: int) -> int:
    """Zero rows the flat block of `num_tokens` tokens ends its row matrix with: as many as one
    sequence's sparse weights take (a row source for every answer row, none zeroed apart)."""
    return -(-num_tokens // width)


@dataclass(frozen=True)
class PayloadIndex:
    """Which flat-block rows and words make each row of a batch's answer."""

    num_rows: int  # rows of the answer
    width: int
    num_words: int  # sparse weights copied
    has: int  # the kinds the flat block holds (what the forward is asked for)
    # int64 [num_rows + 2 * num_words]: each answer row's source row, then the sparse weights'
    # destination words in the answer and source words in the flat block
    index: np.ndarray
    # (destination word, source word) of the sparse weights when they are one run each (a batch
    # of one): one slice copy on the device instead of a gather and a scatter
    sparse_run: tuple[int, int] | None = None

    @classmethod
    def build(
        cls,
        lengths: np.ndarray,  # [num_seqs] tokens of each real sequence
        outputs: np.ndarray,  # [num_seqs] uint8: each sequence's Output bitmask (0: dense alone)
        shape: OutputShape,
        has: int,  # the kinds the flat block holds (the model's)
        num_slots: int,  # sequence slots of the flat block's dense rows
        num_tokens: int,  # tokens of the flat block
    ) -> "PayloadIndex":
        width, num_seqs = shape.width, len(lengths)
        if num_seqs == 1:  # a query alone: built once per length, outputs and bucket, then reused
            return _one(int(lengths[0]), int(outputs[0]) or DENSE, width, has, num_slots, num_tokens)
        lengths = lengths.astype(np.int64)
        masks: np.ndarray | int = np.where(outputs == 0, DENSE, outputs).astype(np.int64)
        if num_seqs and (masks == masks[0]).all():  # type: ignore[index]
            masks = int(masks[0])  # type: ignore[index]  # the fast path: scalars below
        colbert_src, tokens_src, zeros_src, sparse_src = _sources(has, num_slots, num_tokens, width)
        token_at = np.cumsum(lengths) - lengths  # each sequence's first token in the block
        is_dense, is_colbert, is_tokens, is_sparse = (
            (masks & kind) > 0 for kind in (DENSE, COLBERT, TOKENS, SPARSE)
        )
        num_sparse = is_sparse * lengths  # words
        # per sequence four runs of source rows: its dense slot, ColBERT tokens 1.., token vectors,
        # zero rows for its sparse weights (the rows of proto/outputs.py in its order)
        counts = np.empty((num_seqs, 4), np.int64)
        counts[:, 0] = is_dense
        counts[:, 1] = is_colbert * (lengths - 1)
        counts[:, 2] = is_tokens * lengths
        counts[:, 3] = -(-num_sparse // width)
        starts = np.empty((num_seqs, 4), np.int64)
        starts[:, 0] = np.arange(num_seqs)
        starts[:, 1] = colbert_src + token_at + 1
        starts[:, 2] = tokens_src + token_at
        starts[:, 3] = zeros_src
        src_rows = _ranges(starts.ravel(), counts.ravel())
        rows = counts.sum(1)
        sparse_at = (np.cumsum(rows) - counts[:, 3]) * width  # each sequence's first sparse word
        if isinstance(masks, int):
            asks: slice | np.ndarray = slice(None) if is_sparse else slice(0)
        else:
            asks = np.flatnonzero(is_sparse)
        lengths, sparse_at = lengths[asks], sparse_at[asks]
        dst_words = _ranges(sparse_at, lengths)
        src_words = dst_words + np.repeat(sparse_src + token_at[asks] - sparse_at, lengths)
        return cls(
            num_rows=len(src_rows),
            width=width,
            num_words=len(dst_words),
            has=has,
            index=np.concatenate([src_rows, dst_words, src_words]),
        )

    @classmethod
    def _build_one(
        cls, length: int, mask: int, width: int, has: int, num_slots: int, num_tokens: int
    ) -> "PayloadIndex":
        """`build` for a batch of one sequence."""
        colbert_src, tokens_src, zeros_src, sparse_src = _sources(has, num_slots, num_tokens, width)
        num_sparse = length if mask & SPARSE else 0
        parts = [
            np.zeros(1 if mask & DENSE else 0, np.int64),  # its dense slot, 0
            np.arange(colbert_src + 1, colbert_src + length if mask & COLBERT else 0, dtype=np.int64),
            np.arange(tokens_src, tokens_src + length if mask & TOKENS else 0, dtype=np.int64),
            np.full(-(-num_sparse // width), zeros_src, np.int64),
        ]
        num_rows = sum(len(p) for p in parts)
        sparse_at = (num_rows - len(parts[3])) * width
        parts.append(np.arange(sparse_at, sparse_at + num_sparse, dtype=np.int64))
        parts.append(np.arange(sparse_src, sparse_src + num_sparse, dtype=np.int64))
        # shared by every batch of this shape (`_one`): read, never written (staged by copying)
        index = np.concatenate(parts)
        return cls(num_rows, width, num_sparse, has, index, (sparse_at, sparse_src))


# A batch of one is the latency case: its index depends only on these six numbers (a few thousand
# combinations: lengths up to the bucket table's, a handful of output masks), so it is built once.
# On the GPU host a fresh build (nine numpy calls, cold after the step's sleep) is a measurable part
# of what the extra outputs add to a query's step (docs/benchmarks.md).
_one = functools.lru_cache(maxsize=8192)(PayloadIndex._build_one)


@dataclass(frozen=True)
class PayloadPlan:
    """A batch's outputs whose index is not built yet: `PayloadIndex.build`'s arguments. The CUDA
    engine builds it once the batch's graph is launched, while the device runs it, so its host time
    (a few dozen numpy calls on a batch of several sequences) stays off the step's critical path."""

    lengths: np.ndarray
    outputs: np.ndarray
    shape: OutputShape
    has: int
    num_slots: int
    num_tokens: int

    def build(self) -> PayloadIndex:
        return PayloadIndex.build(
            self.lengths, self.outputs, self.shape, self.has, self.num_slots, self.num_tokens
        )


def _sources(has: int, num_slots: int, num_tokens: int, width: int) -> tuple[int, int, int, int]:
    """The flat block's row matrix (heads.FlatLayout): where its ColBERT rows, token rows and zero
    rows start (rows), and its sparse weights (words)."""
    colbert_src = num_slots
    tokens_src = colbert_src + (num_tokens if has & COLBERT else 0)
    zeros_src = tokens_src + (num_tokens if has & TOKENS else 0)
    return colbert_src, tokens_src, zeros_src, (zeros_src + zero_rows(num_tokens, width)) * width


def to_device(index: PayloadIndex, device: torch.device) -> torch.Tensor:
    """The index on `device`, on its own (eager batches, and an index too large to ride with the
    inputs: cuda_engine.StaticInputs.load_index). On a GPU it goes through pinned memory, so the
    copy is queued on the stream and the host goes on (a pageable copy would wait for the work
    ahead of it): call it before the forward, and the copy runs before it."""
    host = torch.from_numpy(index.index)
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def assemble(flat: torch.Tensor, index: PayloadIndex, idx: torch.Tensor | None = None) -> torch.Tensor:
    """The batch's answer [num_rows, width] float32 from its flat block (on the block's device, in
    its stream order; no host synchronisation). `idx`: the index already on the device (`to_device`)."""
    width, nr, nw = index.width, index.num_rows, index.num_words
    if idx is None:
        idx = to_device(index, flat.device)
    num_matrix_rows = flat.numel() // width
    matrix = flat[: num_matrix_rows * width].view(num_matrix_rows, width)
    payload = matrix.index_select(0, idx[:nr])
    if nw and index.sparse_run is not None:
        dst, src = index.sparse_run
        payload.view(-1)[dst : dst + nw].copy_(flat[src : src + nw])
    elif nw:
        payload.view(-1).index_copy_(0, idx[nr : nr + nw], flat.index_select(0, idx[nr + nw :]))
    return payload
