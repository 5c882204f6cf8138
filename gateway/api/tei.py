"""text-embeddings-inference's routes: `/embed`, `/rerank`, its root route (which
`huggingface_hub.InferenceClient(base_url=...)` posts to), `/similarity` and `/decode` (`/tokenize`
and `/info` are in app.py).

`POST /` serves whatever the body asks for, as TEI's does: `{"query", "texts"}` is a rerank, `{"inputs":
{"source_sentence", "sentences"}}` a similarity, any other `{"inputs"}` an embedding.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import cast

import numpy as np
import orjson
from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import Response

from kembed.gateway.api.responses import json_response
from kembed.gateway.api.schemas import (
    _STRICT,
    EmbedRequest,
    RerankRequest,
    TruncationDirection,
    as_direction,
    as_input_list,
    parse,
)
from kembed.gateway.errors import InvalidInput, PayloadTooLarge
from kembed.gateway.service.service import PRIORITY_HEADER, EmbeddingService
from kembed.gateway.vectors import rank

BodyReader = Callable[[Request], Awaitable[bytes]]


class SentencePair(BaseModel):
    model_config = _STRICT
    source_sentence: str
    sentences: list[str] = Field(min_length=1)


class SimilarityParameters(BaseModel):
    """TEI's `parameters` of `/similarity` (Hugging Face's sentence-similarity task)."""

    model_config = _STRICT
    truncate: bool | None = None
    truncation_direction: TruncationDirection | None = None
    prompt_name: str | None = None


class SimilarityRequest(BaseModel):
    """`POST /similarity`, TEI's shape: the options in `parameters`. kembed also takes them beside
    `inputs`, as its `/embed` does; one given in both places must say the same."""

    model_config = _STRICT
    inputs: SentencePair
    parameters: SimilarityParameters | None = None
    truncate: bool | None = None
    truncation_direction: TruncationDirection | None = None
    prompt_name: str | None = None

    def options(self) -> SimilarityParameters:
        """The options, from `parameters` or beside `inputs`; InvalidInput for one given in both
        places (which would win is no rule a client can know)."""
        said = self.parameters.model_dump(exclude_none=True) if self.parameters else {}
        beside = {
            name: getattr(self, name)
            for name in SimilarityParameters.model_fields
            if getattr(self, name) is not None
        }
        for name in sorted(said.keys() & beside.keys()):
            raise InvalidInput(
                f"{name} is given twice, in parameters and beside inputs; send it once "
                "(in parameters, TEI's place)",
                param=name,
            )
        return SimilarityParameters.model_validate(beside | said)


class DecodeRequest(BaseModel):
    """`POST /decode`, TEI's shape: one sequence of ids or several."""

    model_config = _STRICT
    ids: list[int] | list[list[int]]
    skip_special_tokens: bool = True


class TeiRoutes:
    """The handlers, over the service the other routes share and their size-capped body reader."""

    def __init__(
        self, service: EmbeddingService, read_body: BodyReader, read_body_now: BodyReader | None = None
    ) -> None:
        self.service = service
        self.read_body = read_body
        # /decode's: it needs no worker, so is never held for one (hold.py)
        self.read_body_now = read_body_now or read_body

    async def root(self, request: Request) -> Response:
        body = await self.read_body(request)
        priority = request.headers.get(PRIORITY_HEADER)
        try:
            shape = orjson.loads(body)
        except orjson.JSONDecodeError as error:
            raise InvalidInput(f"malformed JSON body: {error}") from None
        if not isinstance(shape, dict):
            raise InvalidInput("invalid request: body: Input should be an object")
        if "query" in shape and "texts" in shape:
            return await self.rerank_body(body, priority)
        inputs = shape.get("inputs")
        if isinstance(inputs, dict) and "source_sentence" in inputs:
            return await self.similarity_body(body, priority)
        return await self.embed_body(body, priority)

    async def embed(self, request: Request) -> Response:
        return await self.embed_body(await self.read_body(request), request.headers.get(PRIORITY_HEADER))

    async def rerank(self, request: Request) -> Response:
        return await self.rerank_body(await self.read_body(request), request.headers.get(PRIORITY_HEADER))

    async def embed_body(self, body: bytes, priority: str | None = None) -> Response:
        request = parse(EmbedRequest, body)
        embedded = await self.service.embed(
            as_input_list(request.inputs),
            truncate=request.truncate,
            direction=as_direction(request.truncation_direction),
            prompt_name=request.prompt_name,
            dimensions=request.dimensions,
            normalize=request.normalize,
            param="inputs",
            priority=priority,
        )
        return json_response(embedded.vectors)

    async def rerank_body(self, body: bytes, priority: str | None = None) -> Response:
        request = parse(RerankRequest, body)
        scored = await self.service.rerank(
            request.query,
            request.texts,
            truncate=request.truncate,
            direction=as_direction(request.truncation_direction),
            raw=request.raw_scores,
            priority=priority,
        )
        return json_response(
            [
                {"index": i, "score": float(scored.scores[i])}
                | ({"text": request.texts[i]} if request.return_text else {})
                for i in rank(scored.scores)
            ]
        )

    async def similarity(self, request: Request) -> Response:
        return await self.similarity_body(await self.read_body(request), request.headers.get(PRIORITY_HEADER))

    async def similarity_body(self, body: bytes, priority: str | None = None) -> Response:
        """Cosine similarity of the source sentence to each of the others, in their order."""
        request = parse(SimilarityRequest, body)
        pair = request.inputs
        options = request.options()
        embedded = await self.service.embed(
            [pair.source_sentence, *pair.sentences],
            truncate=options.truncate,
            direction=as_direction(options.truncation_direction),
            prompt_name=options.prompt_name,
            dimensions=None,
            normalize=True,
            param="inputs",
            priority=priority,
        )
        vectors = embedded.vectors.astype(np.float64)
        norms = np.maximum(np.linalg.norm(vectors, axis=1), 1e-12)
        similarities = vectors[1:] @ vectors[0] / (norms[1:] * norms[0])
        return json_response([float(s) for s in similarities])

    async def decode(self, request: Request) -> Response:
        """The texts of token id sequences, as the tokenizer decodes them; ids outside the vocabulary
        are refused (the tokenizer would drop them silently)."""
        body = parse(DecodeRequest, await self.read_body_now(request))
        sequences: list[list[int]] = (
            [cast(list[int], body.ids)]  # one sequence of ids, or none
            if not body.ids or isinstance(body.ids[0], int)
            else body.ids
        )
        num_ids = sum(len(ids) for ids in sequences)
        max_ids = self.service.config.max_tokenize_tokens  # /tokenize's inverse, bounded alike
        if num_ids > max_ids:
            raise PayloadTooLarge(
                f"/decode takes at most {max_ids} ids per request, all sequences together, got "
                f"{num_ids}; send them in parts",
                param="ids",
            )
        vocab_size = self.service.tokenization.vocab_size
        for i, ids in enumerate(sequences):
            bad = next((t for t in ids if not 0 <= t < vocab_size), None)
            if bad is not None:
                raise InvalidInput(f"ids {i} has token id {bad} outside [0, {vocab_size})", param="ids")
        texts = await self.service.tokenization.decode(
            sequences, skip_special_tokens=body.skip_special_tokens
        )
        return json_response(texts)
