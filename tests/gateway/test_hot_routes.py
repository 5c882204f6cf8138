"""The hot routes' shortcut past Starlette's router: same error rendering, failures logged, and the
same middleware (request metrics) around them as around every other route."""

import logging

import httpx
from gateway_fakes import FakeEmbedder
from starlette.requests import Request
from starlette.responses import JSONResponse

from kembed.gateway.edge.app import HotRoutes
from kembed.gateway.errors import InvalidInput


async def _call(app, path: str = "/hot") -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        return await client.post(path, content=b"{}")


def _app(error: Exception) -> HotRoutes:
    async def handler(request: Request):
        raise error

    async def on_error(request: Request, raised: Exception):
        return JSONResponse({"error": type(raised).__name__}, status_code=418)

    return HotRoutes({"/hot": handler}, on_error)


async def test_a_gateway_error_is_rendered_by_the_one_handler_and_not_logged(caplog):
    with caplog.at_level(logging.ERROR, logger="kembed.gateway.edge.app"):
        response = await _call(_app(InvalidInput("bad")))
    assert (response.status_code, response.json()) == (418, {"error": "InvalidInput"})
    assert not caplog.records


async def test_a_bug_is_rendered_by_the_one_handler_and_logged_with_its_traceback(caplog):
    with caplog.at_level(logging.ERROR, logger="kembed.gateway.edge.app"):
        response = await _call(_app(RuntimeError("boom")))
    assert (response.status_code, response.json()) == (418, {"error": "RuntimeError"})
    assert any(record.exc_info and "POST /hot failed" in record.getMessage() for record in caplog.records)


async def test_hot_routes_are_timed_by_the_request_metrics_like_the_others(gateway_with):
    async with gateway_with(FakeEmbedder()) as client:
        assert (await client.post("/v1/embeddings", json={"input": "x"})).status_code == 200
        assert (await client.post("/embed", json={"inputs": []})).status_code == 422
        metrics = (await client.get("/metrics")).text
    assert 'kembed_gateway_request_duration_seconds_count{code="200",route="/v1/embeddings"} 1.0' in metrics
    assert 'kembed_gateway_request_duration_seconds_count{code="422",route="/embed"} 1.0' in metrics
