"""A client that leaves: its request is cancelled in the gateway and in the worker (a cancel on the
data path), and recorded as 499. A real uvicorn server and a real socket that closes."""

import asyncio
import contextlib
import json

import pytest
import uvicorn
from gateway_fakes import BUNDLED_MODEL_DIR, FakeEmbedder, serving
from local_ports import free_port

from kembed.gateway.config import GatewayConfig
from kembed.gateway.edge.app import create_app


@contextlib.asynccontextmanager
async def uvicorn_gateway(config: GatewayConfig):
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(config), host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    task = asyncio.create_task(server.serve())
    for _ in range(500):
        if server.started:
            break
        await asyncio.sleep(0.01)
    try:
        yield port
    finally:
        server.should_exit = True
        await task


async def post_then_leave(port: int, path: str, body: dict, leave_after_s: float) -> None:
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    payload = json.dumps(body).encode()
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: g\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    await writer.drain()
    await asyncio.sleep(leave_after_s)
    writer.close()
    await writer.wait_closed()


async def get(port: int, path: str) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: g\r\nConnection: close\r\n\r\n".encode())
    text = (await reader.read()).decode()
    writer.close()
    return text


@pytest.mark.parametrize("has_data_port", [True, False], ids=["frames", "unary"])
async def test_a_client_that_leaves_cancels_its_request_in_the_worker(has_data_port):
    fake = FakeEmbedder(delay_s=10.0, has_data_port=has_data_port)  # holds every request
    async with serving(fake) as address:
        config = GatewayConfig(model_dir=BUNDLED_MODEL_DIR, worker_addresses=(address,))
        async with uvicorn_gateway(config) as port:
            for _ in range(200):  # until the gateway is ready
                if (await get(port, "/ready")).startswith("HTTP/1.1 200"):
                    break
                await asyncio.sleep(0.02)
            await post_then_leave(port, "/v1/embeddings", {"input": ["a", "b", "c"]}, leave_after_s=0.3)
            for _ in range(200):  # the cancel reaches the worker well before its 10 s answer
                if fake.cancels:
                    break
                await asyncio.sleep(0.01)
            assert fake.cancels == 1
            metrics = await get(port, "/metrics")
    assert 'kembed_gateway_request_duration_seconds_count{code="499",route="/v1/embeddings"} 1.0' in metrics


async def test_a_client_that_stays_is_answered_normally(gateway_with):
    async with gateway_with(FakeEmbedder(delay_s=0.1)) as client:  # longer than the watch delay
        response = await client.post("/embed", json={"inputs": ["stay"]})
    assert response.status_code == 200
