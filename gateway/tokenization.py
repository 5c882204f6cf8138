"""Tokenization with the Rust `tokenizers` library: small requests on the event loop, larger ones off it.

Truncation is state of a `tokenizers.Tokenizer` instance, so there is one instance per variant (right,
left, none) built at start and never reconfigured: concurrent requests can share them safely. The
stored padding/truncation of tokenizer.json (the bundled MiniLM ships fixed padding to 128 and
truncation at 128) is cleared first, so the ids equal sentence-transformers' `encode`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from tokenizers import Tokenizer, normalizers

from kembed.gateway.errors import InvalidInput, PayloadTooLarge
from kembed.gateway.model_files import Direction, ModelSpec

Input = str | list[int]
"""One request input: a text, or an already tokenized sequence taken as-is (no special tokens added)."""


def _load_base(spec: ModelSpec) -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(spec.tokenizer_file))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    if spec.do_lower_case:
        # As sentence-transformers does: put Lowercase in front unless one is already there.
        current = tokenizer.normalizer
        has_lowercase = isinstance(current, normalizers.Lowercase) or (
            isinstance(current, normalizers.Sequence)
            and any(isinstance(n, normalizers.Lowercase) for n in current)
        )
        if not has_lowercase:
            steps = [normalizers.Lowercase()] if current is None else [normalizers.Lowercase(), current]
            tokenizer.normalizer = normalizers.Sequence(steps)
    return tokenizer


def _truncating(base: Tokenizer, max_length: int, direction: Direction) -> Tokenizer:
    tokenizer = Tokenizer.from_str(base.to_str())
    # longest_first counts the special tokens the post-processor adds, as transformers does.
    tokenizer.enable_truncation(max_length, strategy="longest_first", direction=direction)
    return tokenizer


class Tokenization:
    """Turns request inputs into int32 token-id arrays exactly as sentence-transformers would."""

    def __init__(self, spec: ModelSpec, num_threads: int, max_inline_chars: int = 0) -> None:
        self.spec = spec
        # Tokenizing a short query takes less time than handing it to a thread and waking the loop
        # when it is done; past `max_inline_chars` the threads keep the loop free (the Rust calls
        # release the GIL, so they also use other cores).
        self._max_inline_chars = max_inline_chars
        self._untruncated = _load_base(spec)
        self._truncated: dict[Direction, Tokenizer] = {}
        if spec.max_seq_length is not None:
            for direction in ("right", "left"):
                self._truncated[direction] = _truncating(self._untruncated, spec.max_seq_length, direction)
        self._executor = ThreadPoolExecutor(num_threads, thread_name_prefix="kembed-tokenize")

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    @property
    def max_length(self) -> int | None:
        return self.spec.max_seq_length

    def prompt(self, prompt_name: str | None) -> str:
        try:
            return self.spec.resolve_prompt(prompt_name)
        except KeyError:
            known = ", ".join(repr(name) for name in sorted(self.spec.prompts))
            raise InvalidInput(
                f"unknown prompt_name {prompt_name!r}; this model knows {known}", param="prompt_name"
            ) from None

    def _tokenizer(self, truncate: bool, direction: Direction | None) -> Tokenizer:
        if not truncate or self.spec.max_seq_length is None:
            return self._untruncated
        return self._truncated[direction or self.spec.truncation_side]

    async def _run(self, num_chars: int, fn: Any, *args: Any) -> Any:
        """`fn(*args)`: at once if it tokenizes at most `max_inline_chars` characters, else on a thread."""
        if num_chars <= self._max_inline_chars:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def encode(
        self,
        inputs: Sequence[Input],
        *,
        truncate: bool,
        direction: Direction | None,
        prompt_name: str | None,
        vocab_size: int,
    ) -> list[np.ndarray]:
        """One int32 array per input, in order: texts get the prompt and special tokens, then
        truncation; token-id inputs are checked against `vocab_size` and truncated as they are."""
        prompt = self.prompt(prompt_name)
        result: list[np.ndarray | None] = [None] * len(inputs)
        text_positions = [i for i, item in enumerate(inputs) if isinstance(item, str)]
        for i, item in enumerate(inputs):
            if not isinstance(item, str):
                result[i] = self._take_ids(i, item, truncate, direction, vocab_size)
        if text_positions:
            texts = [prompt + inputs[i] for i in text_positions]  # type: ignore[operator]
            limit = self.spec.max_seq_length
            if truncate and limit is not None:  # only what truncation keeps is paid for
                side = direction or self.spec.truncation_side
                args = (self._tokenizer(True, direction), self._untruncated, texts, limit, side)
                num_chars = sum(min(len(text), limit * WINDOW_CHARS_PER_TOKEN) for text in texts)
                encoded = await self._run(num_chars, _encode_ids_truncated, *args)
            else:
                if (
                    limit is not None
                ):  # an over-long text is refused from a window, before all of it is paid for
                    self._refuse_over_long(texts, text_positions, limit)
                num_chars = sum(len(text) for text in texts)
                encoded = await self._run(num_chars, _encode_ids, self._tokenizer(truncate, direction), texts)
            for i, ids in zip(text_positions, encoded, strict=True):
                self._check_length(i, len(ids))
                result[i] = ids
        return result  # type: ignore[return-value]

    def _refuse_over_long(self, texts: list[str], positions: list[int], limit: int) -> None:
        """PayloadTooLarge for the first text whose first window already holds more than `limit`
        tokens (a prefix cut at a whitespace yields a prefix of the text's tokens)."""
        num_chars = limit * WINDOW_CHARS_PER_TOKEN
        cut = [
            (position, _window(text, num_chars, "right"), text)
            for position, text in zip(positions, texts, strict=True)
        ]
        cut = [(position, window) for position, window, text in cut if len(window) < len(text)]
        counts = [len(e.ids) for e in _encode(self._untruncated, [window for _, window in cut])]
        for (position, _), count in zip(cut, counts, strict=True):
            if count > limit:
                raise PayloadTooLarge(
                    f"input {position} has at least {count} tokens, more than the model's limit of "
                    f"{limit}; send truncate=true or shorten it",
                    param="input",
                )

    def _check_length(self, index: int, num_tokens: int) -> None:
        limit = self.spec.max_seq_length
        if limit is not None and num_tokens > limit:
            raise PayloadTooLarge(
                f"input {index} has {num_tokens} tokens, more than the model's limit of {limit}; "
                "send truncate=true or shorten it",
                param="input",
            )

    def _take_ids(
        self, index: int, ids: list[int], truncate: bool, direction: Direction | None, vocab_size: int
    ) -> np.ndarray:
        if not ids:
            raise InvalidInput(f"input {index} is an empty list of token ids", param="input")
        try:
            array = np.asarray(ids, dtype=np.int64)
        except OverflowError:  # beyond int64: certainly outside the vocabulary
            bad_id = next(i for i in ids if not -(2**63) <= i < 2**63)
            raise InvalidInput(
                f"input {index} has token id {bad_id} outside [0, {vocab_size})", param="input"
            ) from None
        bad = array[(array < 0) | (array >= vocab_size)]
        if bad.size:
            raise InvalidInput(
                f"input {index} has token id {int(bad[0])} outside [0, {vocab_size})", param="input"
            )
        limit = self.spec.max_seq_length
        if limit is not None and array.size > limit:
            if not truncate:
                self._check_length(index, array.size)
            side = direction or self.spec.truncation_side
            array = array[-limit:] if side == "left" else array[:limit]
        return array.astype(np.int32)

    async def encode_pairs(
        self,
        query: str,
        texts: Sequence[str],
        *,
        truncate: bool,
        direction: Direction | None,
        param: str = "texts",
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Token ids and token-type ids of each (query, text) pair, for cross-encoder scoring.

        As sentence-transformers' CrossEncoder tokenizes: `tokenizer(query, text, truncation=
        "longest_first", max_length=max_seq_length)`, i.e. the pair template of tokenizer.json
        ([CLS] q [SEP] d [SEP] with segments 0/1 for BERT, <s> q </s></s> d </s> for RoBERTa), the
        longer side losing a token at a time until the pair fits. No prompt is applied."""
        # Not windowed like single texts: how longest_first shares max_length between the two sides
        # depends on which side is longer in full, which a window of each would not preserve.
        pairs = [(query, text) for text in texts]
        num_chars = len(query) * len(texts) + sum(len(text) for text in texts)
        ids, type_ids = await self._run(num_chars, _encode_pairs, self._tokenizer(truncate, direction), pairs)
        limit = self.spec.max_seq_length
        for i, row in enumerate(ids):
            if limit is not None and len(row) > limit:
                raise PayloadTooLarge(
                    f"the pair of the query and {param}[{i}] is {len(row)} tokens, more than the "
                    f"model's limit of {limit}; send truncate=true or shorten them",
                    param=param,
                )
        return ids, type_ids

    async def tokenize(
        self, texts: Sequence[str], *, add_special_tokens: bool, prompt_name: str | None
    ) -> list[list[dict[str, Any]]]:
        """TEI's /tokenize answer: per text, its tokens with char offsets into the prompted text."""
        prompt = self.prompt(prompt_name)
        prompted = [prompt + text for text in texts]
        num_chars = sum(len(text) for text in prompted)
        return await self._run(num_chars, _describe_tokens, self._untruncated, prompted, add_special_tokens)


# The functions below run on the tokenization threads (or inline for small requests); the Rust calls
# release the GIL.

# `encode_batch` hands its texts to the library's rayon thread pool (a thread per core), whose threads
# spin after each job before they sleep: on a 16-core host a batch of 4 short queries cost 1.1 ms of
# CPU that way against 0.13 ms encoded one by one on the calling thread (same ids). A batch up to
# this many characters is encoded on the calling thread; a larger one is worth the pool's cores.
SERIAL_MAX_CHARS = 2048


def _encode(
    tokenizer: Tokenizer, items: Sequence[Any], *, add_special_tokens: bool = True, offsets: bool = False
) -> list[Any]:
    """tokenizer's Encodings of `items` (texts, or (text, pair) tuples), in order; char offsets
    only where `offsets` asks (a large batch skips computing them otherwise)."""
    num_chars = sum(len(item) if isinstance(item, str) else len(item[0]) + len(item[1]) for item in items)
    if num_chars > SERIAL_MAX_CHARS:
        batch = tokenizer.encode_batch if offsets else tokenizer.encode_batch_fast
        return batch(items, add_special_tokens=add_special_tokens)
    return [
        tokenizer.encode(item, add_special_tokens=add_special_tokens)
        if isinstance(item, str)
        else tokenizer.encode(*item, add_special_tokens=add_special_tokens)
        for item in items
    ]


def _encode_ids(tokenizer: Tokenizer, texts: list[str]) -> list[np.ndarray]:
    return [np.asarray(e.ids, dtype=np.int32) for e in _encode(tokenizer, texts)]


# Truncation keeps at most max_length tokens, so a text is first cut to a window of its first (or,
# truncating on the left, last) characters, at a whitespace, and only the window is tokenized: an 8 MB
# text then costs what its kept part costs. Every tokenizer family served splits words at whitespace
# before its model sees them, and a cut before a whitespace character (a kept prefix) or at one (a
# kept suffix keeps it) leaves the words on the kept side whole, so their tokens are those of the
# whole text; the window must still yield more tokens than are kept, with a margin for the special
# tokens, else it grows 4x. A window with no whitespace is not cut: a text without any (a long CJK
# run, a hostile blob) is tokenized whole, as before.
WINDOW_CHARS_PER_TOKEN = 8
MARGIN_TOKENS = 16
_SPACES = (" ", "\n", "\t")


def _window(text: str, num_chars: int, side: Direction) -> str:
    """The first (`right`) or last (`left`) `num_chars` or fewer characters of `text`, cut at a
    whitespace; the whole text if it is no longer, or if that span has no whitespace."""
    if len(text) <= num_chars:
        return text
    if side == "right":
        cut = max(text.rfind(c, 1, num_chars) for c in _SPACES)
        return text[:cut] if cut > 0 else text
    start = len(text) - num_chars
    found = [i for i in (text.find(c, start, len(text) - 1) for c in _SPACES) if i >= 0]
    return text[min(found) :] if found else text


def _windows(untruncated: Tokenizer, texts: Sequence[str], max_length: int, side: Direction) -> list[str]:
    """Each text cut to a window that still yields max_length tokens and the margin (see above)."""
    num_chars = max_length * WINDOW_CHARS_PER_TOKEN
    windows = [_window(text, num_chars, side) for text in texts]
    unsure = [i for i, text in enumerate(texts) if len(windows[i]) < len(text)]
    while unsure:  # is each cut window long enough?
        counts = [len(e.ids) for e in _encode(untruncated, [windows[i] for i in unsure])]
        unsure = [i for i, count in zip(unsure, counts, strict=True) if count < max_length + MARGIN_TOKENS]
        num_chars *= 4
        for i in unsure:
            windows[i] = _window(texts[i], num_chars, side)
        unsure = [i for i in unsure if len(windows[i]) < len(texts[i])]
    return windows


def _encode_ids_truncated(
    truncating: Tokenizer, untruncated: Tokenizer, texts: list[str], max_length: int, side: Direction
) -> list[np.ndarray]:
    """`_encode_ids(truncating, texts)`, tokenizing only a window of each long text (see above)."""
    return _encode_ids(truncating, _windows(untruncated, texts, max_length, side))


def _encode_pairs(tokenizer: Tokenizer, pairs: list[tuple[str, str]]) -> tuple[list[np.ndarray], ...]:
    encodings = _encode(tokenizer, pairs)
    ids = [np.asarray(e.ids, dtype=np.int32) for e in encodings]
    type_ids = [np.asarray(e.type_ids, dtype=np.int32) for e in encodings]
    return ids, type_ids


def _describe_tokens(tokenizer: Tokenizer, texts: list[str], add_special_tokens: bool) -> list[list[dict]]:
    described = []
    for text, encoding in zip(
        texts, _encode(tokenizer, texts, add_special_tokens=add_special_tokens, offsets=True), strict=True
    ):
        tokens = []
        for token_id, token, (start, stop), special in zip(
            encoding.ids, encoding.tokens, encoding.offsets, encoding.special_tokens_mask, strict=True
        ):
            if special:
                # Like TEI: a special token has no span in the input.
                tokens.append({"id": token_id, "text": token, "special": True, "start": None, "stop": None})
            else:
                tokens.append(
                    {"id": token_id, "text": text[start:stop], "special": False, "start": start, "stop": stop}
                )
        described.append(tokens)
    return described
