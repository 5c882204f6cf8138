"""With an API key configured, every route but the probes needs `Authorization: Bearer <key>`."""

import asyncio
import dataclasses
import os
import sys

import httpx
import openai
import pytest
from gateway_fakes import FakeEmbedder, serving
from local_ports import free_port

KEY = "s3cret-key"


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 401),
        ({"Authorization": "Bearer wrong"}, 401),
        ({"Authorization": KEY}, 401),
        ({"Authorization": f"Bearer {KEY}"}, 200),
        ({"Authorization": f"bearer {KEY}"}, 200),
        ({"Authorization": f"Basic {KEY}"}, 401),
    ],
    ids=["missing", "wrong-key", "not-bearer", "right-key", "scheme-lower-case", "other-scheme"],
)
async def test_embedding_routes_need_the_key(gateway_with, headers, status):
    async with gateway_with(FakeEmbedder(), api_key=KEY) as client:
        openai_shape = await client.post("/v1/embeddings", json={"input": "x"}, headers=headers)
        tei_shape = await client.post("/embed", json={"inputs": "x"}, headers=headers)
    assert openai_shape.status_code == tei_shape.status_code == status
    if status == 401:
        assert "API key" in openai_shape.json()["error"]["message"]
        assert "API key" in tei_shape.json()["error"]
        assert openai_shape.headers["WWW-Authenticate"] == "Bearer"


async def test_probes_metrics_and_the_api_description_stay_open(gateway_with):
    """The kubelet's probes, Prometheus, and /docs with what it loads (a browser cannot send the key)."""
    async with gateway_with(FakeEmbedder(), api_key=KEY) as client:
        assert (await client.get("/health")).status_code == 200
        assert (await client.get("/ready")).status_code == 200
        assert (await client.get("/metrics")).status_code == 200
        assert (await client.get("/openapi.json")).status_code == 200
        assert (await client.get("/docs")).status_code == 200
        assert (await client.get("/docs/static/swagger-ui.css")).status_code == 200
        assert (await client.get("/info")).status_code == 401
        assert (await client.get("/docsx")).status_code == 401


@pytest.mark.slow
async def test_the_openai_client_passes_its_api_key_to_a_real_gateway_process():
    port = free_port()
    async with serving(FakeEmbedder()) as address:
        env = {**os.environ, "KEMBED_GATEWAY_API_KEY": KEY, "KEMBED_GATEWAY_LOG_LEVEL": "info"}
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-P", "-m", "kembed.gateway", "--worker", address, "--port", str(port),
            env=env, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            base_url = f"http://127.0.0.1:{port}"
            async with httpx.AsyncClient(base_url=base_url) as probe:
                for _ in range(100):
                    try:
                        if (await probe.get("/ready")).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    await asyncio.sleep(0.1)
            async with openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=KEY, max_retries=0) as client:
                assert len((await client.embeddings.create(model="fake-minilm", input=["a", "b"])).data) == 2
            async with openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="nope", max_retries=0) as client:
                with pytest.raises(openai.AuthenticationError):
                    await client.embeddings.create(model="fake-minilm", input="a")
        finally:
            process.terminate()
            _, stderr = await asyncio.wait_for(process.communicate(), 10)
        assert KEY.encode() not in stderr  # the start-up log prints the config: never the key


def test_the_key_never_appears_in_the_config_repr(model_dir):
    from kembed.gateway.config import GatewayConfig

    config = dataclasses.replace(GatewayConfig(model_dir=model_dir), api_key=KEY)
    assert KEY not in repr(config)
