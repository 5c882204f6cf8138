"""The gateway's error hierarchy and its one translation to HTTP.

Code below the HTTP edge raises these; `render` is the only place that picks a status code and a body.
OpenAI-shaped routes (`/v1/...`) get `{"error": {"message", "type", "param", "code"}}` with a string
`code` and 400 where the others say 422 (the openai SDK reads `error.message`); TEI-shaped routes
get `{"error": ..., "error_type": ...}` like text-embeddings-inference; Cohere-shaped routes
(`/v2/...`) get `{"message": ...}`, with 400 for 422 as Cohere answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import orjson
from starlette.responses import Response


class GatewayError(Exception):
    """Base of every error the gateway answers with; `param` names the offending request field."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidInput(GatewayError):
    """The request is malformed or a value is out of range (422)."""


class PayloadTooLarge(GatewayError):
    """The body, the input count or one input's token count exceeds a limit (413)."""


class UnsupportedMediaType(GatewayError):
    """A request body that is not declared `application/json` (415)."""


class RequestTimeout(GatewayError):
    """A client too slow to send its request's head or body (408; the connection is closed)."""


class HeadersTooLarge(GatewayError):
    """A request head over the size or field-count limit (431; the connection is closed)."""


class Unauthorized(GatewayError):
    """The gateway requires an API key and the request did not carry the right one (401)."""


class NotFound(GatewayError):
    """The request names a model this gateway does not serve (404)."""


class MethodNotAllowed(GatewayError):
    """The route exists but not with this HTTP method (405, with the methods it takes in `Allow`)."""

    def __init__(self, message: str, *, allow: str = "") -> None:
        super().__init__(message)
        self.allow = allow


class Overloaded(GatewayError):
    """The workers cannot take the work now (429, retry later). `retry_after_s`: when to come back,
    if known (when the work ahead should have drained); else the configured Retry-After."""

    def __init__(self, message: str, *, param: str | None = None, retry_after_s: int | None = None) -> None:
        super().__init__(message, param=param)
        self.retry_after_s = retry_after_s


class Unavailable(GatewayError):
    """No worker replica is reachable or serving (503). `retry_after_s`: sent as Retry-After when
    set (a model held at zero workers that did not wake in time, or whose hold is full: hold.py)."""

    def __init__(self, message: str, *, param: str | None = None, retry_after_s: int | None = None) -> None:
        super().__init__(message, param=param)
        self.retry_after_s = retry_after_s


class Unsupported(GatewayError):
    """The served model or the worker does not implement this operation (501)."""


class Timeout(GatewayError):
    """The request did not finish within its deadline (504)."""


class WorkerFailed(GatewayError):
    """A worker answered with an unexpected error; nothing the client can fix (500)."""


class Flavour(Enum):
    """Which API's error body to render."""

    OPENAI = "openai"
    TEI = "tei"
    COHERE = "cohere"


def flavour_of(path: str) -> Flavour:
    """The error body a route answers in: Cohere's under `/v2/`, OpenAI's under `/v1/`, else TEI's."""
    if path.startswith("/v2/"):
        return Flavour.COHERE
    return Flavour.OPENAI if path.startswith("/v1/") else Flavour.TEI


@dataclass(frozen=True, slots=True)
class _Mapping:
    status: int
    openai_type: str
    tei_type: str


# The one table from error to HTTP. OpenAI's type names follow its API (invalid_request_error and
# friends). TEI's `error_type` is one of its ErrorType enum, spelt as TEI serialises it (`Validation`,
# its OpenAPI document's enum; tests/gateway/fixtures/tei_error_types.json): what the client got wrong
# is `Validation` (TEI says so for a batch too large too), a full queue `Overloaded`, no worker
# `Unhealthy`, and what the model or the workers could not do `Backend`, as TEI answers /rerank on an
# embedding model.
_TABLE: dict[type[GatewayError], _Mapping] = {
    InvalidInput: _Mapping(422, "invalid_request_error", "Validation"),
    PayloadTooLarge: _Mapping(413, "invalid_request_error", "Validation"),
    UnsupportedMediaType: _Mapping(415, "invalid_request_error", "Validation"),
    RequestTimeout: _Mapping(408, "timeout_error", "Validation"),
    HeadersTooLarge: _Mapping(431, "invalid_request_error", "Validation"),
    Unauthorized: _Mapping(401, "invalid_request_error", "Validation"),
    NotFound: _Mapping(404, "invalid_request_error", "Validation"),
    MethodNotAllowed: _Mapping(405, "invalid_request_error", "Validation"),
    Overloaded: _Mapping(429, "rate_limit_error", "Overloaded"),
    Unavailable: _Mapping(503, "service_unavailable_error", "Unhealthy"),
    Unsupported: _Mapping(501, "not_implemented_error", "Backend"),
    Timeout: _Mapping(504, "timeout_error", "Backend"),
    WorkerFailed: _Mapping(500, "server_error", "Backend"),
}

# TEI's ErrorType, every value `error_type` takes (the OpenAPI document's enum).
TEI_ERROR_TYPES = ("Unhealthy", "Backend", "Overloaded", "Validation", "Tokenizer", "Empty")


def reason_of(error: GatewayError) -> str:
    """The `reason` label of `kembed_gateway_errors_total`: the error class in snake case (bounded)."""
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in type(error).__name__).lstrip("_")


def openai_code(error: GatewayError) -> str:
    """The `code` of an OpenAI-shaped error: OpenAI's own where it has one for the case, else the
    error class in snake case (as in the metrics' `reason`); a string, as OpenAI's clients type it."""
    if isinstance(error, NotFound) and error.param == "model":
        return "model_not_found"
    return _OPENAI_CODES.get(type(error)) or reason_of(error)


_OPENAI_CODES: dict[type[GatewayError], str] = {
    Unauthorized: "invalid_api_key",
    Overloaded: "rate_limit_exceeded",
}


def render(error: GatewayError, flavour: Flavour, *, retry_after_s: int) -> Response:
    """The HTTP response for `error` in the body shape of `flavour`. OpenAI answers an invalid
    request with 400, not 422, and its SDK raises `BadRequestError` only for that status."""
    mapping = _TABLE[type(error)]
    status = mapping.status
    if flavour is Flavour.OPENAI:
        status = 400 if status == 422 else status
        body: dict[str, object] = {
            "error": {
                "message": error.message,
                "type": mapping.openai_type,
                "param": error.param,
                "code": openai_code(error),
            }
        }
    elif flavour is Flavour.COHERE:  # Cohere's `{"message"}`; it answers an invalid request with 400
        status = 400 if status == 422 else status
        body = {"message": error.message}
    else:
        body = {"error": error.message, "error_type": mapping.tei_type}
    headers = None
    if isinstance(error, Overloaded):
        headers = {
            "Retry-After": str(error.retry_after_s if error.retry_after_s is not None else retry_after_s)
        }
    if isinstance(error, Unavailable) and error.retry_after_s is not None:
        headers = {"Retry-After": str(error.retry_after_s)}
    if isinstance(error, MethodNotAllowed) and error.allow:
        headers = {"Allow": error.allow}
    return Response(orjson.dumps(body), status_code=status, headers=headers, media_type="application/json")
