"""A multi-output batch's answer: each sequence's outputs gathered from the flat block a
multi-output forward writes (heads.py) into its rows, as kembed/proto/outputs.py lays them out.

The index is built on the host when the batch is packed (numpy, a few arrays the size of the
batch's tokens); the gather runs on the device after the forward (a replay, or an eager run): one
row gather for the vectors (dense, ColBERT, token vectors: all of the rows' width) and one word
gather for the sparse weights, into a zeroed [num_rows, width] block.
"""

from dataclasses import dataclass

import numpy as np
import torch

from kembed.proto.outputs import COLBERT, DENSE, SPARSE, TOKENS, OutputShape


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """starts[i] + [0, counts[i]) for each i, back to back (int64)."""
    counts = counts.astype(np.int64)
    total = int(counts.sum())
    if total == 0:
        return np.empty(0, np.int64)
    firsts = np.cumsum(counts) - counts
    return np.repeat(starts.astype(np.int64) - firsts, counts) + np.arange(total, dtype=np.int64)


@dataclass(frozen=True)
class PayloadIndex:
    """Which flat-block rows and words make each row of a batch's answer."""

    num_rows: int  # rows of the answer
    width: int
    num_row_copies: int
    num_word_copies: int
    index: (
        np.ndarray
    )  # int64 [2 * num_row_copies + 2 * num_word_copies]: dst rows, src rows, dst words, src words

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
        lengths = lengths.astype(np.int64)
        outputs = np.where(outputs == 0, DENSE, outputs).astype(np.int64)
        width = shape.width
        rows = shape.rows_of(lengths, outputs)
        row_at = np.cumsum(rows) - rows  # each sequence's first answer row
        token_at = np.cumsum(lengths) - lengths  # each sequence's first token in the block
        # the flat block's row matrix: dense slots, then each vector output's tokens
        colbert_src = num_slots
        tokens_src = colbert_src + (num_tokens if has & COLBERT else 0)
        sparse_src = (tokens_src + (num_tokens if has & TOKENS else 0)) * width
        dst_rows, src_rows = [], []
        is_dense = (outputs & DENSE) > 0
        dst_rows.append(row_at[is_dense])
        src_rows.append(np.flatnonzero(is_dense))
        cursor = row_at + is_dense  # the next free row of each sequence
        for kind, src, count, skip in (
            (COLBERT, colbert_src, lengths - 1, 1),
            (TOKENS, tokens_src, lengths, 0),
        ):
            asks = (outputs & kind) > 0
            dst_rows.append(_ranges(cursor[asks], count[asks]))
            src_rows.append(_ranges(src + token_at[asks] + skip, count[asks]))
            cursor = cursor + np.where(asks, count, 0)
        asks = (outputs & SPARSE) > 0
        dst_words = _ranges(cursor[asks] * width, lengths[asks])
        src_words = _ranges(sparse_src + token_at[asks], lengths[asks])
        dst_all, src_all = np.concatenate(dst_rows), np.concatenate(src_rows)
        return cls(
            num_rows=int(rows.sum()),
            width=width,
            num_row_copies=len(dst_all),
            num_word_copies=len(dst_words),
            index=np.concatenate([dst_all, src_all, dst_words, src_words]),
        )


def to_device(index: PayloadIndex, device: torch.device) -> torch.Tensor:
    """The index on `device`. On a GPU it goes through pinned memory, so the copy is queued on the
    stream and the host goes on (a pageable copy would wait for the work ahead of it): call it
    before the forward, and the copy runs before it."""
    host = torch.from_numpy(index.index)
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def assemble(flat: torch.Tensor, index: PayloadIndex, idx: torch.Tensor | None = None) -> torch.Tensor:
    """The batch's answer [num_rows, width] float32 from its flat block (on the block's device, in
    its stream order; no host synchronisation). `idx`: the index already on the device (`to_device`)."""
    width, nr, nw = index.width, index.num_row_copies, index.num_word_copies
    if idx is None:
        idx = to_device(index, flat.device)
    payload = flat.new_zeros(index.num_rows, width)
    num_matrix_rows = flat.numel() // width
    matrix = flat[: num_matrix_rows * width].view(num_matrix_rows, width)
    payload[idx[:nr]] = matrix[idx[nr : 2 * nr]]
    if nw:
        payload.view(-1)[idx[2 * nr : 2 * nr + nw]] = flat[idx[2 * nr + nw :]]
    return payload
