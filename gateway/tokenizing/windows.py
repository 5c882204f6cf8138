"""Truncation windows: a long text cut to the part of it truncation keeps, before it is tokenized.

Functions of the tokenization threads (tokenization.py), over a `tokenizers.Tokenizer` that neither
truncates nor pads. What a cut may change, and why the cuts made here change nothing, is told below.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from tokenizers import Tokenizer

from kembed.gateway.tokenizing.encode_groups import encode_each, num_ids
from kembed.proto.model_files import Direction

# Truncation keeps at most max_length tokens, so a text is first cut to a window of its first (or,
# truncating on the left, last) characters and only the window is tokenized: an 8 MB text then costs
# what its kept part costs. The cut must leave the words on the kept side whole, so that their tokens
# are those of the whole text: every tokenizer family served splits its input into words (the
# pre-tokenizer's pieces: at whitespace, and for WordPiece and byte-level BPE also between letters,
# digits, punctuation and CJK characters) before its model sees them, each word tokenized alone.
# The cut is made, in order of preference:
# 1. at a whitespace (see _CUT);
# 2. where there is none (a CJK run, a blob), between two of the words the tokenizer itself finds in
#    the span, both edges non-whitespace, away from the span's own cut edge;
# 3. where even the largest window (most_chars) is one word, inside it: a word of more than 65,536
#    characters (a CJK book to a SentencePiece tokenizer, a hostile run of letters) is cut there.
#    WordPiece makes one [UNK] of any word over 100 characters, cut or not; a BPE or Unigram model
#    may then tokenize the word differently from the whole text, even far from the cut (a
#    repetitive word's best segmentation can shift with its end): the price of the bound. A
#    smaller window that is one word is not cut but grown.
# The window must still yield more tokens than are kept, with a margin, else it grows 4x, up to
# most_chars: past that a text is never tokenized further, whatever it holds (tokens longer than
# that on average are cut there).
WINDOW_CHARS_PER_TOKEN = 8
MAX_WINDOW_CHARS_PER_TOKEN = 64
MIN_MAX_WINDOW_CHARS = 1 << 16
MARGIN_TOKENS = 16


def most_chars(max_length: int) -> int:
    """The most characters of one text tokenized when at most `max_length` tokens are kept."""
    return max(max_length * MAX_WINDOW_CHARS_PER_TOKEN, MIN_MAX_WINDOW_CHARS)


# A whitespace cut is made only at a space that starts a run of whitespace: a Metaspace
# pre-tokenizer splits words at spaces only (a newline is part of a word unless the normalizer maps
# it to a space), and a byte-level one takes a run of whitespace but its last character as one
# token, so a cut inside a run, or at a newline, could change the tokens next to it.
_CUT = re.compile(r"(?<=\S) ")


def _last_cut(text: str, start: int, stop: int) -> int:
    """Index of the last cut point in text[start:stop], or -1."""
    found = -1
    for match in _CUT.finditer(text, start, stop):
        found = match.start()
    return found


def _first_cut(text: str, start: int, stop: int) -> int:
    match = _CUT.search(text, start, stop)
    return -1 if match is None else match.start()


def _word_starts(untruncated: Tokenizer, span: str) -> list[int]:
    """Where the tokenizer's words start in `span` (char offsets, ascending), keeping only starts
    with a non-whitespace character on both sides (so no whitespace run is split)."""
    encoding = untruncated.encode(span, add_special_tokens=False)
    starts, previous = [], None
    for word, (start, _) in zip(encoding.word_ids, encoding.offsets, strict=True):
        if word is not None and word != previous:
            if 0 < start < len(span) and not span[start - 1].isspace() and not span[start].isspace():
                starts.append(start)
            previous = word
    return starts


def prefix_end(untruncated: Tokenizer, text: str, num_chars: int, *, hard: bool = True) -> int:
    """Where a kept prefix of at most `num_chars` characters of `text` ends (see above); where the
    span is one word, `num_chars` itself if `hard`, else 0 (an empty window: grow it)."""
    cut = _last_cut(text, 1, num_chars)
    if cut >= num_chars // 2:
        return cut
    starts = _word_starts(untruncated, text[:num_chars])  # the span's last word may be cut: its start is not
    cut = max(cut, starts[-1] if starts else -1)
    return cut if cut > 0 else num_chars if hard else 0


def _suffix_start(untruncated: Tokenizer, text: str, num_chars: int) -> int:
    """Where a kept suffix of at most `num_chars` characters of `text` starts (see above)."""
    start = len(text) - num_chars
    cut = _first_cut(text, start, len(text) - 1)
    if 0 <= cut - start <= num_chars // 2:
        return cut
    starts = _word_starts(untruncated, text[start:])[1:]  # the span's first word may be cut, so its end too
    if starts and (cut < 0 or start + starts[0] < cut):
        cut = start + starts[0]
    return cut if cut >= 0 else len(text)  # one word: an empty window, to grow


def cut_window(untruncated: Tokenizer, text: str, num_chars: int, side: Direction) -> str:
    """The first (`right`) or last (`left`) `num_chars` or fewer characters of `text`, cut as above
    (empty where the span is one word: only `cut_windows` cuts inside a word, at its bound); the
    whole text if it is no longer."""
    if len(text) <= num_chars:
        return text
    if side == "right":
        return text[: prefix_end(untruncated, text, num_chars, hard=False)]
    return text[_suffix_start(untruncated, text, num_chars) :]


def cut_windows(untruncated: Tokenizer, texts: Sequence[str], max_length: int, side: Direction) -> list[str]:
    """Each text cut to a window that still yields max_length tokens and the margin, or to the
    most characters a window may have, cut there (see above)."""
    num_chars = max_length * WINDOW_CHARS_PER_TOKEN
    most = most_chars(max_length)
    windows = [cut_window(untruncated, text, num_chars, side) for text in texts]
    unsure = [i for i, text in enumerate(texts) if len(windows[i]) < len(text)]
    while unsure:  # is each cut window long enough?
        counts = encode_each(untruncated, [windows[i] for i in unsure], num_ids)
        unsure = [i for i, count in zip(unsure, counts, strict=True) if count < max_length + MARGIN_TOKENS]
        if num_chars == most:
            for i in unsure:
                windows[i] = texts[i][:most] if side == "right" else texts[i][len(texts[i]) - most :]
            break
        num_chars = min(num_chars * 4, most)
        for i in unsure:
            windows[i] = cut_window(untruncated, texts[i], num_chars, side)
        unsure = [i for i in unsure if len(windows[i]) < len(texts[i])]
    return windows


COUNT_CHUNK_CHARS = 1 << 16


def count_tokens(untruncated: Tokenizer, text: str) -> int:
    """Tokens of `text` without special tokens, counted in pieces of at most COUNT_CHUNK_CHARS
    characters cut as a window is (exact for the same reason, but for a word longer than a piece,
    whose count may be off by a token or so at each cut), so a text of megabytes never has all its
    tokens in memory at once."""
    total, start = 0, 0
    while start < len(text):
        stop = len(text)
        if stop - start > COUNT_CHUNK_CHARS:
            piece = text[start : start + COUNT_CHUNK_CHARS + 1]
            stop = start + prefix_end(untruncated, piece, COUNT_CHUNK_CHARS)
        total += len(untruncated.encode(text[start:stop], add_special_tokens=False).ids)
        start = stop
    return total
