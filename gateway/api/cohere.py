"""Cohere's v2 API: `POST /v2/embed` and `POST /v2/rerank`, as `cohere.ClientV2` and litellm call them;
and v1's `POST /v1/embed`, as `cohere.Client` calls it (v1's `/v1/rerank` is in app.py).

Request models and handlers over the shared `EmbeddingService`; errors are raised as everywhere else
and rendered by the app's one handler in Cohere's shape (`{"message"}`, errors.py). Cohere publishes
no rule for its quantized types: binary ones are sentence-transformers' `quantize_embeddings`, int8
ones the OpenAI route's per-row scale (vectors.py); docs/api.md says why.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.requests import Request
from starlette.responses import Response

from kembed.gateway.answer_size import value_bytes
from kembed.gateway.api.responses import json_response
from kembed.gateway.api.schemas import parse
from kembed.gateway.errors import InvalidInput, PayloadTooLarge
from kembed.gateway.service.service import PRIORITY_HEADER, Embedded, EmbeddingService
from kembed.gateway.vectors import pack_bits, quantize_int8, rank, to_base64
from kembed.proto.model_files import Direction

_STRICT = ConfigDict(strict=True, extra="forbid")  # unknown fields: 400 naming them (schemas.py)
_META = {"api_version": {"version": "2"}}
_META_V1 = {"api_version": {"version": "1"}}

EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]
InputType = Literal["search_query", "search_document", "classification", "clustering", "image"]


class _TextContent(BaseModel):
    model_config = _STRICT
    type: Literal["text"]
    text: str


class _ImageContent(BaseModel):
    """An image part, taken as Cohere's shape so that it is refused as an image (`_texts`)."""

    model_config = _STRICT
    type: Literal["image_url"]
    image_url: Any = None


class V2EmbedInput(BaseModel):
    """One of v2's `inputs`: content parts; text parts are embedded as one text, images refused."""

    model_config = _STRICT
    content: list[Annotated[_TextContent | _ImageContent, Field(discriminator="type")]] = Field(min_length=1)


class V2EmbedRequest(BaseModel):
    """`POST /v2/embed`, Cohere's v2 shape. `priority` (Cohere: lower is served earlier, 0 the
    default and highest) above 0 makes the request bulk (docs/scheduling.md) unless the
    X-Kembed-Priority header says otherwise; 0 or absent leaves it to the size rule."""

    model_config = _STRICT
    model: str | None = None
    texts: list[str] | None = None
    inputs: list[V2EmbedInput] | None = None
    images: list[Any] | None = None
    input_type: InputType | None = None
    embedding_types: list[EmbeddingType] | None = None
    output_dimension: int | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    truncate: Literal["NONE", "START", "END"] = "END"  # Cohere's default
    priority: int | None = Field(default=None, ge=0)


class V1EmbedRequest(BaseModel):
    """`POST /v1/embed`, Cohere's v1 shape (`cohere.Client().embed`): `texts`, the same options as
    v2 but `inputs`, `output_dimension` and `max_tokens`. Without `embedding_types` the answer is
    v1's `embeddings_floats` (the float vectors as a list), with them v2's `embeddings_by_type`."""

    model_config = _STRICT
    model: str | None = None
    texts: list[str] | None = None
    images: list[Any] | None = None
    input_type: InputType | None = None
    embedding_types: list[EmbeddingType] | None = None
    truncate: Literal["NONE", "START", "END"] = "END"  # Cohere's default


class V2RerankRequest(BaseModel):
    """`POST /v2/rerank`, Cohere's v2 shape: documents are strings (v1's objects are gone in v2).
    `priority` as `/v2/embed`'s: above 0 the request is bulk."""

    model_config = _STRICT
    model: str | None = None
    query: str
    documents: list[Any]
    top_n: int | None = Field(default=None, ge=1)
    max_tokens_per_doc: int | None = Field(default=None, ge=1)
    relevant_spans: dict[str, Any] | None = None
    priority: int | None = Field(default=None, ge=0)

    @field_validator("documents")
    @classmethod
    def _strings_only(cls, documents: list[Any]) -> list[Any]:
        for i, document in enumerate(documents):
            if not isinstance(document, str):
                kind = "an object" if isinstance(document, dict) else f"a {type(document).__name__}"
                raise ValueError(
                    f"documents[{i}] is {kind}; /v2/rerank takes each document as a string "
                    "(send the text itself, or use /v1/rerank for {'text': ...} objects)"
                )
        return documents


def encode_types(vectors: np.ndarray, types: list[EmbeddingType]) -> dict[str, Any]:
    """Cohere's `embeddings` object: one entry per requested type, in the order asked."""
    encoded: dict[str, Any] = {}
    for kind in types:
        if kind == "float":
            encoded[kind] = vectors
        elif kind == "base64":  # the float32 little-endian bytes of each row, as Cohere documents
            encoded[kind] = [to_base64(row) for row in vectors]
        elif kind in ("int8", "uint8"):
            signed = quantize_int8(vectors)
            encoded[kind] = signed if kind == "int8" else signed.astype(np.int16) + 128
        else:  # binary is ubinary less 128, as sentence-transformers' quantize_embeddings makes it
            unsigned = pack_bits(vectors, bitorder="big")
            encoded[kind] = unsigned if kind == "ubinary" else unsigned.astype(np.int16) - 128
    return encoded


def _texts(body: V2EmbedRequest) -> list[str]:
    if body.images:
        raise InvalidInput("images are not supported: kembed serves text embedding models", param="images")
    if body.input_type == "image":
        raise InvalidInput("input_type `image` is not supported: kembed serves text embedding models")
    if (body.texts is None) == (body.inputs is None):
        raise InvalidInput("send exactly one of `texts` and `inputs`", param="texts")
    if body.texts is not None:
        return body.texts
    texts = []
    for i, item in enumerate(body.inputs or []):
        for j, part in enumerate(item.content):
            if isinstance(part, _ImageContent):
                raise InvalidInput(
                    f"inputs[{i}].content[{j}] is an image; kembed serves text embedding models, "
                    "send `text` content",
                    param="inputs",
                )
        texts.append("\n".join(part.text for part in item.content if isinstance(part, _TextContent)))
    return texts


def _prompt_name(service: EmbeddingService, input_type: InputType | None) -> str | None:
    """The model's prompt for Cohere's `input_type`: `query` for search_query, `document` (or
    `passage`, as E5-style models name it) for search_document, a prompt of the same name for
    classification or clustering; else None, the model's default (none unless configured)."""
    prompts = service.tokenization.spec.prompts
    if input_type == "search_query":
        candidates = ["query"]
    elif input_type == "search_document":
        candidates = ["document", "passage"]
    elif input_type in ("classification", "clustering"):
        candidates = [input_type]
    else:
        return None
    named = [name for name in candidates if name in prompts]
    return next((name for name in named if prompts[name]), named[0] if named else None)


async def _cut(
    service: EmbeddingService, texts: list[str], max_tokens: int, side: Direction, *, refuse: bool, param: str
) -> list[str]:
    cut = await service.tokenization.cut(texts, max_tokens, side)
    if refuse:
        over = next((i for i, (a, b) in enumerate(zip(texts, cut, strict=True)) if len(b) < len(a)), None)
        if over is not None:
            raise PayloadTooLarge(
                f"{param}[{over}] has more than max_tokens={max_tokens} tokens; send truncate "
                '"END" or "START", or shorten it',
                param=param,
            )
    return cut


def _by_type(texts: list[str], embedded: Embedded, types: list[EmbeddingType]) -> dict[str, Any]:
    return {
        "id": uuid.uuid4().hex,
        "embeddings": encode_types(embedded.vectors, types),
        "texts": texts,
        "meta": _META | {"billed_units": {"input_tokens": embedded.num_tokens}},
        "response_type": "embeddings_by_type",
    }


class CohereRoutes:
    """The handlers of the two Cohere routes, bound to the shared service and to the app's body reader
    (its JSON media-type check and size cap)."""

    def __init__(self, service: EmbeddingService, read_body: Callable[[Request], Awaitable[bytes]]) -> None:
        self.service = service
        self._read_body = read_body

    async def embed(self, request: Request) -> Response:
        body = parse(V2EmbedRequest, await self._read_body(request))
        texts, embedded = await self._embed(body, request)
        default: list[EmbeddingType] = ["float"]
        return json_response(_by_type(texts, embedded, list(dict.fromkeys(body.embedding_types or default))))

    async def embed_v1(self, request: Request) -> Response:
        """Cohere's v1 embed: v2's, answered in v1's float shape unless types are asked for."""
        v1 = parse(V1EmbedRequest, await self._read_body(request))
        body = V2EmbedRequest.model_construct(**v1.model_dump())  # the same fields, checked already
        if body.texts is None:
            raise InvalidInput("send `texts`, a list of strings", param="texts")
        texts, embedded = await self._embed(body, request)
        if body.embedding_types:
            return json_response(_by_type(texts, embedded, list(dict.fromkeys(body.embedding_types))))
        return json_response(
            {
                "id": uuid.uuid4().hex,
                "embeddings": embedded.vectors,
                "texts": texts,
                "meta": _META_V1 | {"billed_units": {"input_tokens": embedded.num_tokens}},
                "response_type": "embeddings_floats",
            }
        )

    async def _embed(self, body: V2EmbedRequest, request: Request) -> tuple[list[str], Embedded]:
        """The texts of an embed request and their vectors, as both versions take them."""
        self.service.check_model(body.model)
        texts = _texts(body)
        param = "texts" if body.texts is not None else "inputs"
        dimensions = body.output_dimension
        self.service.check_dimensions(dimensions, self.service.worker_info(), "output_dimension")
        side: Direction = "left" if body.truncate == "START" else "right"
        is_truncating = body.truncate != "NONE"
        if body.max_tokens is not None and texts:
            texts_run = await _cut(
                self.service, texts, body.max_tokens, side, refuse=not is_truncating, param=param
            )
        else:
            texts_run = texts
        try:
            embedded = await self.service.embed(
                texts_run,
                truncate=is_truncating,
                direction=side,
                prompt_name=_prompt_name(self.service, body.input_type),
                dimensions=dimensions,
                normalize=None,
                param=param,
                priority=request.headers.get(PRIORITY_HEADER, "bulk" if body.priority else None),
                value_bytes=value_bytes(dict.fromkeys(body.embedding_types or ["float"])),
                dimensions_param="output_dimension",
            )
        except PayloadTooLarge as error:  # say it in this API's words
            message = error.message.replace("send truncate=true", 'send truncate "END" or "START"')
            raise PayloadTooLarge(message, param=error.param) from None
        return texts, embedded

    async def rerank(self, request: Request) -> Response:
        body = parse(V2RerankRequest, await self._read_body(request))
        self.service.check_model(body.model)
        if body.relevant_spans and body.relevant_spans.get("mode") == "enabled":
            raise InvalidInput("relevant_spans are not supported by this server", param="relevant_spans")
        documents: list[str] = body.documents
        if body.max_tokens_per_doc is not None and documents:
            documents = await self.service.tokenization.cut(documents, body.max_tokens_per_doc, "right")
        scored = await self.service.rerank(
            body.query,
            documents,
            truncate=None,
            direction=None,
            raw=False,
            param="documents",
            priority=request.headers.get(PRIORITY_HEADER, "bulk" if body.priority else None),
        )
        results = [
            {"index": i, "relevance_score": float(scored.scores[i])} for i in rank(scored.scores, body.top_n)
        ]
        return json_response(
            {
                "id": uuid.uuid4().hex,
                "results": results,
                "meta": _META | {"billed_units": {"input_tokens": scored.num_tokens}},
            }
        )
