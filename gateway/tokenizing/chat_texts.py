"""Texts through an embedder's chat template, tokenized as sentence-transformers 6 tokenizes them for a
SentenceTransformer whose Transformer takes messages (base/modules/transformer.py,
`_process_chat_messages`): each text one user message, the prompt a system message before it.

A text is the template's fixed texts around it (kembed.proto.chat_template, `text_pieces`, rendered
once per prompt), and that one string is tokenized without special tokens: the template writes its
own. Truncation is sentence-transformers': the rendered text cut to max_length on the tokenizer's
side, then the template's tail (`suffix`: the common token suffix of two renders with other texts,
e.g. `<|im_end|>` and its newline) written back over the last tokens of a row that reached
max_length, so a last-token pooling reads the token it was trained on. A text of more than
max_length tokens is tokenized only in a window (windows.py).

Functions of the tokenization threads (or inline for small requests); the Rust calls release the GIL.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from kembed.gateway.tokenizing.encode_groups import encode_each, ids_of
from kembed.gateway.tokenizing.windows import cut_windows
from kembed.proto.chat_template import ChatTemplate
from kembed.proto.model_files import Direction


class OverLongText(Exception):
    """Text `index` holds more than max_length tokens once rendered (no truncation)."""

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.index = index


@dataclass(frozen=True, slots=True)
class ChatTexts:
    """A template's fixed texts for one prompt, and what truncation restores of it."""

    head: str
    tail: str
    suffix: tuple[int, ...]  # the template's tail ids, restored over a truncated row's end
    num_template_tokens: int  # tokens of the template around an empty text: admission's estimate

    @staticmethod
    def of(template: ChatTemplate, prompt: str, untruncated: Tokenizer) -> ChatTexts:
        """ValueError for a template kembed cannot render texts with (chat_template.py). An empty
        prompt is no system message, as sentence-transformers adds one only for a prompt."""
        system = prompt or None
        head, tail = template.text_pieces(system)

        def ids(text: str) -> list[int]:
            return list(untruncated.encode(head + text + tail, add_special_tokens=False).ids)

        suffix: tuple[int, ...] = ()
        if template.restore_suffix:  # fillers that tokenize differently: their common tail is the template's
            first, second = ids("0"), ids("1 2 3 4")
            count = 0
            for left, right in zip(reversed(first), reversed(second), strict=False):
                if left != right:
                    break
                count += 1
            if 0 < count < min(len(first), len(second)):
                suffix = tuple(first[len(first) - count :])
        return ChatTexts(head, tail, suffix, len(ids("")))


def encode_chat_texts(
    untruncated: Tokenizer,
    chat: ChatTexts,
    texts: list[str],
    max_length: int | None,
    side: Direction,
    truncate: bool,
) -> list[np.ndarray]:
    """The ids of each text rendered through the template, in order; OverLongText for the first
    over max_length when not truncating."""
    windows = texts if max_length is None else cut_windows(untruncated, texts, max_length, side)
    if not truncate:
        for i, (window, text) in enumerate(zip(windows, texts, strict=True)):
            if len(window) < len(text):
                raise OverLongText(i)
    rendered = [chat.head + window + chat.tail for window in windows]
    rows = encode_each(untruncated, rendered, ids_of, add_special_tokens=False)
    ids = []
    for i, row in enumerate(rows):
        if max_length is not None and len(row) > max_length:
            if not truncate:
                raise OverLongText(i)
            row = row[len(row) - max_length :] if side == "left" else row[:max_length].copy()
        if max_length is not None and len(row) >= max_length and chat.suffix:
            keep = min(len(chat.suffix), len(row))
            row[len(row) - keep :] = chat.suffix[len(chat.suffix) - keep :]
        ids.append(row)
    return ids
