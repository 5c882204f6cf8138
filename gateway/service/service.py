"""The request flow both API shapes share: check limits, tokenize, run on workers, finish vectors.

Routes parse their own body shape and render their own response; everything between is here, so the
OpenAI and TEI routes cannot drift apart in limits, truncation or normalisation.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from kembed.gateway import answer_size
from kembed.gateway.answer_size import ITEM_BYTES, SPARSE_ENTRY_BYTES, VALUE_BYTES, vectors
from kembed.gateway.config import GatewayConfig
from kembed.gateway.errors import (
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    Unavailable,
    Unsupported,
    WorkerFailed,
)
from kembed.gateway.metrics import GatewayMetrics
from kembed.gateway.pool.workers import WorkerPool
from kembed.gateway.service.admission import estimate_tokens
from kembed.gateway.service.hold import Hold
from kembed.gateway.service.request_gate import PRIORITY_HEADER as PRIORITY_HEADER
from kembed.gateway.service.request_gate import RequestGate, said_priority
from kembed.gateway.tokenizing.tokenization import Input, Tokenization
from kembed.gateway.vectors import finish, relevance
from kembed.proto import embedder_pb2 as pb
from kembed.proto.model_files import Direction
from kembed.proto.outputs import COLBERT, DENSE, SPARSE, TOKENS, OutputShape, names_of, read_vocabulary

FLOAT_BYTES = VALUE_BYTES["float"]
# How a route names each output, for the error that lists those the model has: `/v1/embeddings`'
# `outputs` field by its values (the default), TEI's routes by route.
OUTPUT_FIELD: Mapping[str, str] = {"dense": "dense", "sparse": "sparse", "colbert": "colbert"}
TEI_OUTPUTS: Mapping[str, str] = {
    "dense": "dense (/embed)", "sparse": "sparse (/embed_sparse)", "tokens": "token vectors (/embed_all)",
}  # fmt: skip
_SMALLER = "send fewer inputs, fewer dimensions, or a base64 encoding_format (float JSON is ~2.4x larger)"


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
        self.gate = RequestGate(config, pool, metrics)
        self.hold = Hold(config, pool, metrics)  # requests held while no worker serves (hold.py)
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

    def check_dimensions(
        self, dimensions: int | None, info: pb.InfoResponse, param: str = "dimensions"
    ) -> int:
        """The width of the vectors answered: `dimensions` if given (InvalidInput unless from 1 to
        the model's), else the model's."""
        if dimensions is None:
            return info.dimensions
        if not 1 <= dimensions <= info.dimensions:
            raise InvalidInput(
                f"{param} must be between 1 and {info.dimensions}, got {dimensions}", param=param
            )
        return dimensions

    def _check_count(self, num_inputs: int, param: str) -> None:
        if num_inputs == 0:
            raise InvalidInput(f"`{param}` must not be empty", param=param)
        if num_inputs > self.config.max_client_batch_size:
            raise PayloadTooLarge(
                f"{num_inputs} inputs is more than the limit of "
                f"{self.config.max_client_batch_size} per request",
                param=param,
            )

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
        value_bytes: float = FLOAT_BYTES,
        dimensions_param: str = "dimensions",
        task: str | None = None,
    ) -> Embedded:
        """Vectors of `inputs` in order. `normalize=None` follows the model (its Normalize module).
        `priority`: the request's X-Kembed-Priority header, if any. `value_bytes`: what a component
        takes in the answer's encoding(s) (answer_size.py), for the answer's size cap. `task`: a
        multi-task model's adapter (`task_of`)."""
        said = said_priority(priority)
        self._check_count(len(inputs), param)
        info = self.worker_info()
        adapter = self.task_of(task, prompt_name, info)
        if task is not None and prompt_name is None and task in self.tokenization.spec.prompts:
            prompt_name = task  # the task's instruction, as Jina's API and its encode(task=) add it
        width = self.check_dimensions(dimensions, info, dimensions_param)
        answer_size.check(
            vectors(len(inputs), width, value_bytes) + len(inputs) * ITEM_BYTES,
            self.config.max_answer_bytes,
            f"{len(inputs)} vectors of {width} values",
            _SMALLER,
        )
        vocab_size = info.vocab_size or self.tokenization.spec.vocab_size or 2**31 - 1
        deadline = self._deadline()

        is_truncating = self.config.auto_truncate if truncate is None else truncate

        raw, _, num_tokens = await self._embed_texts(
            said, inputs, is_truncating, direction, prompt_name, vocab_size, deadline, task=adapter
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
        check: Callable[[Sequence[np.ndarray]], None] | None = None,
        task: tuple[str, int] = ("", 0),
    ) -> tuple[np.ndarray, Sequence[np.ndarray], int]:
        """`inputs` admitted, tokenized and embedded (`outputs`: an Output bitmask, 0 the dense
        vectors): the workers' raw rows, the token sequences and their token count. `check` sees
        the sequences before they go to the workers (the answer's size, which their tokens set)."""

        async def run() -> tuple[np.ndarray, Sequence[np.ndarray], int]:
            admitted = self.gate.admit(said, len(inputs), self._estimate(inputs, is_truncating), deadline)
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
                if check is not None:
                    check(sequences)
                raw = await self.pool.embed(
                    sequences,
                    next(self._request_ids),
                    deadline,
                    priority=admitted.priority,
                    outputs=outputs,
                    task=task,
                )
            finally:
                admitted.release()
            return raw, sequences, num_tokens

        return await self.gate.run(run)

    def task_of(self, task: str | None, prompt_name: str | None, info: pb.InfoResponse) -> tuple[str, int]:
        """A multi-task model's adapter for a request (name, number in a RequestFrame): the `task` it
        names, else the one its `prompt_name` names (jina-embeddings-v3's prompts are its tasks), else
        the workers' default ("", 0). InvalidInput (400) for a `task` the model lacks."""
        tasks = list(info.tasks)
        if task is not None:
            name = self.served_names[0]
            if not tasks:
                raise InvalidInput(
                    f"the served model `{name}` has no task adapters; leave out `task`", param="task"
                )
            if task not in tasks:
                raise InvalidInput(
                    f"task {task!r} is not one of the served model `{name}`'s: {', '.join(tasks)}",
                    param="task",
                )
            return task, tasks.index(task) + 1
        if prompt_name is not None and prompt_name in tasks:
            return prompt_name, tasks.index(prompt_name) + 1
        return "", 0

    def check_outputs(self, outputs: int, offered: Mapping[str, str] = OUTPUT_FIELD) -> pb.InfoResponse:
        """The workers' Info, or InvalidInput (400) when the model lacks one of `outputs`, naming
        those it has as the route takes them (`offered`: output name to its name there)."""
        info = self.worker_info()
        if info.task and info.task != "embed":
            raise Unsupported(f"the served model `{self.served_names[0]}` is not an embedding model")
        lacking = outputs & ~info.outputs
        if lacking:
            has = [offered[name] for name in names_of(info.outputs or DENSE) if name in offered]
            raise InvalidInput(
                f"the served model `{self.served_names[0]}` has no {', '.join(names_of(lacking))} output; "
                f"it has: {', '.join(has) or 'none of them'}",
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
        offered: Mapping[str, str] = OUTPUT_FIELD,
        dimensions: int | None = None,
        value_bytes: float = FLOAT_BYTES,
        task: str | None = None,
    ) -> Outputs:
        """Every output in `outputs` (an Output bitmask) of each input, from one pass of the model.
        Checked before the model runs: the outputs (named as `offered`), `dimensions` (the width
        the caller cuts dense and ColBERT vectors to) and the answer's size, its vectors in
        `value_bytes` a component (token vectors as float JSON, TEI's only form)."""
        said = said_priority(priority)
        self._check_count(len(inputs), param)
        info = self.check_outputs(outputs, offered)
        width = self.check_dimensions(dimensions, info)
        adapter = self.task_of(task, prompt_name, info)
        if task is not None and prompt_name is None and task in self.tokenization.spec.prompts:
            prompt_name = task
        vocab_size = info.vocab_size or self.tokenization.spec.vocab_size or 2**31 - 1
        deadline = self._deadline()
        is_truncating = self.config.auto_truncate if truncate is None else truncate

        def check_size(sequences: Sequence[np.ndarray]) -> None:
            if info.sparse_vocabulary:
                return  # its entries are known once it ran (below)
            lengths = np.array([len(s) for s in sequences], np.int64)
            num_tokens = int(lengths.sum())
            colbert = min(width, info.colbert_dimensions)
            sizes = {
                DENSE: vectors(len(sequences), width, value_bytes),
                COLBERT: vectors(num_tokens - len(sequences), colbert, value_bytes),
                TOKENS: vectors(num_tokens, info.hidden_size, FLOAT_BYTES),
                SPARSE: num_tokens * SPARSE_ENTRY_BYTES,  # at most an entry a token
            }
            answer_size.check(
                sum(size for kind, size in sizes.items() if outputs & kind) + len(sequences) * ITEM_BYTES,
                self.config.max_answer_bytes,
                f"{', '.join(names_of(outputs))} of {len(sequences)} inputs, {num_tokens} tokens",
                "send fewer inputs or shorter ones, fewer outputs or dimensions, or a base64 encoding_format",
            )

        raw, sequences, num_tokens = await self._embed_texts(
            said,
            inputs,
            is_truncating,
            direction,
            prompt_name,
            vocab_size,
            deadline,
            outputs,
            check_size,
            adapter,
        )
        if info.sparse_vocabulary:  # SPLADE: each sequence's nonzero (id, weight) pairs
            try:
                pairs = read_vocabulary(raw.reshape(-1), len(sequences))
            except ValueError as error:
                raise WorkerFailed(f"the worker's sparse answer: {error}") from None
            num_entries = sum(len(ids) for ids, _ in pairs)
            answer_size.check(
                num_entries * SPARSE_ENTRY_BYTES,
                self.config.max_answer_bytes,
                f"{num_entries} sparse entries of {len(sequences)} inputs",
                "send fewer inputs",
            )
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
        self,
        documents: Sequence[Sequence[str]],
        *,
        dimensions: int | None,
        priority: str | None = None,
        value_bytes: float = FLOAT_BYTES,
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
        width = self.check_dimensions(dimensions, info)
        answer_size.check(
            vectors(num_chunks, width, value_bytes) + len(documents) * ITEM_BYTES,
            config.max_answer_bytes,
            f"{num_chunks} vectors of {width} values",
            _SMALLER,
        )
        # a document is one sequence: at most what the model takes, and the configured cap if lower
        model_limit = self.tokenization.spec.max_seq_length or info.max_sequence_length
        limits = [n for n in (model_limit, config.max_document_tokens) if n]
        max_tokens = min(limits) if limits else 2**31 - 1
        deadline = self._deadline()

        lengths = [sum(len(chunk) for chunk in chunks) for chunks in documents]

        async def run() -> tuple[np.ndarray, int]:
            admitted = self.gate.admit(said, num_chunks, estimate_tokens(lengths, max_tokens), deadline)
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

        raw, num_tokens = await self.gate.run(run)
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

        return await self.gate.run(run)

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
        specials = self.tokenization.pair_specials
        estimate = estimate_tokens([len(query) + len(text) for text in texts], limit, specials=specials)

        async def run() -> tuple[np.ndarray, int]:
            admitted = self.gate.admit(said, len(texts), estimate, deadline)
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
            logits, num_tokens = await self.gate.run(run)
        except Unsupported as error:
            raise Unsupported(f"the served model does not support reranking: {error.message}") from None
        if logits.shape[1] != 1:
            raise Unsupported(
                f"the served model `{name}` does not support reranking: it is a classifier with "
                f"{logits.shape[1]} labels, a reranker has one"
            )
        return Scored(relevance(logits, raw=raw), num_tokens)
