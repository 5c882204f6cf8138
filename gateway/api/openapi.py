"""The gateway's OpenAPI 3.1 document, served at `/openapi.json`: request bodies from the same pydantic
models that validate them, responses from the models below (which describe what the routes write;
a test checks every route's real answers against them, and schemathesis drives the whole document).

Built once per app from the route table in `ROUTES`; a route added without an entry here is caught by
the test that compares this table with the app's routes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from pydantic.json_schema import models_json_schema

from kembed.gateway.api.cohere import V1EmbedRequest, V2EmbedRequest, V2RerankRequest
from kembed.gateway.api.multi_output import TeiOutputsRequest, TeiSparseValue
from kembed.gateway.api.openapi_limits import Served, constrain
from kembed.gateway.api.perplexity import ContextualizedEmbeddingRequest
from kembed.gateway.api.schemas import (
    EmbeddingRequest,
    EmbedRequest,
    RerankRequest,
    TokenizeRequest,
    V1RerankRequest,
)
from kembed.gateway.api.tei import DecodeRequest, SimilarityRequest
from kembed.proto.routes import TASK_ROUTES

# Responses. Extra keys are allowed where the route may grow (the document promises what is there).
_OPEN = ConfigDict(extra="allow")


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingObject(BaseModel):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str  # a string for the base64 encoding formats


class SparseEmbedding(BaseModel):
    """A sparse vector as vector databases take it: ids increasing, their weights."""

    indices: list[int]
    values: list[float]


class EmbeddingItem(BaseModel):
    """One item of `/v1/embeddings`: `embedding` unless `outputs` leaves dense out; the others for
    the `outputs` asked."""

    object: Literal["embedding"]
    index: int
    embedding: list[float] | str | None = None  # a string for the base64 encoding formats
    sparse_embedding: SparseEmbedding | None = None
    colbert_embedding: list[list[float]] | list[str] | None = None  # a vector per token but the first


class EmbeddingList(BaseModel):
    object: Literal["list"]
    data: list[EmbeddingItem]
    model: str
    usage: Usage


class ContextualizedDocument(BaseModel):
    object: Literal["list"]
    index: int
    data: list[EmbeddingObject]


class ContextualizedEmbeddingList(BaseModel):
    object: Literal["list"]
    data: list[ContextualizedDocument]
    model: str
    usage: Usage


class ModelObject(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelObject]


class Token(BaseModel):
    id: int
    text: str
    special: bool
    start: int | None  # UTF-8 byte offsets; none for a special token
    stop: int | None


class TeiRank(BaseModel):
    index: int
    score: float
    text: str | None = None


class RerankedDocument(BaseModel):
    text: str


class V1RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: RerankedDocument | None = None


class V1RerankUsage(BaseModel):
    total_tokens: int


class V1RerankResponse(BaseModel):
    id: str
    model: str
    results: list[V1RerankResult]
    usage: V1RerankUsage


class CohereMeta(BaseModel):
    model_config = _OPEN
    api_version: dict[str, Any]
    billed_units: dict[str, int]


class V2EmbedResponse(BaseModel):
    id: str
    embeddings: dict[str, list[list[float]] | list[list[int]] | list[str]]
    texts: list[str]
    meta: CohereMeta
    response_type: Literal["embeddings_by_type"]


class V1EmbedResponse(BaseModel):
    id: str
    embeddings: list[list[float]] | dict[str, list[list[float]] | list[list[int]] | list[str]]
    texts: list[str]
    meta: CohereMeta
    response_type: Literal["embeddings_floats", "embeddings_by_type"]  # floats unless types were asked


class V2RerankResult(BaseModel):
    index: int
    relevance_score: float


class V2RerankResponse(BaseModel):
    id: str
    results: list[V2RerankResult]
    meta: CohereMeta


class Info(BaseModel):
    model_config = _OPEN
    model_id: str
    served_model_name: str
    served_model_names: list[str]
    model_type: dict[str, Any]
    max_input_length: int | None
    max_client_batch_size: int
    auto_truncate: bool
    version: str
    workers: list[dict[str, Any]]


class Status(BaseModel):
    status: str


class OpenAIErrorBody(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIError(BaseModel):
    error: OpenAIErrorBody


class TeiError(BaseModel):
    error: str
    error_type: Literal["Unhealthy", "Backend", "Overloaded", "Validation", "Tokenizer", "Empty"]  # TEI's


class CohereError(BaseModel):
    message: str


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    summary: str
    request: type[BaseModel] | None
    response: Any  # a model, or a JSON schema
    errors: type[BaseModel] = TeiError
    media_type: str = "application/json"

    @property
    def task(self) -> str | None:
        """The worker task the route needs ("embed", "score"), or None for any."""
        return next((task for task, paths in TASK_ROUTES.items() if self.path in paths), None)


def _array(items: Any) -> dict[str, Any]:
    return {"type": "array", "items": items}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


_FLOATS = _array({"type": "number"})

ROUTES: tuple[Operation, ...] = (
    Operation("post", "/v1/embeddings", "Embeddings (OpenAI; Perplexity's formats)", EmbeddingRequest,
              EmbeddingList, OpenAIError),
    Operation("get", "/v1/models", "Served model names (OpenAI)", None, ModelList, OpenAIError),
    Operation("post", "/v1/contextualizedembeddings", "Chunk embeddings in their document's context "
              "(Perplexity)", ContextualizedEmbeddingRequest, ContextualizedEmbeddingList, OpenAIError),
    Operation("post", "/v1/rerank", "Rerank (Cohere v1 / Jina)", V1RerankRequest, V1RerankResponse,
              OpenAIError),
    Operation("post", "/v1/embed", "Embeddings (Cohere v1)", V1EmbedRequest, V1EmbedResponse, OpenAIError),
    Operation("post", "/v2/embed", "Embeddings by type (Cohere v2)", V2EmbedRequest, V2EmbedResponse,
              CohereError),
    Operation("post", "/v2/rerank", "Rerank (Cohere v2)", V2RerankRequest, V2RerankResponse, CohereError),
    Operation("post", "/embed", "Embeddings (TEI)", EmbedRequest, _array(_FLOATS)),
    Operation("post", "/embed_sparse", "Sparse (lexical) vectors: each token id's weight (TEI)",
              TeiOutputsRequest, _array(_array(_ref("TeiSparseValue")))),
    Operation("post", "/embed_all", "Every token's vector (TEI)", TeiOutputsRequest, _array(_array(_FLOATS))),
    Operation("post", "/rerank", "Rerank (TEI)", RerankRequest, _array(_ref("TeiRank"))),
    Operation("post", "/tokenize", "Tokens with UTF-8 byte offsets (TEI)", TokenizeRequest,
              _array(_array(_ref("Token")))),
    Operation("post", "/similarity", "Cosine of a sentence to others (TEI)", SimilarityRequest,
              _array({"type": "number"})),
    Operation("post", "/decode", "Text of token ids (TEI)", DecodeRequest, _array({"type": "string"})),
    Operation("post", "/", "TEI's root route: embed, rerank or similarity, by the body", None,
              {"oneOf": [_array(_FLOATS), _array(_ref("TeiRank")), _array({"type": "number"})]}),
    Operation("get", "/", "Model and limits (as /info)", None, Info),
    Operation("get", "/info", "Model, limits and each worker's state (TEI's fields and more)", None, Info),
    Operation("get", "/health", "The gateway process is up", None, Status),
    Operation("get", "/ready", "At least one worker is serving", None, Status),
    Operation("get", "/metrics", "Prometheus text exposition", None, {"type": "string"}, TeiError,
              "text/plain"),
    Operation("get", "/openapi.json", "This document", None, {"type": "object"}),
    Operation("get", "/docs", "Swagger UI over this document", None, {"type": "string"}, TeiError,
              "text/html"),
)  # fmt: skip


# The fields each request model takes beyond its peer API's own (OpenAI's, TEI's, Cohere's,
# Perplexity's): written into the document as `x-kembed-extensions` and in each field's description.
# Every other field is the peer API's; any field neither defines is refused naming it (schemas.py),
# and tests/gateway/test_request_fields.py holds each model to its peer's fields and these.
EXTENSIONS: dict[str, tuple[str, ...]] = {
    "EmbeddingRequest": ("prompt_name", "outputs"),  # and Perplexity's two encoding_format values
    "EmbedRequest": ("encoding_format",),  # huggingface_hub's feature_extraction sends it; float only
    "SimilarityRequest": ("truncate", "truncation_direction", "prompt_name"),  # TEI's parameters, beside
}


def _mark_extensions(schemas: dict[str, Any]) -> None:
    for model, names in EXTENSIONS.items():
        schema = schemas.get(model)
        if schema is None:
            continue
        schema["x-kembed-extensions"] = list(names)
        for name in names:
            field = schema["properties"][name]
            said = field.get("description")
            field["description"] = "kembed's extension" + (f": {said}" if said else "")


def _root_body(task: str | None) -> dict[str, Any]:
    """TEI's root route takes an embed or similarity body for an embedding model, a rerank body
    for a cross-encoder."""
    bodies = {"embed": ["EmbedRequest", "SimilarityRequest"], "score": ["RerankRequest"]}
    names = bodies.get(task or "", ["EmbedRequest", "RerankRequest", "SimilarityRequest"])
    return {"oneOf": [_ref(name) for name in names]} if len(names) > 1 else _ref(names[0])


# What each error status means, for every route that takes a body.
_ERRORS = {
    "400": "Invalid request (OpenAI and Cohere routes)",
    "404": "Unknown model (the request's `model` is not a served name)",
    "413": "Too large: body, inputs, tokens, or characters to tokenize",
    "415": "Body not declared application/json",
    "422": "Invalid request (TEI routes)",
    "429": "Overloaded: retry after Retry-After seconds",
    "501": "The served model cannot do this (e.g. rerank on an embedding model)",
    "503": "No worker is serving",
    "504": "The request did not complete within its deadline",
}


# the outputs an embedding route needs one of (GET /info's `outputs`); the others need dense
_OUTPUT_ROUTES = {
    "/embed_sparse": ("sparse",),
    "/embed_all": ("tokens",),
    "/v1/embeddings": ("dense", "sparse", "colbert"),  # with `outputs`, any of them
    "/": ("dense",),  # an embedding model's root route is TEI's /embed
}


def build(
    version: str,
    *,
    has_api_key: bool,
    task: str | None = None,
    served: Served | None = None,
    outputs: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """The OpenAPI document of this gateway. With the workers' `task` known, only the routes the
    served model answers (an embedding model's rerank routes answer 501, and are left out); with
    what is `served`, each request field as strict as the server checks it (openapi_limits.py)."""
    models: list[type[BaseModel]] = [
        EmbeddingRequest, EmbedRequest, TokenizeRequest, RerankRequest, V1RerankRequest, V2EmbedRequest,
        V2RerankRequest, SimilarityRequest, DecodeRequest, EmbeddingList, ModelList, Token, TeiRank,
        V1RerankResponse, V2EmbedResponse, V2RerankResponse, Info, Status, OpenAIError, TeiError, CohereError,
        ContextualizedEmbeddingRequest, ContextualizedEmbeddingList, V1EmbedRequest, V1EmbedResponse,
        TeiOutputsRequest, TeiSparseValue,
    ]  # fmt: skip
    _, defs = models_json_schema(
        [(model, "validation") for model in models], ref_template="#/components/schemas/{model}"
    )
    schemas = defs.get("$defs", {})
    if served is not None:
        constrain(schemas, served)
    _mark_extensions(schemas)
    paths: dict[str, dict[str, Any]] = {}
    for op in ROUTES:
        if task is not None and op.task not in (None, task):
            continue
        needs = _OUTPUT_ROUTES.get(op.path, ("dense",) if op.task == "embed" else ())
        if outputs is not None and needs and not set(needs) & set(outputs):
            continue  # the served model lacks the output this route answers
        response_schema = _ref(op.response.__name__) if isinstance(op.response, type) else op.response
        operation: dict[str, Any] = {
            "summary": op.summary,
            "operationId": f"{op.method}_{op.path.strip('/').replace('/', '_').replace('.', '_') or 'root'}",
            "responses": {
                "200": {"description": "OK", "content": {op.media_type: {"schema": response_schema}}}
            },
        }
        if op.method == "post":
            body = _root_body(task) if op.request is None else _ref(op.request.__name__)
            operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
            error = {
                "content": {
                    "application/json": {"schema": {"$ref": f"#/components/schemas/{op.errors.__name__}"}}
                }
            }
            for status, description in _ERRORS.items():
                operation["responses"][status] = {"description": description, **error}
        if has_api_key and op.path not in ("/health", "/ready", "/metrics", "/openapi.json", "/docs"):
            operation["security"] = [{"bearer": []}]
            operation["responses"]["401"] = {
                "description": "Missing or wrong API key",
                "content": {"application/json": {"schema": _ref(op.errors.__name__)}},
            }
        paths.setdefault(op.path, {})[op.method] = operation
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "kembed gateway",
            "version": version,
            "description": "Text embeddings and relevance scores in the OpenAI, Cohere, Perplexity "
            "and text-embeddings-inference shapes. A field a request schema does not define is "
            "refused, naming it (400; 422 on TEI's routes); the fields kembed takes beyond each "
            "API's own are listed in its schema's `x-kembed-extensions`.",
        },
        "paths": paths,
        "components": {"schemas": schemas},
    }
    if has_api_key:
        document["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return document
