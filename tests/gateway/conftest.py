"""Shared fixtures of the gateway tests: the bundled model directory, fake workers, a running gateway."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from gateway_fakes import BUNDLED_MODEL_DIR, FakeEmbedder, serving
from gateway_harness import running_gateway, until_ready  # also importable from here, as before

from kembed.gateway.config import GatewayConfig
from kembed.proto import embedder_pb2 as pb


@pytest.fixture
def model_dir() -> Path:
    return BUNDLED_MODEL_DIR


GatewayFactory = Callable[..., contextlib.AbstractAsyncContextManager[httpx.AsyncClient]]


@pytest.fixture
def gateway_with() -> GatewayFactory:
    """`async with gateway_with(fake, ..., chunk_tokens=...) as client`: fakes served, gateway up."""

    @contextlib.asynccontextmanager
    async def start(*fakes: FakeEmbedder | str, **overrides: Any) -> AsyncIterator[httpx.AsyncClient]:
        async with contextlib.AsyncExitStack() as stack:
            addresses = [
                fake if isinstance(fake, str) else await stack.enter_async_context(serving(fake))
                for fake in fakes
            ]
            # token_ids "any": the fakes answer vectors made from whatever ids a test sends (the
            # framing the default asks for has tests of its own: test_token_id_framing.py)
            config = GatewayConfig(
                model_dir=BUNDLED_MODEL_DIR, worker_addresses=tuple(addresses), token_ids="any"
            )
            config = dataclasses.replace(config, **overrides)
            client = await stack.enter_async_context(running_gateway(config))
            if all(not isinstance(fake, str) and fake.status == pb.HealthResponse.SERVING for fake in fakes):
                await until_ready(client)
            yield client

    return start


@pytest.fixture(autouse=True)
async def no_leaked_tasks() -> AsyncIterator[None]:
    """Fails a test that leaves asyncio tasks running after it (a chunk outliving its request)."""
    yield
    current = asyncio.current_task()
    # grpc.aio's server finishes its own per-RPC bookkeeping tasks a few loop turns after stop():
    # give them a moment, but anything still pending after that has truly leaked.
    for _ in range(50):
        leaked = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
        if not leaked:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"leaked tasks: {leaked}")
