"""Documents for late chunking: a document's chunks tokenized apart, joined into one sequence.

Each chunk is tokenized without special tokens; the chunks' ids are concatenated in order, after the
model's default prompt (if one is configured) and inside the special tokens of the tokenizer's
single-sequence template (`[CLS] ... [SEP]` for BERT, `<s> ... </s>` for RoBERTa, an EOS after for
Qwen3), learnt by post-processing one short text as `_PairTemplate` learns the pair's. The span of
chunk j is its own tokens, [bounds[j], bounds[j + 1]); the prompt and the special tokens are in no
span. Runs on the tokenization threads (or inline for small requests).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from kembed.gateway.tokenizing.encode_groups import encode_each, ids_of


@dataclass(frozen=True)
class SingleTemplate:
    """The special tokens a tokenizer's post-processor puts before and after one sequence."""

    prefix: list[int]
    suffix: list[int]

    @staticmethod
    def of(untruncated: Tokenizer) -> SingleTemplate:
        plain = untruncated.encode("a", add_special_tokens=False)
        out = untruncated.post_process(plain, None, add_special_tokens=True)
        prefix: list[int] = []
        suffix: list[int] = []
        num_plain = 0
        for token, special in zip(out.ids, out.special_tokens_mask, strict=True):
            if special:
                (prefix if num_plain == 0 else suffix).append(token)
            else:
                num_plain += 1
        return SingleTemplate(prefix, suffix)


class OverLongDocument(Exception):
    """Document `index` has `num_tokens` tokens, more than the limit (None: not all counted)."""

    def __init__(self, index: int, num_tokens: int | None) -> None:
        super().__init__(index, num_tokens)
        self.index = index
        self.num_tokens = num_tokens


class EmptyChunk(Exception):
    """Chunk `chunk` of document `document` has no tokens (whitespace only, say)."""

    def __init__(self, document: int, chunk: int) -> None:
        super().__init__(document, chunk)
        self.document = document
        self.chunk = chunk


def encode_documents(
    untruncated: Tokenizer,
    template: SingleTemplate,
    documents: Sequence[Sequence[str]],
    prompt: str,
    max_tokens: int,
    max_chars: int,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(int32 ids, int64 span bounds [num_chunks + 1]) of each document. A document of more than
    `max_chars` characters is refused before it is tokenized (no text of `max_tokens` tokens is
    that long here: `windows.most_chars`), one of more than `max_tokens` tokens once counted."""
    for i, chunks in enumerate(documents):
        if sum(len(chunk) for chunk in chunks) > max_chars:
            raise OverLongDocument(i, None)
    prompt_ids = untruncated.encode(prompt, add_special_tokens=False).ids if prompt else []
    head = np.asarray([*template.prefix, *prompt_ids], dtype=np.int32)
    suffix = np.asarray(template.suffix, dtype=np.int32)
    flat = [chunk for chunks in documents for chunk in chunks]
    # a group of chunks at a time, each kept as int32 (encode_groups.py): 8 MiB of CJK chunks would
    # otherwise be ~2.8 million tokens in Encodings at once (~1 GB while encoded)
    encoded = encode_each(untruncated, flat, ids_of, add_special_tokens=False)
    ids_out: list[np.ndarray] = []
    bounds_out: list[np.ndarray] = []
    position = 0
    for i, chunks in enumerate(documents):
        pieces = encoded[position : position + len(chunks)]
        position += len(chunks)
        for j, piece in enumerate(pieces):
            if not len(piece):
                raise EmptyChunk(i, j)
        num_tokens = len(head) + sum(len(piece) for piece in pieces) + len(suffix)
        if num_tokens > max_tokens:
            raise OverLongDocument(i, num_tokens)
        ids_out.append(np.concatenate([head, *pieces, suffix]))
        bounds_out.append(np.cumsum([len(head), *(len(piece) for piece in pieces)], dtype=np.int64))
    return ids_out, bounds_out
