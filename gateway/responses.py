"""The one JSON response every route writes: orjson, numpy arrays serialized straight from their
buffers (OPT_SERIALIZE_NUMPY: float32 rows without a Python object per float)."""

from typing import Any

import orjson
from starlette.responses import Response


def json_response(body: Any, status_code: int = 200) -> Response:
    return Response(
        orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY),
        status_code=status_code,
        media_type="application/json",
    )
