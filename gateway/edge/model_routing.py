"""Several models behind one endpoint: each request to the model it names.

A route with a `model` field (OpenAI's, Cohere's, Perplexity's) goes to the model its body names;
every route also takes the `X-Kembed-Model` header, and a path under `/models/<name>/` is that
model's route (`/models/bge-m3/embed` is bge-m3's `/embed`); a request naming none goes to the
default model (the first listed). An unknown name is the route's API's own 404. Each model keeps
everything below the HTTP edge to itself: its tokenizer, limits, admission, worker pool and model
check, its hold at zero workers and its metrics (labelled `model` here). What the endpoint has once
(the connection edge, the API key, the request timings by route, /health, /metrics) stays one.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Scope

from kembed.gateway.api.responses import json_response
from kembed.gateway.config import GatewayConfig
from kembed.gateway.edge.bodies import read_body
from kembed.gateway.edge.hot_path import HotRequest
from kembed.gateway.errors import NotFound
from kembed.gateway.metrics import GatewayMetrics, render_models
from kembed.gateway.pool.workers import WorkerPool
from kembed.gateway.service.hold import Hold

MODEL_HEADER = "x-kembed-model"
PATH_PREFIX = "/models/"
# The routes whose body names its model (`model`): OpenAI's, Perplexity's, Cohere's.
BODY_MODEL_ROUTES = frozenset(
    {"/v1/embeddings", "/v1/contextualizedembeddings", "/v1/rerank", "/v1/embed", "/v2/embed", "/v2/rerank"}
)

Endpoint = Callable[[Any], Awaitable[Response]]


@dataclass(frozen=True, slots=True)
class ModelRoutes:
    """One model's part of the endpoint: its config, worker pool, hold and metrics, and its route
    handlers by (method, path)."""

    config: GatewayConfig
    pool: WorkerPool
    hold: Hold
    metrics: GatewayMetrics
    handlers: dict[tuple[str, str], Endpoint]

    @property
    def name(self) -> str:
        return self.config.served_model_names[0]

    @property
    def state(self) -> str:
        """`serving`; with no serving worker, `scaled_to_zero` where requests are held until one
        serves (`waking` while some are), else `unavailable`."""
        if self.pool.is_ready():
            return "serving"
        if not self.hold.is_holding:
            return "unavailable"
        return "waking" if self.hold.num_held else "scaled_to_zero"


def _named_model(body: bytes) -> str | None:
    """The `model` a JSON body names, if any (what is not JSON is left to the route to refuse). One
    parse of the body more than a one-model gateway makes: ~1 µs for a query, ~1 ms a megabyte."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    model = parsed.get("model") if isinstance(parsed, dict) else None
    return model if isinstance(model, str) else None


class ModelRouter:
    """The models of one endpoint, the default first, and the endpoint's own routes over them."""

    def __init__(
        self, models: Sequence[ModelRoutes], metrics: GatewayMetrics, max_request_bytes: int
    ) -> None:
        assert models, "an endpoint serves one model at least"
        self.models = tuple(models)
        self._metrics = metrics
        self._max_request_bytes = max_request_bytes
        self._by_name = {name: m for m in self.models for name in m.config.served_model_names}
        # longest first: a name that is another's prefix (`e5`, `e5/large`) never takes its paths
        self._prefixes = [
            (f"{PATH_PREFIX}{name}/", name) for name in sorted(self._by_name, key=len, reverse=True)
        ]
        self.created = int(time.time())

    def named(self, name: str) -> ModelRoutes:
        model = self._by_name.get(name)
        if model is None:
            raise NotFound(
                f"The model `{name}` does not exist; this endpoint serves {', '.join(self._by_name)}",
                param="model",
            )
        return model

    def _of_header(self, request: Request | HotRequest) -> ModelRoutes:
        name = request.headers.get(MODEL_HEADER)
        return self.models[0] if name is None else self.named(name.strip())

    def endpoint(self, method: str, path: str) -> Endpoint:
        """The handler of `method path` that hands each request to its model's."""
        key = (method, path)
        if path not in BODY_MODEL_ROUTES:

            async def by_header(request: Request | HotRequest) -> Response:
                return await self._of_header(request).handlers[key](request)

            return by_header

        async def by_body(request: Request | HotRequest) -> Response:
            body = await read_body(request, self._max_request_bytes)
            named = _named_model(body)
            model = self._of_header(request) if named is None else self.named(named)
            if not isinstance(request, HotRequest):  # its body, read, handed on whole
                request = HotRequest(request.url.path, list(request.headers.raw), body)
            return await model.handlers[key](request)

        return by_body

    def rewrite(self, scope: Scope) -> None:
        """A path under `/models/<name>/`: that model's route, the header set to name it."""
        path: str = scope["path"]
        if not path.startswith(PATH_PREFIX):
            return
        for prefix, name in self._prefixes:
            if path.startswith(prefix):
                scope["path"] = path[len(prefix) - 1 :]
                scope["raw_path"] = scope["path"].encode()
                headers = [(k, v) for k, v in scope["headers"] if k != MODEL_HEADER.encode()]
                scope["headers"] = [*headers, (MODEL_HEADER.encode(), name.encode())]
                return

    async def list_models(self, request: Request) -> Response:
        """`/v1/models`: every model of the endpoint (each of its names), with its state."""
        data = [
            {
                "id": name,
                "object": "model",
                "created": self.created,
                "owned_by": "kembed",
                "root": model.name,
                "state": model.state,
            }
            for model in self.models
            for name in model.config.served_model_names
        ]
        return json_response({"object": "list", "data": data})

    async def ready(self, request: Request) -> Response:
        """Ready while every model serves or holds its requests until it does (a model at zero)."""
        states = {model.name: model.state for model in self.models}
        if "unavailable" not in states.values():
            return json_response({"status": "ready", "models": states})
        body = {
            "status": "not ready",
            "models": states,
            "serving_workers": sum(m.pool.num_serving() for m in self.models),
            "workers": sum(len(m.pool.replicas) for m in self.models),
            "refused_workers": sum(m.pool.num_refused() for m in self.models),
        }
        return json_response(body, status_code=503)

    async def metrics(self, request: Request) -> Response:
        text, content_type = render_models(self._metrics, {m.name: m.metrics for m in self.models})
        return Response(text, media_type=content_type)
