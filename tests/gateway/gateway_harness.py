"""A gateway app running in-process for the gateway tests: its lifespan entered, an httpx client on it.

Its own module, not conftest.py: a test file imports these by name, and `conftest` is whichever
folder's conftest.py pytest loaded last when several folders are collected in one session.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx

from kembed.gateway.config import GatewayConfig
from kembed.gateway.edge.app import create_app


@contextlib.asynccontextmanager
async def running_gateway(config: GatewayConfig) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway app with its lifespan entered, behind an in-process httpx client."""
    app = create_app(config)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            yield client


async def until_ready(client: httpx.AsyncClient, timeout_s: float = 30.0) -> None:
    """Waits for /ready: the gateway probes its workers once at start, with a 1 s deadline that a
    loaded CI machine can miss; it probes again within a quarter second while no worker serves. A
    test then meets the gateway as a load balancer would, once ready, not racing its first probe."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while (await client.get("/ready")).status_code != 200:
        assert asyncio.get_running_loop().time() < deadline, "the gateway never became ready"
        await asyncio.sleep(0.02)
