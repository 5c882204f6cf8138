"""A request's body, read under the size cap, and the check that it is declared JSON."""

from __future__ import annotations

from starlette.requests import Request

from kembed.gateway.edge.hot_path import HotRequest
from kembed.gateway.errors import PayloadTooLarge, UnsupportedMediaType


def check_json(request: Request | HotRequest) -> None:
    """415 unless the body is declared JSON (`application/json`, or a `+json` type), as TEI does. A
    web page of another origin can POST `text/plain`, a form or an untyped body without the
    browser asking the gateway first (CORS preflight), but not `application/json`: this check is
    what keeps such a page from spending the gateway's capacity on its visitors' behalf."""
    declared = request.headers.get("content-type", "")
    media_type = declared.partition(";")[0].strip().lower()
    if media_type != "application/json" and not (
        media_type.startswith("application/") and media_type.endswith("+json")
    ):
        raise UnsupportedMediaType(
            f"expected a JSON body with `Content-Type: application/json`, got "
            f"{repr(declared) if declared else 'no Content-Type'}"
        )


async def read_body(request: Request | HotRequest, max_bytes: int) -> bytes:
    """The body, refused with 413 as soon as it is known to exceed `max_bytes` (before parsing)."""
    if isinstance(request, HotRequest):  # read whole by the connection edge, under the same cap
        return request.whole_body
    too_large = PayloadTooLarge(f"request body is larger than the limit of {max_bytes} bytes")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise too_large
    parts: list[bytes] = []
    size = 0
    async for part in request.stream():
        size += len(part)
        if size > max_bytes:
            raise too_large
        parts.append(part)
    return b"".join(parts)
