"""Workers found through a DNS name (`worker_service`, a Kubernetes headless Service): every address
it resolves to is a replica, resolved again and again; a new one gets work within an interval, a
vanished one gets no new work, answers what it holds, and is closed. The resolver is faked here
(fed from the fake workers' addresses); `resolve_dns` itself is checked against the system's."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import httpx
import pytest
from gateway_fakes import FakeEmbedder, serving
from gateway_harness import until_ready

from kembed.gateway.config import GatewayConfig
from kembed.gateway.edge.app import create_app
from kembed.gateway.pool.replicas import resolve_dns
from kembed.worker.config import bundled_model_dir

SERVICE = "workers.kembed.svc:50051"
INTERVAL_S = 0.05


class FakeDns:
    """What the name resolves to now; `fail` makes the next lookups raise, as a DNS outage would."""

    def __init__(self) -> None:
        self.addresses: list[str] = []
        self.lookups: list[tuple[str, int]] = []
        self.fail = False

    async def __call__(self, host: str, port: int) -> list[str]:
        self.lookups.append((host, port))
        if self.fail:
            raise socket.gaierror(socket.EAI_AGAIN, "temporary failure in name resolution")
        return list(self.addresses)


@contextlib.asynccontextmanager
async def discovering_gateway(dns: FakeDns, **overrides) -> AsyncIterator[httpx.AsyncClient]:
    settings = {"worker_service": SERVICE, "worker_resolve_interval_s": INTERVAL_S} | overrides
    config = GatewayConfig(model_dir=bundled_model_dir(), health_interval_s=INTERVAL_S, **settings)
    app = create_app(config, resolve=dns)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            yield client


async def workers_info(client: httpx.AsyncClient) -> dict[str, dict]:
    return {w["address"]: w for w in (await client.get("/info")).json()["workers"]}


async def _until(predicate, timeout_s: float = 5.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if await predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


async def test_replicas_follow_the_name_as_pods_come_and_go_without_a_failed_request():
    fakes = [FakeEmbedder(delay_s=0.01) for _ in range(3)]
    dns = FakeDns()
    async with contextlib.AsyncExitStack() as stack:
        addresses = [await stack.enter_async_context(serving(f)) for f in fakes]
        dns.addresses = addresses[:1]
        client = await stack.enter_async_context(discovering_gateway(dns))
        await until_ready(client)
        assert dns.lookups[0] == ("workers.kembed.svc", 50051)
        statuses: list[int] = []
        stop = asyncio.Event()

        async def load() -> None:  # a client posting all along
            while not stop.is_set():
                response = await client.post("/embed", json={"inputs": ["a query", "another query"]})
                statuses.append(response.status_code)

        loaders = [asyncio.create_task(load()) for _ in range(4)]
        dns.addresses = addresses  # scaled 1 -> 3
        await _until(lambda: _all_served(fakes))
        dns.addresses = addresses[1:]  # the first pod is going

        async def first_closed() -> bool:
            return addresses[0] not in await workers_info(client)

        await _until(first_closed)
        served_by_first = len(fakes[0].sequences)
        await asyncio.sleep(10 * INTERVAL_S)
        stop.set()
        await asyncio.gather(*loaders)
    assert len(fakes[0].sequences) == served_by_first  # no work after it was closed
    assert statuses and set(statuses) == {200}, sorted(set(statuses))


async def _all_served(fakes: list[FakeEmbedder]) -> bool:
    return all(f.sequences for f in fakes)


async def test_a_leaving_replica_answers_what_it_holds():
    slow = FakeEmbedder(delay_s=0.3)
    dns = FakeDns()
    async with serving(slow) as address, discovering_gateway(dns) as client:
        dns.addresses = [address]
        await _until(lambda: _is_ready(client))
        pending = asyncio.create_task(client.post("/embed", json={"inputs": "held by the leaving pod"}))
        await asyncio.sleep(0.05)
        dns.addresses = []  # gone from the name while the request is on it
        await asyncio.sleep(3 * INTERVAL_S)
        assert (await workers_info(client))[address]["leaving"] is True
        assert (await client.get("/ready")).status_code == 503  # nothing else serves
        response = await pending
        assert response.status_code == 200

        async def closed() -> bool:
            return address not in await workers_info(client)

        await _until(closed)


async def _is_ready(client: httpx.AsyncClient) -> bool:
    return (await client.get("/ready")).status_code == 200


async def test_a_failed_lookup_keeps_the_replicas_known():
    fake = FakeEmbedder()
    dns = FakeDns()
    async with serving(fake) as address:
        dns.addresses = [address]
        async with discovering_gateway(dns) as client:
            await until_ready(client)
            dns.fail = True
            await asyncio.sleep(5 * INTERVAL_S)
            assert (await client.post("/embed", json={"inputs": "still served"})).status_code == 200
            assert list(await workers_info(client)) == [address]


async def test_static_workers_and_a_service_together():
    static, found = FakeEmbedder(), FakeEmbedder()
    dns = FakeDns()
    async with serving(static) as static_address, serving(found) as found_address:
        dns.addresses = [found_address]
        async with discovering_gateway(dns, worker_addresses=(static_address,)) as client:
            await until_ready(client)
            info = await workers_info(client)
            assert info[static_address]["discovered"] is False and info[found_address]["discovered"] is True
            dns.addresses = []
            await asyncio.sleep(5 * INTERVAL_S)
            assert list(await workers_info(client)) == [static_address]  # static ones never leave


async def test_resolve_dns_gives_every_address_of_a_name_as_targets():
    targets = await resolve_dns("localhost", 50051)
    assert targets and all(t.endswith(":50051") for t in targets)
    assert any(t in ("127.0.0.1:50051", "[::1]:50051") for t in targets)
    assert await resolve_dns("no-such-host.invalid", 50051) == []


@pytest.mark.parametrize("service", ["workers.kembed.svc", "workers:port", ":50051"], ids=str)
def test_a_service_without_a_port_is_refused(service):
    with pytest.raises(ValueError, match="host:port"):
        GatewayConfig(model_dir=bundled_model_dir(), worker_service=service)


class TwoNames(FakeDns):
    """Two names, each with its own addresses (two revisions' headless Services)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_host: dict[str, list[str]] = {}

    async def __call__(self, host: str, port: int) -> list[str]:
        self.lookups.append((host, port))
        return list(self.by_host.get(host, []))


async def test_several_names_are_one_pool():
    """The operator's stepwise rollout points the gateway at two revisions' Services at once."""
    fakes = [FakeEmbedder() for _ in range(2)]
    dns = TwoNames()
    async with contextlib.AsyncExitStack() as stack:
        first, second = [await stack.enter_async_context(serving(f)) for f in fakes]
        dns.by_host = {"old.kembed.svc": [first], "new.kembed.svc": [second]}
        client = await stack.enter_async_context(
            discovering_gateway(dns, worker_service="old.kembed.svc:50051, new.kembed.svc:50051")
        )
        await until_ready(client)
        assert {h for h, _ in dns.lookups} == {"old.kembed.svc", "new.kembed.svc"}
        for _ in range(8):
            assert (await client.post("/embed", json={"inputs": ["a", "b"]})).status_code == 200
        assert all(f.sequences for f in fakes)
        dns.by_host["old.kembed.svc"] = []  # the old revision scaled to none
        await _until(lambda: _gone(client, first))


async def _gone(client: httpx.AsyncClient, address: str) -> bool:
    return address not in await workers_info(client)


def test_each_name_must_be_host_and_port():
    with pytest.raises(ValueError, match=r"'new\.kembed\.svc'"):
        GatewayConfig(model_dir=bundled_model_dir(), worker_service="old.kembed.svc:50051,new.kembed.svc")
