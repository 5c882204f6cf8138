"""The request flow both API shapes share: check limits, tokenize, run on workers, finish vectors.

Routes parse their own body shape and render their own response; everything between is here, so the
OpenAI and TEI routes cannot drift apart in limits, truncation or normalisation.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from kembed.gateway.admission import Admission, estimate_tokens
from kembed.gateway.config import GatewayConfig
from kembed.gateway.errors import (
    InvalidInput,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    Timeout,
    Unavailable,
    Unsupported,
    WorkerFailed,
)
from kembed.gateway.metrics import GatewayMetrics
from kembed.gateway.tokenization import Input, Tokenization
from kembed.gateway.vectors import finish, relevance
from kembed.gateway.workers import WorkerPool
from kembed.proto import embedder_pb2 as pb
from kembed.proto.model_files import Direction
from kembed.proto.outputs import DENSE, OutputShape, names_of, read_vocabulary

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Embedded:
    """Finished vectors of one request, [num_inputs, dims] float32, and the tokens that were run."""

    vectors: np.ndarray
    num_tokens: int


@dataclass(frozen=True, slots=True)
class Outputs:
    """Several outputs of one request (kembed.proto.outputs): per input its raw outputs by name
    (`dense` [dims], `sparse` [tokens], `colbert` [tokens - 1, dims], `tokens` [tokens, dims]), its
    token ids, and the tokens that were run."""

    rows: list[dict[str, np.ndarray]]
    sequences: Sequence[np.ndarray]
    num_tokens: int


@dataclass(frozen=True, slots=True)
class Scored:
    """Relevance scores of one rerank request, [num_texts] float64 in input order, and its tokens."""

    scores: np.ndarray
    num_tokens: int


PRIORITY_HEADER = "x-kembed-priority"
_SAID = {"interactive": pb.PRIORITY_INTERACTIVE, "bulk": pb.PRIORITY_BULK}


def said_priority(header: str | None) -> int:
    """The class a request's `X-Kembed-Priority` header asks for; unspecified when absent."""
    if header is None:
        return pb.PRIORITY_UNSPECIFIED
    said = _SAID.get(header.strip().lower())
    if said is None:
        raise InvalidInput(f"header X-Kembed-Priority must be `interactive` or `bulk`, got {header!r}")
    return said


class Admitted:
    """A request's hold on the admission: its estimate, and the class the estimate gives, until
    `settle` gives its token count and so its class."""

    def __init__(self, service: EmbeddingService, said: int, num_inputs: int, estimate: int) -> None:
        self._service = service
        self._said = said
        self._num_inputs = num_inputs
        self.num_tokens = estimate
        self.priority = service.classify(said, num_inputs, estimate)

    @property
    def is_bulk(self) -> bool:
        return self.priority == pb.PRIORITY_BULK

    def release(self) -> None:
        """The request ended, answered or not: its tokens leave the admission's count."""
        self._service.admission.release(self.num_tokens, is_bulk=self.is_bulk)

    def settle(self, num_tokens: int) -> int:
        was_bulk = self.is_bulk
        self.priority = self._service.classify(self._said, self._num_inputs, num_tokens)
        self._service.admission.resize(self.num_tokens, num_tokens, was_bulk=was_bulk, is_bulk=self.is_bulk)
        self.num_tokens = num_tokens
        self._service.check_feasible(num_tokens)  # released by the caller, at its count
        label = "bulk" if self.is_bulk else "interactive"
        self._service.metrics.class_requests_of[label].inc(1)
        self._service.metrics.class_tokens_of[label].inc(num_tokens)
        return num_tokens


class EmbeddingService:
    """Everything between a parsed request and its response, independent of the API shape."""

    def __init__(
        self, config: GatewayConfig, tokenization: Tokenization, pool: WorkerPool, metrics: GatewayMetrics
    ) -> None:
        self.config = config
        self.tokenization = tokenization
        self.pool = pool
        self.metrics = metrics
        metrics.watch(lambda: self.served_names[0])
        self._num_in_flight = 0  # requests admitted and not finished; only touched on the event loop
        self.admission = Admission(
            min(config.max_queue_wait_s, config.request_timeout_s),
            quantum_tokens=config.chunk_tokens,
            bulk_share=config.bulk_queue_share,
        )
        pool.on_chunk_served = lambda num_tokens: self.admission.drained(num_tokens, time.monotonic())
        # Request ids for the workers' logs: this process's pid and a counter (a uuid4 per request
        # cost ~3 µs of the gateway's loop and says no more).
        self._request_ids = map(f"{os.getpid():x}-{{:x}}".format, itertools.count(1))

    @property
    def served_names(self) -> tuple[str, ...]:
        """Names a request may use; the first is the one reported."""
        if self.config.served_model_names:
            return self.config.served_model_names
        info = self.pool.info
        return (info.model_name,) if info is not None and info.model_name else (self.tokenization.spec.name,)

    def check_model(self, name: str | None) -> None:
        """NotFound unless `name` is absent or one of the served names (404, as vLLM answers)."""
        if name is not None and name not in self.served_names:
            raise NotFound(f"The model `{name}` does not exist.", param="model")

    def worker_info(self) -> pb.InfoResponse:
        info = self.pool.info
        if info is None:
            raise Unavailable("no worker replica has answered yet; retry later")
        return info

    def _check_count(self, num_inputs: int, param: str) -> None:
        if num_inputs == 0:
            raise InvalidInput(f"`{param}` must not be empty", param=param)
        if num_inputs > self.config.max_client_batch_size:
            raise PayloadTooLarge(
                f"{num_inputs} inputs is more than the limit of "
                f"{self.config.max_client_batch_size} per request",
                param=param,
            )

    async def _run(self, work: Callable[[], Awaitable[T]]) -> T:
        """`work()` admitted under the concurrency cap (429 at once above it) and the deadline (504)."""
        if self._num_in_flight >= self.config.max_concurrent_requests:
            raise Overloaded(
                f"the gateway is handling {self._num_in_flight} requests, its limit; retry later"
            )
        self._num_in_flight += 1
        try:
            async with asyncio.timeout(self.config.request_timeout_s):
                return await work()
        except TimeoutError:
            raise Timeout(
                f"the request did not complete within {self.config.request_timeout_s:g} s"
            ) from None
        finally:
            self._num_in_flight -= 1

    def classify(self, said: int, num_inputs: int, num_tokens: int) -> int:
        """A request's class: what its header said, else interactive up to the configured size."""
        config = self.config
        if not config.priority_classes:
            return pb.PRIORITY_INTERACTIVE
        if said != pb.PRIORITY_UNSPECIFIED:
            return said
        if num_inputs <= config.interactive_max_inputs and num_tokens <= config.interactive_max_tokens:
            return pb.PRIORITY_INTERACTIVE
        return pb.PRIORITY_BULK

    def _admit(self, said: int, num_inputs: int, estimate: int) -> Admitted:
        """The request held as outstanding until `Admitted.release`, first at its `estimate`
        (estimate_tokens), then at its token count once tokenized (`Admitted.settle`); or Overloaded
        (429) at once, before any tokenizing, if the workers cannot take it in time (admission.py).
        Its class (`said`, else by size) decides what it waits behind, and bulk is refused first."""
        admitted = Admitted(self, said, num_inputs, estimate)
        # An estimate may be high (5 characters a token where it takes 4): refused on it only if
        # three quarters of it cannot fit; what it let through is checked again once counted.
        self.check_feasible(estimate, share=0.75)
        reason = self.admission.refusal(estimate, self.pool.capacity_tokens, is_bulk=admitted.is_bulk)
        if reason is not None:
            retry_after_s = self.admission.retry_after_s(estimate, is_bulk=admitted.is_bulk)
            raise Overloaded(
                f"the workers are at capacity: {reason}; retry later", retry_after_s=retry_after_s
            )
        self.admission.admit(estimate, is_bulk=admitted.is_bulk)
        return admitted

    def check_feasible(self, num_tokens: int, *, share: float = 1.0) -> None:
        """PayloadTooLarge (413) if `num_tokens` (`share` of them) can never be served within the
        request's deadline at the serving workers' rate (admission.py)."""
        drained = self.admission.rate.tokens_per_s  # this process's recent rate; NaN until known
        rate = max(self.pool.tokens_per_s, drained if drained > 0 else 0.0)
        reason = self.admission.infeasible(num_tokens, rate, self.config.request_timeout_s, share=share)
        if reason is not None:
            raise PayloadTooLarge(reason)

    def _estimate(self, inputs: Sequence[Input], truncate: bool) -> int:
        limit = self.tokenization.spec.max_seq_length if truncate else None
        texts = [len(item) for item in inputs if isinstance(item, str)]
        # token ids are run truncated as texts are (Tokenization._take_ids): counted so
        ids = sum(min(len(item), limit or len(item)) for item in inputs if not isinstance(item, str))
        return estimate_tokens(texts, limit) + ids

    def _observe_tokenized(self, started: float, num_inputs: int, sequences: Sequence[np.ndarray]) -> int:
        """Records a request's tokenize time, input and token counts; returns its token count."""
        num_tokens = sum(len(s) for s in sequences)
        self.metrics.tokenize.observe(time.perf_counter() - started)
        self.metrics.inputs.observe(num_inputs)
        self.metrics.tokens.observe(num_tokens)
        return num_tokens

    def _deadline(self) -> float:
        return asyncio.get_running_loop().time() + self.config.request_timeout_s

    async def embed(
        self,
        inputs: Sequence[Input],
        *,
        truncate: bool | None,
        direction: Direction | None,
        prompt_name: str | None,
        dimensions: int | None,
        normalize: bool | None,
        param: str = "input",
        priority: str | None = None,
    ) -> Embedded:
        """Vectors of `inputs` in order. `normalize=None` follows the model (its Normalize module).
        `priority`: the request's X-Kembed-Priority header, if any."""
        said = said_priority(priority)
        self._check_count(len(inputs), param)
        info = self.worker_info()
        if dimensions is not None and not 1 <= dimensions <= info.dimensions:
            raise InvalidInput(
                f"dimensions must be between 1 and {info.dimensions}, got {dimensions}", param="dimensions"
            )
        vocab_size = info.vocab_size or self.tokenization.spec.vocab_size or 2**31 - 1
        deadline = self._deadline()

        is_truncating = self.config.auto_truncate if truncate is None else truncate

        raw, _, num_tokens = await self._embed_texts(
            said, inputs, is_truncating, direction, prompt_name, vocab_size, deadline
        )
        is_normalized = info.normalize if normalize is None else normalize
        return Embedded(finish(raw, dimensions=dimensions, normalize=is_normalized), num_tokens)

    async def _embed_texts(
        self,
        said: int,
        inputs: Sequence[Input],
        is_truncating: bool,
        direction: Direction | None,
        prompt_name: str | None,
        vocab_size: int,
        deadline: float,
        outputs: int = 0,
    ) -> tuple[np.ndarray, Sequence[np.ndarray], int]:
        """`inputs` admitted, tokenized and embedded (`outputs`: an Output bitmask, 0 the dense
        vectors): the workers' raw rows, the token sequences and their token count."""

        async def run() -> tuple[np.ndarray, Sequence[np.ndarray], int]:
            admitted = self._admit(said, len(inputs), self._estimate(inputs, is_truncating))
            try:
                started = time.perf_counter()
                sequences = await self.tokenization.encode(
                    inputs,
                    truncate=is_truncating,
                    direction=direction,
                    prompt_name=prompt_name,
                    vocab_size=vocab_size,
                    is_bulk=admitted.is_bulk,
                )
                num_tokens = admitted.settle(self._observe_tokenized(started, len(inputs), sequences))
                raw = await self.pool.embed(
                    sequences, next(self._request_ids), deadline, priority=admitted.priority, outputs=outputs
                )
            finally:
                admitted.release()
            return raw, sequences, num_tokens

        return await self._run(run)

    def check_outputs(self, outputs: int) -> pb.InfoResponse:
        """The workers' Info, or InvalidInput (400) naming the outputs the model has when it lacks
        one of `outputs`."""
        info = self.worker_info()
        if info.task and info.task != "embed":
            raise Unsupported(f"the served model `{self.served_names[0]}` is not an embedding model")
        lacking = outputs & ~info.outputs
        if lacking:
            raise InvalidInput(
                f"the served model `{self.served_names[0]}` has no {', '.join(names_of(lacking))} output; "
                f"it has: {', '.join(names_of(info.outputs or DENSE))}",
                param="outputs",
            )
        return info

    async def embed_outputs(
        self,
        inputs: Sequence[Input],
        outputs: int,
        *,
        truncate: bool | None,
        direction: Direction | None,
        prompt_name: str | None,
        param: str = "input",
        priority: str | None = None,
    ) -> Outputs:
        """Every output in `outputs` (an Output bitmask) of each input, from one pass of the model."""
        said = said_priority(priority)
        self._check_count(len(inputs), param)
        info = self.check_outputs(outputs)
        vocab_size = info.vocab_size or self.tokenization.spec.vocab_size or 2**31 - 1
        deadline = self._deadline()
        is_truncating = self.config.auto_truncate if truncate is None else truncate

        raw, sequences, num_tokens = await self._embed_texts(
            said, inputs, is_truncating, direction, prompt_name, vocab_size, deadline, outputs
        )
        if info.sparse_vocabulary:  # SPLADE: each sequence's nonzero (id, weight) pairs
            try:
                pairs = read_vocabulary(raw.reshape(-1), len(sequences))
            except ValueError as error:
                raise WorkerFailed(f"the worker's sparse answer: {error}") from None
            return Outputs(
                [{"sparse_ids": ids, "sparse": values} for ids, values in pairs], sequences, num_tokens
            )
        shape = OutputShape(info.dimensions, info.colbert_dimensions, info.hidden_size)
        lengths = np.array([len(s) for s in sequences])
        counts = shape.rows_of(lengths, np.full(len(lengths), outputs))
        starts = np.cumsum(counts) - counts
        if int(counts.sum()) != len(raw):
            raise WorkerFailed(f"the worker answered {len(raw)} rows for {int(counts.sum())}")
        rows = [
            shape.split(raw[start : start + count], int(length), outputs)
            for start, count, length in zip(starts.tolist(), counts.tolist(), lengths.tolist(), strict=True)
        ]
        return Outputs(rows, sequences, num_tokens)

    async def embed_documents(
        self, documents: Sequence[Sequence[str]], *, dimensions: int | None, priority: str | None = None
    ) -> Embedded:
        """Late chunking: each document run as one sequence (its chunks' tokens joined, special tokens
        once), each chunk's vector the mean of its own tokens' hidden states (the worker's span
        pooling), normalised as the model does. Vectors [total chunks, dims], document by document."""
        said = said_priority(priority)
        self._check_count(len(documents), "input")
        config = self.config
        if len(documents) > config.max_context_documents:
            raise PayloadTooLarge(
                f"{len(documents)} documents is more than the limit of {config.max_context_documents} "
                "per request",
                param="input",
            )
        num_chunks = sum(len(chunks) for chunks in documents)
        if num_chunks > config.max_context_chunks:
            raise PayloadTooLarge(
                f"{num_chunks} chunks is more than the limit of {config.max_context_chunks} per request, "
                "all documents together",
                param="input",
            )
        info = self.worker_info()
        if info.task and info.task != "embed":
            raise Unsupported(f"the served model `{self.served_names[0]}` is not an embedding model")
        if dimensions is not None and not 1 <= dimensions <= info.dimensions:
            raise InvalidInput(
                f"dimensions must be between 1 and {info.dimensions}, got {dimensions}", param="dimensions"
            )
        # a document is one sequence: at most what the model takes, and the configured cap if lower
        model_limit = self.tokenization.spec.max_seq_length or info.max_sequence_length
        limits = [n for n in (model_limit, config.max_document_tokens) if n]
        max_tokens = min(limits) if limits else 2**31 - 1
        deadline = self._deadline()

        lengths = [sum(len(chunk) for chunk in chunks) for chunks in documents]

        async def run() -> tuple[np.ndarray, int]:
            admitted = self._admit(said, num_chunks, estimate_tokens(lengths, max_tokens))
            try:
                started = time.perf_counter()
                sequences, spans = await self.tokenization.encode_documents(documents, max_tokens)
                num_tokens = admitted.settle(self._observe_tokenized(started, num_chunks, sequences))
                raw = await self.pool.embed(
                    sequences, next(self._request_ids), deadline, list(spans), priority=admitted.priority
                )
            finally:
                admitted.release()
            return raw, num_tokens

        raw, num_tokens = await self._run(run)
        return Embedded(finish(raw, dimensions=dimensions, normalize=info.normalize), num_tokens)

    async def tokenize(
        self, texts: Sequence[str], *, add_special_tokens: bool, prompt_name: str | None
    ) -> bytes:
        """TEI's /tokenize answer, as JSON (Tokenization.tokenize)."""
        self._check_count(len(texts), "inputs")
        num_chars = sum(len(text) for text in texts)
        if num_chars > self.config.max_tokenize_chars:
            raise PayloadTooLarge(
                f"/tokenize takes at most {self.config.max_tokenize_chars} characters per request, "
                f"got {num_chars}; send the text in parts",
                param="inputs",
            )

        async def run() -> bytes:
            started = time.perf_counter()
            tokens = await self.tokenization.tokenize(
                texts,
                add_special_tokens=add_special_tokens,
                prompt_name=prompt_name,
                max_tokens=self.config.max_tokenize_tokens,
            )
            self.metrics.tokenize.observe(time.perf_counter() - started)
            return tokens

        return await self._run(run)

    async def rerank(
        self,
        query: str,
        texts: Sequence[str],
        *,
        truncate: bool | None,
        direction: Direction | None,
        raw: bool,
        param: str = "texts",
        priority: str | None = None,
    ) -> Scored:
        """One relevance score per text (sigmoid of the logit unless `raw`), in input order.

        Only a cross-encoder with one label ranks: an embedding model (task "embed") or a worker
        without Score is Unsupported (501), and so is a classifier with several labels (as TEI
        refuses /rerank for it: softmax over labels is not a relevance)."""
        said = said_priority(priority)
        self._check_count(len(texts), param)
        info = self.worker_info()
        name = self.served_names[0]
        if info.task and info.task != "score":
            raise Unsupported(
                f"the served model `{name}` does not support reranking: it is an embedding model "
                f"(task {info.task!r}), not a cross-encoder"
            )
        deadline = self._deadline()

        is_truncating = self.config.auto_truncate if truncate is None else truncate
        limit = self.tokenization.spec.max_seq_length if is_truncating else None
        estimate = estimate_tokens([len(query) + len(text) for text in texts], limit, specials=3)

        async def run() -> tuple[np.ndarray, int]:
            admitted = self._admit(said, len(texts), estimate)
            try:
                started = time.perf_counter()
                ids, type_ids = await self.tokenization.encode_pairs(
                    query, texts, truncate=is_truncating, direction=direction, param=param
                )
                num_tokens = admitted.settle(self._observe_tokenized(started, len(texts), ids))
                logits = await self.pool.score(
                    ids, type_ids, next(self._request_ids), deadline, priority=admitted.priority
                )
            finally:
                admitted.release()
            return logits, num_tokens

        try:
            logits, num_tokens = await self._run(run)
        except Unsupported as error:
            raise Unsupported(f"the served model does not support reranking: {error.message}") from None
        if logits.shape[1] != 1:
            raise Unsupported(
                f"the served model `{name}` does not support reranking: it is a classifier with "
                f"{logits.shape[1]} labels, a reranker has one"
            )
        return Scored(relevance(logits, raw=raw), num_tokens)
