"""What makes a request's sequences unservable, checked on plain arrays (a unary call's TokenBatch or
one request of a data-port frame): torch-free and proto-free, so both edges say the same thing.

Each check returns a message for the caller (InvalidInput, INVALID_ARGUMENT on the wire), or None.
A frame checks all its requests at once with `frame_is_clean` and looks for the culprits with these
only when that fails.
"""

from __future__ import annotations

import numpy as np

from kembed.worker.errors import InvalidInput
from kembed.worker.info import ModelInfo


def sequences_problem(token_ids: np.ndarray, lengths: np.ndarray, info: ModelInfo) -> str | None:
    """What is wrong with one request's ragged sequences (ids back to back), or None."""
    if len(lengths) == 0:
        return "the batch holds no sequences"
    if lengths.min() < 1:
        return f"sequence {int(lengths.argmin())} is empty"
    if lengths.max() > info.max_sequence_length:
        i = int(lengths.argmax())
        return (
            f"sequence {i} has {int(lengths[i])} tokens; the model takes at most {info.max_sequence_length}"
        )
    if int(lengths.sum()) != len(token_ids):
        return f"lengths add up to {int(lengths.sum())} but {len(token_ids)} token ids were sent"
    bad = (token_ids < 0) | (token_ids >= info.vocab_size)
    if bad.any():
        i = int(bad.argmax())
        return f"token id {int(token_ids[i])} at position {i} is outside [0, {info.vocab_size})"
    return None


def token_types_problem(types: np.ndarray) -> str | None:
    """Only 0 and 1: a pair has two segments, and an id past the model's token-type table must
    never reach an embedding lookup on the device."""
    bad = (types < 0) | (types > 1)
    if bad.any():
        i = int(bad.argmax())
        return f"token type id {int(types[i])} at position {i} is not 0 or 1"
    return None


def frame_is_clean(
    num_sequences: np.ndarray,
    lengths: np.ndarray,
    token_ids: np.ndarray,
    types: np.ndarray | None,
    info: ModelInfo,
) -> bool:
    """Whether every request of a frame passes the checks above (a handful of reductions)."""
    return bool(
        num_sequences.min(initial=1) >= 1
        and lengths.min(initial=1) >= 1
        and lengths.max(initial=0) <= info.max_sequence_length
        and token_ids.min(initial=0) >= 0
        and token_ids.max(initial=0) < info.vocab_size
        and (types is None or ((types == 0) | (types == 1)).all())
    )


def spans_of(counts: np.ndarray, bounds: np.ndarray, lengths: np.ndarray) -> list[np.ndarray | None] | None:
    """Per sequence, None (pooled as usual) or its span boundaries (int64 [k + 1]); None for the whole
    request when it asks for no span pooling. Raises InvalidInput unless there is one count per
    sequence, as many boundaries as the counts say, and each sequence's strictly increasing and
    within it."""
    if not len(counts) and not len(bounds):
        return None
    counts = counts.astype(np.int64)
    bounds = bounds.astype(np.int64)
    if len(counts) != len(lengths):
        raise InvalidInput(f"num_spans has {len(counts)} values for {len(lengths)} sequences")
    if not counts.any():  # every sequence pooled as usual
        return None
    expected = int((counts + 1)[counts > 0].sum())
    if len(bounds) != expected:
        raise InvalidInput(f"span_bounds has {len(bounds)} values; num_spans asks for {expected}")
    spans: list[np.ndarray | None] = []
    start = 0
    for i, (count, length) in enumerate(zip(counts.tolist(), lengths.tolist(), strict=True)):
        if count == 0:
            spans.append(None)
            continue
        own = bounds[start : start + count + 1]
        start += count + 1
        if (np.diff(own) <= 0).any():
            raise InvalidInput(f"the span bounds of sequence {i} are not strictly increasing: {own.tolist()}")
        if own[-1] > length:
            raise InvalidInput(
                f"sequence {i} has {length} tokens, its last span ends at {int(own[-1])}: out of range"
            )
        spans.append(own)
    return spans
