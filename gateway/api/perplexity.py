"""Perplexity's contextualized embeddings: `POST /v1/contextualizedembeddings`.

Each document (a list of chunks, in order) is one sequence for the model; each chunk's vector is the
mean of its own tokens' hidden states in that sequence ("late chunking": the worker's span pooling,
documents.py for how a document is assembled). The answer nests as Perplexity's SDK reads it: per
document `{"object", "index", "data": [per chunk {"object": "embedding", "index", "embedding"}]}`.
Errors are OpenAI's shape, as on every `/v1/` route (errors.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import numpy as np
from pydantic import BaseModel, ConfigDict, field_validator
from starlette.requests import Request
from starlette.responses import Response

from kembed.gateway.answer_size import VALUE_BYTES
from kembed.gateway.api.responses import json_response
from kembed.gateway.api.schemas import parse
from kembed.gateway.service.service import PRIORITY_HEADER, EmbeddingService
from kembed.gateway.vectors import EncodingFormat, encode

_STRICT = ConfigDict(strict=True, extra="forbid")  # unknown fields: 400 naming them (schemas.py)


class ContextualizedEmbeddingRequest(BaseModel):
    """`POST /v1/contextualizedembeddings`, Perplexity's shape. `encoding_format` defaults to
    Perplexity's `base64_int8`; `float` and `base64` are taken as on `/v1/embeddings`."""

    model_config = _STRICT
    input: list[list[str]]
    model: str | None = None
    dimensions: int | None = None
    encoding_format: EncodingFormat = "base64_int8"

    @field_validator("input")
    @classmethod
    def _chunks_with_text(cls, documents: list[list[str]]) -> list[list[str]]:
        for i, chunks in enumerate(documents):
            if not chunks:
                raise ValueError(f"input[{i}] is an empty document; send at least one chunk")
            for j, chunk in enumerate(chunks):
                if not chunk:
                    raise ValueError(f"input[{i}][{j}] is an empty string; chunks must have text")
        return documents


class PerplexityRoutes:
    """The handler of `/v1/contextualizedembeddings` over the shared service."""

    def __init__(self, service: EmbeddingService, body: Callable[[Request], Awaitable[bytes]]) -> None:
        self.service = service
        self._body = body

    async def contextualized_embeddings(self, request: Request) -> Response:
        body = parse(ContextualizedEmbeddingRequest, await self._body(request))
        self.service.check_model(body.model)
        embedded = await self.service.embed_documents(
            body.input,
            dimensions=body.dimensions,
            priority=request.headers.get(PRIORITY_HEADER),
            value_bytes=VALUE_BYTES[body.encoding_format],
        )
        rows = encode(embedded.vectors, body.encoding_format)
        ends = np.cumsum([len(chunks) for chunks in body.input]).tolist()
        data = []
        start = 0
        for i, end in enumerate(ends):
            chunks = [
                {"object": "embedding", "index": j, "embedding": row} for j, row in enumerate(rows[start:end])
            ]
            data.append({"object": "list", "index": i, "data": chunks})
            start = end
        usage = {"prompt_tokens": embedded.num_tokens, "total_tokens": embedded.num_tokens}
        return json_response(
            {"object": "list", "data": data, "model": self.service.served_names[0], "usage": usage}
        )
