"""The standard `grpc.health.v1.Health` service on the worker's gRPC server (what Kubernetes' gRPC
probes call), over a real channel: NOT_SERVING until the worker is ready, SERVING, NOT_SERVING once it
drains; the same for the whole server ("") and for kembed.v1.Embedder, and the same as kembed's
own Health says."""

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from test_worker_edge_auth import StandIn

from kembed.proto import embedder_pb2 as pb
from kembed.proto import embedder_pb2_grpc as pb_grpc
from kembed.worker.edge.server import EmbedderService, build_server
from kembed.worker.scheduling.scheduler import Scheduler

SERVICES = ["", "kembed.v1.Embedder"]
Status = health_pb2.HealthCheckResponse


@pytest.fixture
async def served():
    scheduler = Scheduler(StandIn(), max_batch_tokens=64, max_queued_tokens=4096)
    service = EmbedderService(StandIn(), scheduler, 64, revision="r1")
    server, port = build_server(service, "127.0.0.1", 0)
    scheduler.start()
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    yield service, health_pb2_grpc.HealthStub(channel), pb_grpc.EmbedderStub(channel)
    await channel.close()
    await server.stop(None)
    await scheduler.close()


async def statuses(health, embedder) -> tuple[int, ...]:
    checks = [await health.Check(health_pb2.HealthCheckRequest(service=s), timeout=5) for s in SERVICES]
    own = await embedder.Health(pb.HealthRequest(), timeout=5)
    return (*(c.status for c in checks), own.status)


async def test_check_follows_the_worker_from_start_to_drain(served):
    service, health, embedder = served
    assert await statuses(health, embedder) == (Status.NOT_SERVING, Status.NOT_SERVING, 2)
    await service.set_serving()
    assert await statuses(health, embedder) == (Status.SERVING, Status.SERVING, 1)
    await service.drain(timeout_s=1)
    assert await statuses(health, embedder) == (Status.NOT_SERVING, Status.NOT_SERVING, 2)
    await service.set_serving()  # a drain is for good
    assert await statuses(health, embedder) == (Status.NOT_SERVING, Status.NOT_SERVING, 2)


async def test_an_unknown_service_is_not_found(served):
    _, health, _ = served
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
    assert error.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("name", SERVICES, ids=["overall", "embedder"])
async def test_watch_sees_serving_then_not_serving_on_drain(served, name):
    service, health, _ = served
    watch = health.Watch(health_pb2.HealthCheckRequest(service=name), timeout=10)
    try:
        assert (await watch.read()).status == Status.NOT_SERVING
        await service.set_serving()
        assert (await asyncio.wait_for(watch.read(), 5)).status == Status.SERVING
        await service.drain(timeout_s=1)
        assert (await asyncio.wait_for(watch.read(), 5)).status == Status.NOT_SERVING
    finally:
        watch.cancel()
