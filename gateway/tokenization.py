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
            num_chars = sum(len(text) for text in texts)
            encoded = await self._run(num_chars, _encode_ids, self._tokenizer(truncate, direction), texts)
            for i, ids in zip(text_positions, encoded, strict=True):
                self._check_length(i, len(ids))
                result[i] = ids
        return result  # type: ignore[return-value]

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


def _encode_ids(tokenizer: Tokenizer, texts: list[str]) -> list[np.ndarray]:
    return [np.asarray(e.ids, dtype=np.int32) for e in tokenizer.encode_batch_fast(texts)]


def _encode_pairs(tokenizer: Tokenizer, pairs: list[tuple[str, str]]) -> tuple[list[np.ndarray], ...]:
    encodings = tokenizer.encode_batch_fast(pairs)
    ids = [np.asarray(e.ids, dtype=np.int32) for e in encodings]
    type_ids = [np.asarray(e.type_ids, dtype=np.int32) for e in encodings]
    return ids, type_ids


def _describe_tokens(tokenizer: Tokenizer, texts: list[str], add_special_tokens: bool) -> list[list[dict]]:
    described = []
    for text, encoding in zip(
        texts, tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens), strict=True
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
