"""The one JSON response every route writes: orjson, numpy arrays serialized straight from their
buffers (OPT_SERIALIZE_NUMPY: float32 rows without a Python object per float)."""

from typing import Any

import orjson
from starlette.responses import Response

_JSON = (b"content-type", b"application/json")


class JsonResponse(Response):
    """A Starlette Response of JSON bytes, its two header fields made directly: Response's own
    constructor renders its content and builds its headers through several calls, a few
    microseconds of every query."""

    media_type = "application/json"

    def __init__(self, body: bytes, status_code: int = 200) -> None:
        self.status_code = status_code
        self.background = None
        self.body = body
        self.raw_headers = [(b"content-length", str(len(body)).encode("ascii")), _JSON]


def json_response(body: Any, status_code: int = 200) -> Response:
    return JsonResponse(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), status_code)
