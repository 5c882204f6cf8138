"""(query, document) pairs through an LLM reranker's chat template, tokenized as sentence-transformers
6 tokenizes them for its CrossEncoder (base/modules/transformer.py, `_process_chat_messages`).

Each pair is the template's fixed texts around its two contents (kembed.proto.chat_template), and
that one string is tokenized without special tokens: the template writes its own. A string is
tokenized whole, never as pieces joined: a byte-level BPE gives the space before a word to the word,
so "<Query>: " then "paris" is not "<Query>: paris". Truncation is sentence-transformers': the
rendered pair truncated to max_length on the tokenizer's side, then the template's tail (its
`suffix`: the common token suffix of two renders with other contents, the assistant turn a reranker
reads its answer after) written back over the last tokens of a row that reached max_length, so the
last token stays the one the score is read at. A side of more than max_length tokens is tokenized
only in a window (windows.py); without truncation a pair over max_length is refused.

Functions of the tokenization threads (or inline for small requests); the Rust calls release the GIL.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from kembed.gateway.tokenizing.encode_groups import encode_each, ids_of
from kembed.gateway.tokenizing.windows import cut_windows
from kembed.proto.chat_template import ChatTemplate, PairPieces
from kembed.proto.model_files import Direction


class OverLongPair(Exception):
    """The pair of the query and text `index` holds more than max_length tokens (no truncation)."""

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.index = index


@dataclass(frozen=True, slots=True)
class ChatPairs:
    """A template's pieces for one system prompt, and what truncation restores of it."""

    pieces: PairPieces
    suffix: tuple[int, ...]  # the template's tail ids, restored over a truncated row's end
    num_template_tokens: int  # tokens of the template alone (a pair of empty texts): admission's estimate

    @staticmethod
    def of(template: ChatTemplate, system: str | None, untruncated: Tokenizer) -> ChatPairs:
        """ValueError for a template kembed cannot render pairs with (chat_template.py)."""
        pieces = template.pieces(system)

        def ids(query: str, document: str) -> list[int]:
            rendered = template.render(query, document, system)
            return list(untruncated.encode(rendered, add_special_tokens=False).ids)

        suffix: tuple[int, ...] = ()
        if template.restore_suffix:  # fillers that tokenize differently: their common tail is the template's
            first, second = ids("0", "0"), ids("1 2 3 4", "1 2 3 4")
            count = 0
            for left, right in zip(reversed(first), reversed(second), strict=False):
                if left != right:
                    break
                count += 1
            if 0 < count < min(len(first), len(second)):
                suffix = tuple(first[len(first) - count :])
        return ChatPairs(pieces, suffix, len(ids("", "")))


def encode_chat_pairs(
    untruncated: Tokenizer,
    chat: ChatPairs,
    query: str,
    texts: list[str],
    max_length: int | None,
    side: Direction,
    truncate: bool,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Ids and (all zero) type ids of each templated (query, text) pair, in order."""
    items = [query, *texts]
    windows = items if max_length is None else cut_windows(untruncated, items, max_length, side)
    if not truncate and any(len(w) < len(t) for w, t in zip(windows, items, strict=True)):
        cut = next(i for i, (w, t) in enumerate(zip(windows, items, strict=True)) if len(w) < len(t))
        raise OverLongPair(max(cut - 1, 0))  # that side alone holds more than max_length tokens
    rendered = [chat.pieces.join(windows[0], window) for window in windows[1:]]
    rows = encode_each(untruncated, rendered, ids_of, add_special_tokens=False)
    ids = []
    for i, row in enumerate(rows):
        if max_length is not None and len(row) > max_length:
            if not truncate:
                raise OverLongPair(i)
            row = row[len(row) - max_length :] if side == "left" else row[:max_length].copy()
        if max_length is not None and len(row) >= max_length and chat.suffix:
            keep = min(len(chat.suffix), len(row))
            row[len(row) - keep :] = chat.suffix[len(chat.suffix) - keep :]
        ids.append(row)
    return ids, [np.zeros(len(row), np.int32) for row in ids]
