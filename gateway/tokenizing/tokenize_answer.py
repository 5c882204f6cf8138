"""TEI's `/tokenize` answer, built as JSON bytes a piece of text at a time, under a token cap.

/tokenize answers every token of its texts, untruncated, so what it costs grows with its tokens, and a
character cap bounds tokens badly: CJK text is about a token a character, English ~4 characters a
token. Built whole, 262,000 CJK characters (one request within the character cap) made an Encoding
of 262,002 tokens, its attributes as Python lists, a dict per token and 18 MB of JSON: +281 MiB at
peak, most of it kept by glibc afterwards. Here:

- each text is cut into pieces of at most `PIECE_CHARS` characters, between two of the tokenizer's
  words as a truncation window is cut (windows.py: the pieces' tokens are the whole text's, but for a
  word longer than a piece, cut inside), and pieces are encoded a group of at most `PIECE_CHARS`
  characters at a time, without special tokens;
- each group's tokens become JSON at once (orjson over that group's rows only) and are appended to
  the answer, the single-sequence template's special tokens (`[CLS]`, `[SEP]`, ...) put around each
  text as the post-processor puts them;
- tokens are counted as they come, and past `max_tokens` (all texts together) the request is
  refused (`TooManyTokens`) without encoding the rest.

So a request holds its answer (~60-100 bytes a token, bounded by the cap) and one group's Encodings
and rows (~10 MB at most). Runs on the tokenization threads (or inline for small requests).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from tokenizers import Encoding, Tokenizer

from kembed.gateway.tokenizing.documents import SingleTemplate
from kembed.gateway.tokenizing.encode_groups import encode
from kembed.gateway.tokenizing.windows import prefix_end

PIECE_CHARS = 1 << 14


class TooManyTokens(Exception):
    """The texts hold more than the cap: `num_tokens` counted through text `index` when it passed."""

    def __init__(self, index: int, num_tokens: int) -> None:
        super().__init__(index, num_tokens)
        self.index = index
        self.num_tokens = num_tokens


@dataclass(frozen=True)
class SpecialRows:
    """The JSON rows of the special tokens the post-processor puts before and after one text."""

    prefix: bytes  # comma-separated rows, no brackets; b"" if none
    suffix: bytes
    num_tokens: int

    @staticmethod
    def of(untruncated: Tokenizer) -> SpecialRows:
        template = SingleTemplate.of(untruncated)

        def rows(ids: list[int]) -> bytes:
            described = [
                # Like TEI: a special token has no span in the input.
                {"id": i, "text": untruncated.id_to_token(i), "special": True, "start": None, "stop": None}
                for i in ids
            ]
            return orjson.dumps(described)[1:-1]

        return SpecialRows(
            rows(template.prefix), rows(template.suffix), len(template.prefix + template.suffix)
        )


def pieces(untruncated: Tokenizer, text: str, max_chars: int = PIECE_CHARS) -> Iterator[tuple[int, int]]:
    """[start, stop) of each piece of `text`, in order, cut as `windows.count_tokens` cuts, found
    as they are asked for; at least one (an empty text is one empty piece)."""
    start = 0
    while True:
        stop = len(text)
        if stop - start > max_chars:
            stop = start + prefix_end(untruncated, text[start : start + max_chars + 1], max_chars)
        yield start, stop
        start = stop
        if start >= len(text):
            return


def _groups(untruncated: Tokenizer, texts: Sequence[str], max_chars: int) -> Iterator[list[tuple[int, str]]]:
    """The texts' pieces as (text index, piece), in order, in groups of at most `max_chars`
    characters (a longer piece alone), each group found only once the one before is encoded."""
    group: list[tuple[int, str]] = []
    num_chars = 0
    for i, text in enumerate(texts):
        for start, stop in pieces(untruncated, text):
            if group and num_chars + stop - start > max_chars:
                yield group
                group, num_chars = [], 0
            group.append((i, text[start:stop]))
            num_chars += stop - start
    if group:
        yield group


def _rows(encoding: Encoding, piece: str, byte_base: int) -> bytes:
    """One piece's tokens as comma-separated JSON rows, offsets in UTF-8 bytes from `byte_base`."""
    at_byte = byte_offsets(piece)
    described: list[dict[str, Any]] = []
    for token_id, token, (start, stop), special in zip(
        encoding.ids, encoding.tokens, encoding.offsets, encoding.special_tokens_mask, strict=True
    ):
        if special:
            described.append({"id": token_id, "text": token, "special": True, "start": None, "stop": None})
        else:
            byte_start, byte_stop = (start, stop) if at_byte is None else (at_byte[start], at_byte[stop])
            described.append(
                {
                    "id": token_id,
                    "text": piece[start:stop],
                    "special": False,
                    "start": byte_base + int(byte_start),
                    "stop": byte_base + int(byte_stop),
                }
            )
    return orjson.dumps(described)[1:-1]


def describe_tokens(
    untruncated: Tokenizer,
    specials: SpecialRows,
    texts: Sequence[str],
    add_special_tokens: bool,
    max_tokens: int,
) -> bytes:
    """The JSON answer: per text, its tokens with UTF-8 byte offsets into it, as TEI gives them
    (`text` is the span itself); TooManyTokens past `max_tokens` tokens, all texts together."""
    num_tokens = len(texts) * specials.num_tokens if add_special_tokens else 0
    out = bytearray(b"[")
    current, byte_base, has_rows = -1, 0, False  # the text being written, its bytes so far

    def close() -> None:
        if add_special_tokens and specials.suffix:
            out.extend(b"," + specials.suffix if has_rows else specials.suffix)
        out.extend(b"]")

    for group in _groups(untruncated, texts, PIECE_CHARS):
        encoded = encode(untruncated, [piece for _, piece in group], add_special_tokens=False, offsets=True)
        for (i, piece), encoding in zip(group, encoded, strict=True):
            num_tokens += len(encoding.ids)
            if num_tokens > max_tokens:
                raise TooManyTokens(i, num_tokens)
            if i != current:
                if current >= 0:
                    close()
                    out.extend(b",")
                out.extend(b"[")
                current, byte_base, has_rows = i, 0, False
                if add_special_tokens and specials.prefix:
                    out.extend(specials.prefix)
                    has_rows = True
            if len(encoding.ids):
                rows = _rows(encoding, piece, byte_base)
                out.extend(b"," + rows if has_rows else rows)
                has_rows = True
            byte_base += len(piece) if piece.isascii() else len(piece.encode("utf-8"))
    if current >= 0:
        close()
    out.extend(b"]")
    return bytes(out)


def byte_offsets(text: str) -> np.ndarray | None:
    """Where each character of `text` starts in its UTF-8 encoding (one more entry: the end); None
    for ASCII, whose character and byte offsets agree."""
    if text.isascii():
        return None
    code_points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    widths = 1 + (code_points >= 0x80) + (code_points >= 0x800) + (code_points >= 0x10000)
    offsets = np.zeros(len(code_points) + 1, dtype=np.int64)
    np.cumsum(widths, out=offsets[1:])
    return offsets
