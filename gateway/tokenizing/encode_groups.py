"""Encoding with the Rust `tokenizers` library a bounded group of texts at a time.

An `Encoding` holds ~130-160 bytes per token (ids, type ids, token strings, offsets, masks, word
ids), and a batch's peak while it is encoded is higher still (the normalized strings and their
alignments). A request's texts encoded in one batch therefore cost memory per token, not per
character of the answer: 8 MiB of CJK text (one token per character, where English has ~4
characters a token) held ~360 MiB of Encodings at once. Here the texts go to the library in groups
of at most `MAX_GROUP_CHARS` characters, and what the caller keeps of each Encoding (an int32 array,
a count) is taken before the next group is encoded, so at most one group's Encodings are alive.

Functions of the tokenization threads (or inline for small requests); the Rust calls release the GIL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import numpy as np
from tokenizers import Encoding, Tokenizer

_T = TypeVar("_T")

# `encode_batch` hands its texts to the library's rayon thread pool (a thread per core), whose threads
# spin after each job before they sleep: on a 16-core host a batch of 4 short queries cost 1.1 ms of
# CPU that way against 0.13 ms encoded one by one on the calling thread (same ids). A batch up to
# this many characters is encoded on the calling thread; a larger one is worth the pool's cores.
SERIAL_MAX_CHARS = 2048

# At most ~32,000 tokens (CJK) or ~8,000 (English) in Encodings at once per tokenization thread:
# ~5-13 MB while the group is encoded, and still hundreds of texts a call for the library's threads.
MAX_GROUP_CHARS = 1 << 15


def _num_chars(item: Any) -> int:
    return len(item) if isinstance(item, str) else len(item[0]) + len(item[1])


def encode(
    tokenizer: Tokenizer, items: Sequence[Any], *, add_special_tokens: bool = True, offsets: bool = False
) -> list[Encoding]:
    """tokenizer's Encodings of `items` (texts, or (text, pair) tuples), in order, in one call;
    char offsets only where `offsets` asks (a large batch skips computing them otherwise)."""
    if sum(map(_num_chars, items)) > SERIAL_MAX_CHARS:
        batch = tokenizer.encode_batch if offsets else tokenizer.encode_batch_fast
        return batch(items, add_special_tokens=add_special_tokens)
    return [
        tokenizer.encode(item, add_special_tokens=add_special_tokens)
        if isinstance(item, str)
        else tokenizer.encode(item[0], item[1], add_special_tokens=add_special_tokens)
        for item in items
    ]


def groups(items: Sequence[Any], max_chars: int = MAX_GROUP_CHARS) -> Iterator[tuple[int, int]]:
    """[start, stop) ranges of consecutive `items` of at most `max_chars` characters together (a
    longer item alone), covering all of them in order."""
    start, num_chars = 0, 0
    for i, item in enumerate(items):
        size = _num_chars(item)
        if i > start and num_chars + size > max_chars:
            yield start, i
            start, num_chars = i, 0
        num_chars += size
    if start < len(items):
        yield start, len(items)


def encode_each(
    tokenizer: Tokenizer,
    items: Sequence[Any],
    keep: Callable[[Encoding], _T],
    *,
    add_special_tokens: bool = True,
    offsets: bool = False,
) -> list[_T]:
    """`keep(encoding)` of each item's Encoding, in order, encoding a group at a time (above)."""
    kept: list[_T] = []
    for start, stop in groups(items):
        encoded = encode(tokenizer, items[start:stop], add_special_tokens=add_special_tokens, offsets=offsets)
        kept.extend(map(keep, encoded))
    return kept


def ids_of(encoding: Encoding) -> np.ndarray:
    """An Encoding's ids as an int32 array (4 bytes a token, where the Encoding holds ~150)."""
    return np.asarray(encoding.ids, dtype=np.int32)


def num_ids(encoding: Encoding) -> int:
    return len(encoding.ids)
