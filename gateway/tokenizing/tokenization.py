"""Tokenization with the Rust `tokenizers` library: small requests on the event loop, larger ones off it
(on threads; a bulk request's texts in child processes when there are some: tokenizer_processes.py).
The tokenizers, one per truncation side, are built once at start (tokenizer_load.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from tokenizers import Encoding, Tokenizer

from kembed.gateway.errors import InvalidInput, PayloadTooLarge
from kembed.gateway.tokenizing.chat_pairs import ChatPairs, OverLongPair, encode_chat_pairs
from kembed.gateway.tokenizing.documents import EmptyChunk, OverLongDocument, SingleTemplate, encode_documents
from kembed.gateway.tokenizing.encode_groups import SERIAL_MAX_CHARS, encode_each, ids_of, num_ids
from kembed.gateway.tokenizing.heap import LARGE_CHARS, HeapTrim
from kembed.gateway.tokenizing.tokenize_answer import SpecialRows, TooManyTokens, describe_tokens
from kembed.gateway.tokenizing.tokenizer_load import (
    encode_ids,
    encode_ids_truncated,
    load_tokenizer,
    truncating_tokenizer,
)
from kembed.gateway.tokenizing.tokenizer_processes import TokenizerProcesses
from kembed.gateway.tokenizing.windows import (
    MARGIN_TOKENS,
    WINDOW_CHARS_PER_TOKEN,
    count_tokens,
    cut_window,
    cut_windows,
    most_chars,
)
from kembed.proto.model_files import Direction, ModelSpec

Input = str | list[int]
"""One request input: a text, or an already tokenized sequence taken as-is (no special tokens added)."""

_T = TypeVar("_T")


def _foreign_ids(index: int, token_id: int, vocab_size: int) -> InvalidInput:
    """Token ids this model's tokenizer cannot have made: most often another tokenizer's (tiktoken's,
    which langchain-openai's OpenAIEmbeddings sends unless told not to), so say how to send text."""
    return InvalidInput(
        f"input {index} has token id {token_id} outside [0, {vocab_size}): token ids must come from "
        f"this model's own tokenizer ({vocab_size} ids), not another's such as tiktoken's; send the text "
        "itself instead (langchain-openai: OpenAIEmbeddings(..., check_embedding_ctx_length=False))",
        param="input",
    )


def _unframed(index: int, how: str) -> InvalidInput:
    """Token ids within the vocabulary that this model's tokenizer did not make (token_ids `framed`)."""
    return InvalidInput(
        f"input {index}'s token ids were not made by this model's tokenizer: {how}. Another tokenizer's "
        "ids (tiktoken's, which langchain-openai's OpenAIEmbeddings sends unless told not to) would be "
        "embedded as wrong vectors: send the text itself (langchain-openai: OpenAIEmbeddings(..., "
        "check_embedding_ctx_length=False)); clients that send this model's own ids without its special "
        "tokens need the gateway's --token-ids any",
        param="input",
    )


class Tokenization:
    """Turns request inputs into int32 token-id arrays exactly as sentence-transformers would."""

    def __init__(
        self,
        spec: ModelSpec,
        num_threads: int,
        max_inline_chars: int = 0,
        num_bulk_processes: int = 0,
        heap: HeapTrim | None = None,
        token_ids: str = "framed",
    ) -> None:
        self.spec = spec
        self._is_framed = token_ids == "framed"  # GatewayConfig.token_ids
        self._heap = heap or HeapTrim()  # a large request's end gives its freed memory back (heap.py)
        # Tokenizing a short query takes less time than handing it to a thread and waking the loop
        # when it is done; past `max_inline_chars` the threads keep the loop free (the Rust calls
        # release the GIL, so they also use other cores).
        self._max_inline_chars = max_inline_chars
        self._untruncated = load_tokenizer(spec)
        self._truncated: dict[Direction, Tokenizer] = {}
        if spec.max_seq_length is not None:
            for direction in ("right", "left"):
                self._truncated[direction] = truncating_tokenizer(
                    self._untruncated, spec.max_seq_length, direction
                )
        self._executor = ThreadPoolExecutor(num_threads, thread_name_prefix="kembed-tokenize")
        self._single = SingleTemplate.of(self._untruncated)
        # an LLM reranker's pairs go through its chat template, with the default prompt as the system
        # message where there is one (as CrossEncoder.predict renders them)
        self._chat_pairs = (
            None
            if spec.chat_template is None
            else ChatPairs.of(spec.chat_template, spec.resolve_prompt(None) or None, self._untruncated)
        )
        self._special_rows = SpecialRows.of(self._untruncated)
        self._processes = TokenizerProcesses(spec, num_bulk_processes) if num_bulk_processes else None

    def close(self) -> None:
        self._heap.close()
        self._executor.shutdown(wait=False, cancel_futures=True)
        if self._processes is not None:
            self._processes.close()

    @property
    def num_bulk_in_processes(self) -> int:
        """Requests tokenized in the bulk processes since start."""
        return 0 if self._processes is None else self._processes.num_requests

    @property
    def max_length(self) -> int | None:
        return self.spec.max_seq_length

    @property
    def pair_specials(self) -> int:
        """Tokens a (query, text) pair holds besides its texts': the pair template's special tokens
        (3, as BERT's [CLS] q [SEP] d [SEP]), or an LLM reranker's whole chat template."""
        return 3 if self._chat_pairs is None else self._chat_pairs.num_template_tokens

    def token_ids(self, tokens: tuple[str, ...]) -> frozenset[int]:
        """The ids of `tokens` in the vocabulary (those it has)."""
        ids = (self._untruncated.token_to_id(token) for token in tokens)
        return frozenset(i for i in ids if i is not None)

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

    async def _run(self, num_chars: int, fn: Callable[..., _T], *args: Any) -> _T:
        """`fn(*args)`: at once if it tokenizes at most `max_inline_chars` characters, else on a thread."""
        if num_chars <= self._max_inline_chars:
            return fn(*args)
        if num_chars >= LARGE_CHARS:
            self._heap.hold()
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def encode(
        self,
        inputs: Sequence[Input],
        *,
        truncate: bool,
        direction: Direction | None,
        prompt_name: str | None,
        vocab_size: int,
        is_bulk: bool = False,
    ) -> list[np.ndarray]:
        """One int32 array per input, in order: texts get the prompt and special tokens, then
        truncation; token-id inputs are checked against `vocab_size` and truncated as they are.
        `is_bulk`: the texts of a request classed bulk, tokenized in the bulk processes if any."""
        prompt = self.prompt(prompt_name)
        short = self._encode_short(inputs, prompt, truncate)
        if short is not None:
            return short
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
                num_chars = sum(min(len(text), limit * WINDOW_CHARS_PER_TOKEN) for text in texts)
                encoded = await self._in_processes(is_bulk, num_chars, texts, (limit, side))
                if encoded is None:
                    args = (self._tokenizer(True, direction), self._untruncated, texts, limit, side)
                    encoded = await self._run(num_chars, encode_ids_truncated, *args)
            else:
                if (
                    limit is not None
                ):  # an over-long text is refused from a window, before all of it is paid for
                    self._refuse_over_long(texts, text_positions, limit)
                num_chars = sum(len(text) for text in texts)
                encoded = await self._in_processes(is_bulk, num_chars, texts, None)
                if encoded is None:
                    tokenizer = self._tokenizer(truncate, direction)
                    encoded = await self._run(num_chars, encode_ids, tokenizer, texts)
            for i, ids in zip(text_positions, encoded, strict=True):
                self._check_length(i, len(ids))
                result[i] = ids
        return result  # type: ignore[return-value]

    def _encode_short(self, inputs: Sequence[Input], prompt: str, truncate: bool) -> list[np.ndarray] | None:
        """The ids of a request of a few short texts (a search query), on the calling thread; None
        for any other request. Encoded without truncation: the ids are the same wherever truncation
        would not cut, and a text that comes out longer than the limit is encoded again below, as
        any other (windows.py), or refused."""
        if (
            len(inputs) > SHORT_MAX_TEXTS
            or not all(type(item) is str for item in inputs)
            or sum(map(len, inputs)) > min(self._max_inline_chars, SERIAL_MAX_CHARS)
        ):
            return None
        encode = self._untruncated.encode
        encoded = [np.array(encode(prompt + text).ids, dtype=np.int32) for text in inputs]  # type: ignore[operator]
        limit = self.spec.max_seq_length
        if limit is not None and any(len(ids) > limit for ids in encoded):
            return None
        return encoded

    async def _in_processes(
        self, is_bulk: bool, num_chars: int, texts: list[str], truncation: tuple[int, Direction] | None
    ) -> list[np.ndarray] | None:
        """A bulk request's ids from the bulk processes; None where they are not for it (no
        processes, a small request, or the pool broken: the threads then take it)."""
        processes = self._processes
        if not is_bulk or processes is None or processes.is_broken or num_chars <= self._max_inline_chars:
            return None
        try:
            return await processes.encode(texts, truncation)
        except BrokenProcessPool:
            return None

    def _refuse_over_long(self, texts: list[str], positions: list[int], limit: int) -> None:
        """PayloadTooLarge for the first text whose first window already holds more than `limit`
        tokens (a window cut between words yields a prefix of the text's tokens; one cut inside a
        word, a few tokens more or less: hence the margin), or that is longer than any text of
        `limit` tokens is taken to be, so that no text
        longer than that is ever tokenized whole (most_chars)."""
        num_chars = limit * WINDOW_CHARS_PER_TOKEN
        cut = [
            (position, cut_window(self._untruncated, text, num_chars, "right"), text)
            for position, text in zip(positions, texts, strict=True)
        ]
        shortened = [(position, window) for position, window, text in cut if len(window) < len(text)]
        counts = encode_each(self._untruncated, [window for _, window in shortened], num_ids)
        for (position, _), count in zip(shortened, counts, strict=True):
            if count > limit + MARGIN_TOKENS:
                raise PayloadTooLarge(
                    f"input {position} has more than {limit} tokens (at least {count - MARGIN_TOKENS}), "
                    f"the model's limit; send truncate=true or shorten it",
                    param="input",
                )
        most = most_chars(limit)
        for position, text in zip(positions, texts, strict=True):
            if len(text) > most:
                raise PayloadTooLarge(
                    f"input {position} has {len(text)} characters, more than the {most} that any text "
                    f"of the model's limit of {limit} tokens can have here; send truncate=true or "
                    "shorten it",
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
            raise _foreign_ids(index, bad_id, vocab_size) from None
        bad = array[(array < 0) | (array >= vocab_size)]
        if bad.size:
            raise _foreign_ids(index, int(bad[0]), vocab_size)
        prefix, suffix = (self._single.prefix, self._single.suffix) if self._is_framed else ([], [])
        if self._is_framed:
            self._check_own(index, array)
        limit = self.spec.max_seq_length
        if limit is not None and array.size > limit:
            if not truncate:
                self._check_length(index, array.size)
            side = direction or self.spec.truncation_side
            # cut inside the frame, as the tokenizer truncates a text: its special tokens stay
            body = array[len(prefix) : array.size - len(suffix)]
            keep = max(0, limit - len(prefix) - len(suffix))
            body = body[body.size - keep :] if side == "left" else body[:keep]
            array = np.concatenate([np.asarray(prefix, np.int64), body, np.asarray(suffix, np.int64)])
        return array.astype(np.int32)

    def _check_own(self, index: int, array: np.ndarray) -> None:
        """InvalidInput unless `array` is framed as this model's tokenizer frames one sequence, or, for
        a tokenizer that frames none, decodes and encodes back to itself."""
        prefix, suffix = self._single.prefix, self._single.suffix
        if prefix or suffix:
            head, tail = array[: len(prefix)].tolist(), array[array.size - len(suffix) :].tolist()
            if array.size >= len(prefix) + len(suffix) and head == prefix and tail == suffix:
                return
            name = self._untruncated.id_to_token
            frame = " ... ".join(
                " ".join(f"{name(i)} ({i})" for i in part) for part in (prefix, suffix) if part
            )
            raise _unframed(
                index, f"it puts {frame} around a sequence; these start with {head} and end with {tail}"
            )
        ids = array.tolist()
        text = self._untruncated.decode(ids, skip_special_tokens=False)
        if self._untruncated.encode(text, add_special_tokens=False).ids != ids:
            raise _unframed(index, "they do not decode and encode back to themselves")

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
        longer side losing a token at a time until the pair fits; no prompt is applied. An LLM
        reranker's pair is its chat template's instead (chat_pairs.py), the default prompt its
        system message."""
        limit = self.spec.max_seq_length
        side = direction or self.spec.truncation_side
        num_chars = len(query) + sum(len(text) for text in texts)
        try:
            if self._chat_pairs is not None:
                args: tuple[Any, ...] = (self._untruncated, self._chat_pairs, query, list(texts), limit, side)
                ids, type_ids = await self._run(num_chars, encode_chat_pairs, *args, truncate)
            else:
                tokenizer = self._tokenizer(truncate, direction)
                args = (tokenizer, self._untruncated, query, list(texts), limit, side)
                ids, type_ids = await self._run(num_chars, _encode_pairs, *args, truncate)
        except (_OverLongPair, OverLongPair) as error:
            raise PayloadTooLarge(
                f"the pair of the query and {param}[{error.index}] is more than the model's limit of "
                f"{limit} tokens; send truncate=true or shorten them",
                param=param,
            ) from None
        for i, row in enumerate(ids):
            if limit is not None and len(row) > limit:
                raise PayloadTooLarge(
                    f"the pair of the query and {param}[{i}] is {len(row)} tokens, more than the "
                    f"model's limit of {limit}; send truncate=true or shorten them",
                    param=param,
                )
        return ids, type_ids

    async def encode_documents(
        self, documents: Sequence[Sequence[str]], max_tokens: int, param: str = "input"
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Late chunking (documents.py): per document, its chunks' ids joined into one sequence with
        the model's default prompt and special tokens once, and the k + 1 bounds of its chunks' spans.
        A document over `max_tokens` is refused (413): cutting it would drop chunks."""
        num_chars = sum(len(chunk) for chunks in documents for chunk in chunks)
        args = (self._untruncated, self._single, documents, self.prompt(None), max_tokens)
        try:
            return await self._run(num_chars, encode_documents, *args, most_chars(max_tokens))
        except OverLongDocument as error:
            counted = "" if error.num_tokens is None else f" ({error.num_tokens})"
            raise PayloadTooLarge(
                f"{param}[{error.index}] has more tokens{counted} than the limit of {max_tokens} per "
                "document; a document is never truncated (its last chunks would be lost): split it",
                param=param,
            ) from None
        except EmptyChunk as error:
            raise InvalidInput(
                f"{param}[{error.document}][{error.chunk}] has no tokens; send chunks with text", param=param
            ) from None

    async def cut(self, texts: Sequence[str], max_tokens: int, direction: Direction) -> list[str]:
        """Each text cut to its first (`right`) or last (`left`) `max_tokens` tokens, special tokens
        not counted, at that token's character offset; a text no longer comes back as it is. For
        per-request limits below the model's (Cohere's `max_tokens`, `max_tokens_per_doc`); only a
        window of a long text is tokenized (windows.py)."""
        num_chars = sum(min(len(text), most_chars(max_tokens)) for text in texts)
        return await self._run(num_chars, _cut, self._untruncated, list(texts), max_tokens, direction)

    async def tokenize(
        self, texts: Sequence[str], *, add_special_tokens: bool, prompt_name: str | None, max_tokens: int
    ) -> bytes:
        """TEI's /tokenize answer as JSON: per text, its tokens with UTF-8 byte offsets into the
        prompted text, as TEI gives them (`text` is the span itself); 413 past `max_tokens` tokens,
        all texts together, refused as soon as they are counted (tokenize_answer.py)."""
        prompt = self.prompt(prompt_name)
        prompted = [prompt + text for text in texts]
        num_chars = sum(len(text) for text in prompted)
        args = (self._untruncated, self._special_rows, prompted, add_special_tokens, max_tokens)
        try:
            return await self._run(num_chars, describe_tokens, *args)
        except TooManyTokens as error:
            raise PayloadTooLarge(
                f"/tokenize answers at most {max_tokens} tokens per request, all inputs together; "
                f"inputs[{error.index}] brings it past that ({error.num_tokens} counted so far); "
                "send the text in parts",
                param="inputs",
            ) from None

    @property
    def vocab_size(self) -> int:
        """Ids the tokenizer knows, added tokens included."""
        return int(self._untruncated.get_vocab_size(with_added_tokens=True))

    async def decode(self, sequences: list[list[int]], *, skip_special_tokens: bool) -> list[str]:
        """TEI's /decode: the text of each id sequence (ids checked and counted by the caller); off
        the event loop but for a few ids (taken as ~4 characters each)."""
        num_chars = 4 * sum(len(ids) for ids in sequences)
        decode = self._untruncated.decode_batch
        return list(await self._run(num_chars, decode, sequences, skip_special_tokens))


# The functions below run on the tokenization threads (or inline for small requests); the Rust calls
# release the GIL.

SHORT_MAX_TEXTS = 8  # a request of at most this many short texts takes `_encode_short`


def _cut(untruncated: Tokenizer, texts: list[str], max_tokens: int, side: Direction) -> list[str]:
    windows = cut_windows(untruncated, texts, max_tokens, side)

    def bound(encoding: Encoding) -> int | None:
        """Where the kept tokens end (`right`) or start (`left`) in the window; None: all kept."""
        offsets = encoding.offsets
        if len(offsets) <= max_tokens:
            return None
        return offsets[max_tokens - 1][1] if side == "right" else offsets[len(offsets) - max_tokens][0]

    bounds = encode_each(untruncated, windows, bound, add_special_tokens=False, offsets=True)
    return [
        window if at is None else window[:at] if side == "right" else window[at:]
        for window, at in zip(windows, bounds, strict=True)
    ]


def _kept(ids: np.ndarray, num_tokens: int, side: Direction) -> np.ndarray:
    return ids[:num_tokens] if side == "right" else ids[len(ids) - num_tokens :]


@dataclass(frozen=True)
class _PairTemplate:
    """Where a tokenizer's post-processor puts its special tokens around a pair (`[CLS] A [SEP] B
    [SEP]`, `<s> A </s></s> B </s>`, ...), and the type id of each part, learnt by post-processing
    one short pair. A pair is then assembled from already truncated ids: truncating Encodings
    instead keeps what was cut as "overflowing" pieces, and post-processing a pair pairs every
    piece of one side with every piece of the other (two 3000-word texts, truncated to 16 tokens:
    857,761 encodings, 40 s and 12 GB)."""

    prefix: tuple[list[int], list[int]]
    middle: tuple[list[int], list[int]]
    suffix: tuple[list[int], list[int]]
    type_a: int
    type_b: int

    @staticmethod
    def of(tokenizer: Tokenizer, untruncated: Tokenizer) -> _PairTemplate:
        a = untruncated.encode("a", add_special_tokens=False)
        b = untruncated.encode("b", add_special_tokens=False)
        out = tokenizer.post_process(a, b, add_special_tokens=True)
        parts: list[tuple[list[int], list[int]]] = [([], []), ([], []), ([], [])]
        types = [0, 0]
        num_plain = 0  # non-special tokens seen: the first len(a) are A's, the rest B's
        for token, kind, special in zip(out.ids, out.type_ids, out.special_tokens_mask, strict=True):
            if special:
                where = 0 if num_plain == 0 else 1 if num_plain == len(a.ids) else 2
                parts[where][0].append(token)
                parts[where][1].append(kind)
            else:
                types[num_plain >= len(a.ids)] = kind
                num_plain += 1
        return _PairTemplate(parts[0], parts[1], parts[2], types[0], types[1])

    def apply(self, ids_a: np.ndarray, ids_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ids = np.concatenate([self.prefix[0], ids_a, self.middle[0], ids_b, self.suffix[0]]).astype(np.int32)
        types = np.concatenate(
            [
                self.prefix[1],
                np.full(len(ids_a), self.type_a),
                self.middle[1],
                np.full(len(ids_b), self.type_b),
                self.suffix[1],
            ]
        ).astype(np.int32)
        return ids, types


class _OverLongPair(Exception):
    """The pair of the query and text `index` holds more than max_length tokens (no truncation)."""

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.index = index


def _pair_lengths(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
    """How many tokens of each side `longest_first` keeps when a pair of `len_a` and `len_b` tokens
    must fit `budget` (max_length less the pair template's special tokens): the tokenizers library's
    own rule, the shorter side kept whole if it leaves the longer at least as much, else both cut to
    half (the longer one taking an odd budget's extra token; on a tie, the second)."""
    if len_a + len_b <= budget:
        return len_a, len_b
    n1, n2, is_swapped = len_a, len_b, len_a > len_b
    if is_swapped:
        n1, n2 = n2, n1
    n2 = n1 if n1 > budget else max(n1, budget - n1)
    if n1 + n2 > budget:
        n1 = budget // 2
        n2 = n1 + budget % 2
    return (n2, n1) if is_swapped else (n1, n2)


def _encode_pairs(
    tokenizer: Tokenizer,
    untruncated: Tokenizer,
    query: str,
    texts: list[str],
    max_length: int | None,
    side: Direction,
    truncate: bool,
) -> tuple[list[np.ndarray], ...]:
    """Ids and type ids of each (query, text) pair, exactly as `tokenizer.encode(query, text)` (which
    truncates longest_first to `max_length` if `truncate`; without, a side that alone is longer
    than `max_length` is refused from its window: `_OverLongPair`), tokenizing
    the query once and each text once: a long query repeated for every document is not paid again
    per document, and no truncated Encoding is made (_PairTemplate). With truncation, each side is
    tokenized only in a window that yields more tokens
    than can be kept (`cut_windows`); the whole length of a cut side is counted, in pieces, only when
    which side is longer is not clear from the windows, which is all the rule needs of it."""
    items = [query, *texts]
    if max_length is None:
        windows, is_cut = items, [False] * len(items)
    else:
        windows = cut_windows(untruncated, items, max_length, side)
        is_cut = [len(w) < len(t) for w, t in zip(windows, items, strict=True)]
        if not truncate and any(is_cut):  # that side alone holds more than max_length tokens
            raise _OverLongPair(max(is_cut.index(True) - 1, 0))
    parts = encode_each(untruncated, windows, ids_of, add_special_tokens=False)
    lengths = [len(ids) for ids in parts]
    budget = (max_length or 0) - tokenizer.num_special_tokens_to_add(True)
    whole: dict[int, int] = {}

    def length(i: int, other: int) -> int:
        """Side i's length, or a stand-in that the rule treats alike (its window's, when that already
        shows it to be the longer side)."""
        if not is_cut[i] or (not is_cut[other] and lengths[i] > lengths[other]):
            return lengths[i]
        if i not in whole:
            whole[i] = count_tokens(untruncated, items[i])
        return whole[i]

    template = _PairTemplate.of(tokenizer, untruncated)
    ids, type_ids = [], []
    for j in range(1, len(items)):
        keep_query, keep_text = lengths[0], lengths[j]
        if truncate and max_length is not None and lengths[0] + lengths[j] > budget:
            keep_query, keep_text = _pair_lengths(length(0, j), length(j, 0), budget)
        row, types = template.apply(_kept(parts[0], keep_query, side), _kept(parts[j], keep_text, side))
        ids.append(row)
        type_ids.append(types)
    return ids, type_ids
