"""The HTTP edge: Starlette routes in the OpenAI, TEI and Cohere (rerank) shapes, and the app's lifespan.

Each route reads its body under the size cap, parses it, calls the shared `EmbeddingService` and
renders the answer with orjson. Errors are raised, never rendered here: the one handler below turns a
`GatewayError` into the body shape of the route's API (`/v1/...` is OpenAI, `/v2/...` Cohere, the
rest TEI).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send
from swagger_ui_bundle import swagger_ui_path  # type: ignore[import-untyped]  # ships no type hints

from kembed.gateway.answer_size import VALUE_BYTES
from kembed.gateway.api import openapi
from kembed.gateway.api.cohere import CohereRoutes
from kembed.gateway.api.multi_output import OutputRoutes
from kembed.gateway.api.openapi_limits import Served
from kembed.gateway.api.perplexity import PerplexityRoutes
from kembed.gateway.api.responses import JsonResponse, json_response
from kembed.gateway.api.schemas import (
    EmbeddingRequest,
    TokenizeRequest,
    V1RerankRequest,
    as_input_list,
    parse,
)
from kembed.gateway.api.tei import TeiRoutes
from kembed.gateway.config import GatewayConfig, with_overrides
from kembed.gateway.edge.auth import BearerAuth
from kembed.gateway.edge.bodies import check_json, read_body
from kembed.gateway.edge.disconnect import CancelOnDisconnect
from kembed.gateway.edge.hot_path import HotPath, HotRequest
from kembed.gateway.edge.model_routing import ModelRouter, ModelRoutes
from kembed.gateway.endpoint import is_multi_model, model_configs
from kembed.gateway.errors import (
    Flavour,
    GatewayError,
    MethodNotAllowed,
    NotFound,
    WorkerFailed,
    flavour_of,
    reason_of,
    render,
)
from kembed.gateway.metrics import METRICS_PATH, GatewayMetrics, RequestMetrics
from kembed.gateway.pool.model_check import ModelCheck, read_own_identity
from kembed.gateway.pool.replicas import Resolve, resolve_dns
from kembed.gateway.pool.workers import WorkerPool
from kembed.gateway.service.service import PRIORITY_HEADER, EmbeddingService
from kembed.gateway.tokenizing.heap import LARGE_BODY_BYTES, HeapTrim
from kembed.gateway.tokenizing.tokenization import Tokenization
from kembed.gateway.vectors import encode, rank
from kembed.proto.model_files import load_model_spec
from kembed.proto.model_identity import ModelIdentity
from kembed.proto.outputs import names_of
from kembed.proto.version import VERSION

log = logging.getLogger(__name__)


_SWAGGER_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>kembed gateway API</title>
<link rel="stylesheet" href="/docs/static/swagger-ui.css"></head>
<body><div id="swagger-ui"></div>
<script src="/docs/static/swagger-ui-bundle.js"></script>
<script>SwaggerUIBundle({url: "/openapi.json", dom_id: "#swagger-ui"});</script>
</body></html>
"""


class Routes:
    """The route handlers, bound to one service and config."""

    def __init__(
        self, config: GatewayConfig, service: EmbeddingService, heap: HeapTrim | None = None
    ) -> None:
        self.config = config
        self.service = service
        self._heap = heap or HeapTrim()
        self.version = VERSION
        self._openapi: bytes | None = None
        self.created = int(time.time())
        self.outputs = OutputRoutes(service, self._body)  # several outputs a text (multi_output.py)

    async def _body(self, request: Request | HotRequest) -> bytes:
        """The body of a request the workers answer, once one serves: with none serving (a model at
        zero), the request is held until one does, if the model holds requests (hold.py)."""
        body = await self._body_now(request)
        await self.service.hold.wait(len(body))
        return body

    async def _body_now(self, request: Request | HotRequest) -> bytes:
        """The body of a request the gateway answers itself (/tokenize, /decode): never held."""
        check_json(request)
        body = await read_body(request, self.config.max_request_bytes)
        if len(body) >= LARGE_BODY_BYTES:  # what parsing it frees is given back at its end (heap.py)
            self._heap.hold()
        return body

    async def openai_embeddings(self, request: Request) -> Response:
        body = parse(EmbeddingRequest, await self._body(request))
        self.service.check_model(body.model)
        if body.outputs is not None:  # several outputs a text (multi_output.py)
            return await self.outputs.openai(request, body.outputs, body)
        embedded = await self.service.embed(
            as_input_list(body.input),
            truncate=None,
            direction=None,
            prompt_name=body.prompt_name,
            dimensions=body.dimensions,
            normalize=None,
            priority=request.headers.get(PRIORITY_HEADER),
            value_bytes=VALUE_BYTES[body.encoding_format or "float"],
            task=body.task,
        )
        data = [
            {"object": "embedding", "index": i, "embedding": row}
            for i, row in enumerate(encode(embedded.vectors, body.encoding_format))
        ]
        usage = {"prompt_tokens": embedded.num_tokens, "total_tokens": embedded.num_tokens}
        return json_response(
            {"object": "list", "data": data, "model": self.service.served_names[0], "usage": usage}
        )

    async def tei_tokenize(self, request: Request) -> Response:
        body = parse(TokenizeRequest, await self._body_now(request))
        texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
        tokens = await self.service.tokenize(
            texts, add_special_tokens=body.add_special_tokens, prompt_name=body.prompt_name
        )
        return JsonResponse(tokens)

    async def v1_rerank(self, request: Request) -> Response:
        body = parse(V1RerankRequest, await self._body(request))
        self.service.check_model(body.model)
        body.check_options()
        texts = body.texts
        scored = await self.service.rerank(
            body.query,
            texts,
            truncate=None,
            direction=None,
            raw=False,
            param="documents",
            priority=request.headers.get(PRIORITY_HEADER),
        )
        results = [
            {"index": i, "relevance_score": float(scored.scores[i])}
            | ({"document": {"text": texts[i]}} if body.return_documents else {})
            for i in rank(scored.scores, body.top_n)
        ]
        return json_response(
            {
                "id": uuid.uuid4().hex,
                "model": self.service.served_names[0],
                "results": results,
                "usage": {"total_tokens": scored.num_tokens},
            }
        )

    async def info(self, request: Request) -> Response:
        worker = self.service.pool.info
        spec = self.service.tokenization.spec
        if worker is not None and worker.task == "score":  # TEI's reranker (sequence classifier) shape
            labels = spec.id2label or {0: "LABEL_0"}
            model_type: dict[str, Any] = {
                "reranker": {
                    "id2label": {str(i): label for i, label in labels.items()},
                    "label2id": {label: i for i, label in labels.items()},
                }
            }
        else:
            model_type = {"embedding": {"pooling": worker.pooling if worker else None}}
        return json_response(
            {
                "model_id": self.service.served_names[0],
                "served_model_name": self.service.served_names[0],
                "served_model_names": list(self.service.served_names),
                "model_sha": None,
                # what this gateway tokenizes for; each worker's own are under `workers` (model_check.py)
                "tokenizer_digest": self.service.pool.model.tokenizer or None,
                "model_digest": self.service.pool.model.model or None,
                "model_dtype": worker.dtype if worker else None,
                "model_type": model_type,
                "auto_truncate": self.config.auto_truncate,
                "max_input_length": spec.max_seq_length or (worker.max_sequence_length if worker else None),
                "max_batch_tokens": worker.max_batch_tokens if worker else None,
                "max_client_batch_size": self.config.max_client_batch_size,
                "max_concurrent_requests": self.config.max_concurrent_requests,
                "tokenization_workers": self.config.tokenization_workers,
                "version": self.version,
                "dimensions": worker.dimensions if worker else None,
                "outputs": names_of(worker.outputs) if worker else None,
                "normalize": worker.normalize if worker else None,
                "attention_backend": worker.attention_backend if worker else None,
                "device": worker.device if worker else None,
                "prompts": sorted(spec.prompts),
                "default_prompt_name": spec.default_prompt_name,
                "tasks": list(worker.tasks) if worker else [],
                "default_task": (worker.default_task or None) if worker else None,
                "chunk_tokens": self.config.chunk_tokens,
                "max_chunk_sequences": self.config.max_chunk_sequences,
                "workers": [replica.describe() for replica in self.service.pool.replicas],
            }
        )

    async def models(self, request: Request) -> Response:
        names = self.service.served_names
        data = [
            {"id": name, "object": "model", "created": self.created, "owned_by": "kembed", "root": names[0]}
            for name in names
        ]
        return json_response({"object": "list", "data": data})

    async def docs(self, request: Request) -> Response:
        """Swagger UI (5.x, which reads OpenAPI 3.1) over /openapi.json, its assets from the
        swagger-ui-bundle-v2 package (no CDN)."""
        return Response(_SWAGGER_PAGE, media_type="text/html")

    async def openapi(self, request: Request) -> Response:
        if self._openapi is not None:
            return Response(self._openapi, media_type="application/json")
        # Built once the workers' task is known (~50 ms of pydantic schema generation): the document
        # then lists only the routes the served model answers.
        info = self.service.pool.info
        task = info.task if info is not None else None
        outputs = None if info is None or info.task != "embed" else tuple(names_of(info.outputs or 1))
        served = Served.of(
            self.config,
            self.service.served_names,
            tuple(self.service.tokenization.spec.prompts),
            dimensions=info.dimensions if info is not None else None,
            vocab_size=(info.vocab_size if info is not None else None)
            or self.service.tokenization.spec.vocab_size,
            outputs=outputs,
            tasks=tuple(info.tasks) if info is not None else None,
        )
        document = orjson.dumps(
            openapi.build(
                self.version,
                has_api_key=bool(self.config.api_key),
                task=task,
                served=served,
                outputs=outputs,
            )
        )
        if task is not None:
            self._openapi = document
        return Response(document, media_type="application/json")

    async def health(self, request: Request) -> Response:
        return json_response({"status": "ok"})

    async def metrics(self, request: Request) -> Response:
        text, content_type = self.service.metrics.render()
        return Response(text, media_type=content_type)

    async def ready(self, request: Request) -> Response:
        if self.service.pool.is_ready() or self.service.hold.is_holding:  # at zero: held, woken
            return json_response({"status": "ready"})
        # Open to anyone (the kubelet's probe): counts only; /info (behind the API key) has details.
        pool = self.service.pool
        body = {
            "status": "not ready",
            "serving_workers": 0,
            "workers": len(pool.replicas),
            "refused_workers": pool.num_refused(),  # serving another model (`/info` says which and why)
        }
        return json_response(body, status_code=503)


@dataclasses.dataclass(frozen=True, slots=True)
class _Model:
    """One model's stack below the HTTP edge, and its routes."""

    routes: Routes
    tokenization: Tokenization
    pool: WorkerPool
    handlers: dict[tuple[str, str], Endpoint]


def _build_model(
    config: GatewayConfig,
    metrics: GatewayMetrics,
    resolve: Resolve,
    identity: ModelIdentity | None,
    heap: HeapTrim,
) -> _Model:
    """A model's tokenizer (loaded now), worker pool, service and route handlers."""
    check = ModelCheck(identity or read_own_identity(config.model_dir), config.model_dir)
    tokenization = Tokenization(
        with_overrides(load_model_spec(config.model_dir), config),
        config.tokenization_workers,
        config.max_inline_tokenize_chars,
        config.bulk_tokenization_processes if config.priority_classes else 0,
        heap,
        config.token_ids,
    )
    pool = WorkerPool(config, metrics, check, resolve)
    routes = Routes(config, EmbeddingService(config, tokenization, pool, metrics), heap)
    tei = TeiRoutes(routes.service, routes._body, routes._body_now)  # TEI's routes (tei.py)
    cohere = CohereRoutes(routes.service, routes._body)  # Cohere's v2 API and v1's embed (cohere.py)
    perplexity = PerplexityRoutes(routes.service, routes._body)  # late chunking (perplexity.py)
    handlers: dict[tuple[str, str], Endpoint] = {
        ("POST", "/v1/embeddings"): routes.openai_embeddings,
        ("GET", "/v1/models"): routes.models,
        ("POST", "/v1/contextualizedembeddings"): perplexity.contextualized_embeddings,
        ("POST", "/"): tei.root,
        ("GET", "/"): routes.info,
        ("POST", "/embed"): tei.embed,
        ("POST", "/embed_sparse"): routes.outputs.embed_sparse,
        ("POST", "/embed_all"): routes.outputs.embed_all,
        ("POST", "/similarity"): tei.similarity,
        ("POST", "/decode"): tei.decode,
        ("POST", "/tokenize"): routes.tei_tokenize,
        ("POST", "/rerank"): tei.rerank,
        ("POST", "/v1/rerank"): routes.v1_rerank,
        ("POST", "/v1/embed"): cohere.embed_v1,  # Cohere's v1 (cohere.Client)
        ("POST", "/v2/embed"): cohere.embed,
        ("POST", "/v2/rerank"): cohere.rerank,
        ("GET", "/info"): routes.info,
        ("GET", "/openapi.json"): routes.openapi,
        ("GET", "/docs"): routes.docs,
        ("GET", "/health"): routes.health,
        ("GET", "/ready"): routes.ready,
        ("GET", METRICS_PATH): routes.metrics,
    }
    return _Model(routes, tokenization, pool, handlers)


def create_app(
    config: GatewayConfig,
    metrics_dir: Path | None = None,
    resolve: Resolve = resolve_dns,
    identity: ModelIdentity | None = None,
) -> Gateway:
    """The gateway as an ASGI app. The tokenizers load now; worker channels open in the lifespan.
    `metrics_dir`: one of several gateway processes, whose metrics are summed there (processes.py).
    `resolve`: how worker_service's name is resolved (DNS; tests pass a fake). `identity`: the model
    directory's digests, read here when not given (model_check.py; one model only). With several
    `models` (endpoint.py), each is built alone and `ModelRouter` hands it its requests."""
    heap = HeapTrim()  # freed memory given back after large requests (heap.py)
    metrics = GatewayMetrics(multiprocess_dir=metrics_dir)
    router: ModelRouter | None = None
    if not is_multi_model(config):
        models = [_build_model(config, metrics, resolve, identity, heap)]
        handlers = models[0].handlers
    else:
        models = [_build_model(c, GatewayMetrics(), resolve, None, heap) for c in model_configs(config)]
        routed = [
            ModelRoutes(m.routes.config, m.pool, m.routes.service.hold, m.routes.service.metrics, m.handlers)
            for m in models
        ]
        router = ModelRouter(routed, metrics, config.max_request_bytes)
        handlers = {key: router.endpoint(*key) for key in models[0].handlers}
        handlers |= {
            ("GET", "/v1/models"): router.list_models,
            ("GET", "/ready"): router.ready,
            ("GET", METRICS_PATH): router.metrics,
            ("GET", "/health"): models[0].handlers[("GET", "/health")],
            ("GET", "/docs"): models[0].handlers[("GET", "/docs")],
        }
    model_metrics = [m.routes.service.metrics for m in models]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        for model in models:
            await model.pool.start()
        for each in {id(m): m for m in [metrics, *model_metrics]}.values():
            each.start_folding()
        try:
            yield
        finally:
            for model in models:
                await model.pool.close()
            for each in {id(m): m for m in [metrics, *model_metrics]}.values():
                await each.stop_folding()
            for model in models:
                model.tokenization.close()

    async def on_error(request: Request, error: Exception) -> Response:
        flavour = flavour_of(request.url.path)
        if isinstance(error, HTTPException):  # Starlette's own: unknown route or method
            method, path = request.method, request.url.path
            if error.status_code == 405:
                # Starlette's Allow names the first route of the path only (`/` has two: GET, POST)
                allow = methods_of.get(path) or (error.headers or {}).get("Allow", "")
                error = MethodNotAllowed(f"{method} is not allowed on {path}; it takes {allow}", allow=allow)
            elif f"/v1{path}" in methods_of:  # an OpenAI client whose base_url lacks /v1
                error = NotFound(
                    f"no route {method} {path}; the OpenAI routes are under /v1: {method} /v1{path} (an "
                    "OpenAI client's base_url ends in /v1, e.g. http://127.0.0.1:8080/v1)"
                )
                # in OpenAI's shape: its `error.message` is what the openai SDKs show (TEI's string not)
                flavour = Flavour.OPENAI
            else:
                error = NotFound(f"no route {method} {path}; see GET /info for what this gateway serves")
        elif not isinstance(error, GatewayError):  # a bug: answer JSON, Starlette logs the traceback
            error = WorkerFailed("internal error in the gateway (see its log)")
        metrics.errors.labels(reason_of(error)).inc()
        return render(error, flavour, retry_after_s=config.retry_after_s)

    http_routes = [Route(path, handler, methods=[method]) for (method, path), handler in handlers.items()]
    methods_of = {  # every method a path is served with, for a 405's Allow (HEAD where GET is)
        path: ", ".join(sorted({m for r in http_routes if r.path == path for m in r.methods or ()}))
        for path in {r.path for r in http_routes}
    }
    hot_routes: dict[str, Endpoint] = {
        "/v1/embeddings": handlers[("POST", "/v1/embeddings")],
        "/embed": handlers[("POST", "/embed")],
    }
    # Outermost first: the timing middleware sees requests the API key check refuses.
    middleware = [Middleware(RequestMetrics, metrics=metrics, routes=[r.path for r in http_routes])]
    if config.api_key:
        middleware.append(Middleware(BearerAuth, api_key=config.api_key, metrics=metrics))
    middleware.append(Middleware(CancelOnDisconnect))  # inside the metrics: they record its 499
    app = Gateway(
        routes=[*http_routes, Mount("/docs/static", StaticFiles(directory=swagger_ui_path))],
        lifespan=lifespan,
        exception_handlers={GatewayError: on_error, HTTPException: on_error, Exception: on_error},
        middleware=middleware,
        hot_routes=hot_routes,
        on_error=on_error,
        rewrite=router.rewrite if router is not None else None,
    )
    app.state.metrics = metrics  # the connection edge (connections.py) counts into the same registry
    # ... and serves the hot routes itself, past the ASGI stack (hot_path.py)
    app.state.hot_path = HotPath(hot_routes, on_error, metrics, config.api_key)
    app.state.routes = models[0].routes
    app.state.router = router
    return app


Endpoint = Callable[[Request], Awaitable[Response]]
ErrorHandler = Callable[[Request, Exception], Awaitable[Response]]


class HotRoutes:
    """ASGI: a POST to a hot route straight to its handler, errors rendered by the app's one handler.
    Starlette's router and its two exception middlewares are work on every request around a handler
    that a one-query request, whose own work is small, feels (`make bench-path` measures it)."""

    def __init__(self, handlers: dict[str, Endpoint], on_error: ErrorHandler) -> None:
        self._handlers = handlers
        self._on_error = on_error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            response = await self._handlers[scope["path"]](request)
        except ClientDisconnect:  # the client left mid-body: CancelOnDisconnect records its 499
            raise
        except Exception as error:
            if not isinstance(error, GatewayError):  # a bug: logged, answered as JSON (on_error)
                log.exception("%s %s failed", scope["method"], scope["path"])
            response = await self._on_error(request, error)
        await response(scope, receive, send)


class Gateway(Starlette):
    """The Starlette app, with its hot routes (POST /v1/embeddings, /embed) served by HotRoutes
    inside the same middleware (metrics, API key) as every other route."""

    def __init__(
        self,
        *,
        hot_routes: dict[str, Endpoint],
        on_error: ErrorHandler,
        rewrite: Callable[[Scope], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._rewrite = rewrite  # several models: a `/models/<name>/` path to its model's route
        self._hot_paths = frozenset(hot_routes)
        hot: Any = HotRoutes(hot_routes, on_error)
        for cls, args, options in reversed(kwargs.get("middleware") or []):  # outermost ends outside
            hot = cls(hot, *args, **options)
        self._hot_stack = hot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._rewrite is not None and scope["type"] == "http":
            self._rewrite(scope)
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in self._hot_paths:
            scope["app"] = self
            await self._hot_stack(scope, receive, send)
            return
        await super().__call__(scope, receive, send)
