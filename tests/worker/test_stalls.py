"""A worker knows when it is stalled: a device step running far past what steps of its size take
makes its health checks (the standard gRPC Health, which Kubernetes probes, and kembed's own) answer
NOT_SERVING with the reason, and SERVING again once the step ends; it reports its device's rate."""

import asyncio
import threading

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from test_worker_edge_auth import StandIn

from kembed.proto import embedder_pb2 as pb
from kembed.proto import embedder_pb2_grpc as pb_grpc
from kembed.worker.edge.server import EmbedderService, build_server
from kembed.worker.scheduling.scheduler import Scheduler
from kembed.worker.scheduling.stalls import StepWatch, size_key

Status = health_pb2.HealthCheckResponse


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_step_far_past_its_sizes_expected_time_is_a_stall():
    clock = Clock()
    watch = StepWatch(multiple=10.0, min_s=1.0, unseen_s=30.0, clock=clock)
    for _ in range(3):  # steps of ~512 tokens take 0.2 s
        step = watch.started(500)
        clock.now += 0.2
        watch.finished(step, 500)
    step = watch.started(510)  # the same size: limit max(1 s, 10 x 0.2 s) = 2 s
    clock.now += 1.9
    assert watch.stall() is None
    clock.now += 0.2
    reason = watch.stall()
    assert reason is not None and reason.startswith("stalled: a device step of ~512 tokens has run 2.1 s")
    watch.finished(step, 510)
    assert watch.stall() is None
    unseen = watch.started(4000)  # a size not seen: a first step may capture, 30 s
    clock.now += 29.0
    assert watch.stall() is None
    clock.now += 2.0
    assert "none seen yet" in (watch.stall() or "")
    watch.finished(unseen, 4000, is_ok=False)
    assert watch.stall() is None


def test_the_rate_counts_overlapping_batches_once():
    clock = Clock()
    watch = StepWatch(min_batch_tokens=256, clock=clock)
    first, second = watch.started(1000), watch.started(1000)  # two in flight, 0.1 s of device each
    clock.now += 0.1
    watch.finished(first, 1000)
    clock.now += 0.1
    watch.finished(second, 1000)  # timed from the first's end, not from its own launch
    assert watch.tokens_per_s == pytest.approx(10_000)
    small = watch.started(16)  # too small a batch to say what the device can do
    clock.now += 0.01
    watch.finished(small, 16)
    assert watch.tokens_per_s == pytest.approx(10_000)
    assert size_key(1) == 64 and size_key(1024) == 1024 and size_key(1025) == 1280


class Hanging(StandIn):
    """Steps hang until `release` is set (a wedged device)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def step(self, packed):
        self.release.wait(10)
        return super().step(packed)


async def test_a_hung_step_turns_health_not_serving_and_back(tmp_path):
    engine = Hanging()
    steps = StepWatch(multiple=10.0, min_s=0.3, unseen_s=0.3)
    scheduler = Scheduler(engine, max_batch_tokens=64, max_queued_tokens=4096, steps=steps)
    service = EmbedderService(engine, scheduler, 64, revision="r1")
    server, port = build_server(service, "127.0.0.1", 0)
    scheduler.start()
    await server.start()
    await service.set_serving()
    watch = asyncio.create_task(service.readiness.watch(steps.stall, 0.05, lambda: None))
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    health, embedder = health_pb2_grpc.HealthStub(channel), pb_grpc.EmbedderStub(channel)
    try:
        batch = pb.TokenBatch(token_ids=np.array([5, 6, 7], "<i4").tobytes(), lengths=[3])
        call = asyncio.ensure_future(embedder.Embed(pb.EmbedRequest(batch=batch), timeout=10))
        loop = asyncio.get_running_loop()
        started = loop.time()
        while (await embedder.Health(pb.HealthRequest(), timeout=5)).status == pb.HealthResponse.SERVING:
            assert loop.time() - started < 3.0, "a step hung for 3 s and the worker still says SERVING"
            await asyncio.sleep(0.05)
        own = await embedder.Health(pb.HealthRequest(), timeout=5)
        assert own.reason.startswith("stalled: a device step")
        for name in ("", "kembed.v1.Embedder"):  # what the readiness and liveness probes read
            check = await health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            assert check.status == Status.NOT_SERVING
        engine.release.set()  # the step ends: serving again, and its request answered
        response = await call
        assert response.num_sequences == 1
        started = loop.time()
        while (await embedder.Health(pb.HealthRequest(), timeout=5)).status != pb.HealthResponse.SERVING:
            assert loop.time() - started < 3.0, "the step ended and the worker still says NOT_SERVING"
            await asyncio.sleep(0.05)
        check = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert check.status == Status.SERVING
    finally:
        engine.release.set()
        watch.cancel()
        await channel.close()
        await server.stop(None)
        await scheduler.close()


def test_time_the_process_was_not_running_does_not_count_toward_a_stall():
    """A SIGSTOP (or a host that did not schedule the worker) freezes the step and the watch alike:
    the gap between two looks counts `max_gap_s` at most. A query step in flight across a 1.5 s stop
    read as run 1.5 s against its 1 s limit, and the lone worker's gateway answered 503."""
    clock = Clock()
    watch = StepWatch(multiple=10.0, min_s=1.0, clock=clock, max_gap_s=0.4)
    for _ in range(3):  # query steps take 20 ms
        step = watch.started(64)
        clock.now += 0.02
        watch.finished(step, 64)
    step = watch.started(64)
    for _ in range(2):  # looks every 0.2 s: the live clock keeps up
        clock.now += 0.2
        assert watch.stall() is None
    clock.now += 1.5  # stopped: one gap of 1.5 s between looks counts 0.4 s
    assert watch.stall() is None  # 0.4 + 0.4 = 0.8 s, not 1.9 s
    clock.now += 0.1
    assert watch.stall() is None
    clock.now += 0.2  # running again, and the step does not end: a stall after all
    assert (watch.stall() or "").startswith("stalled: a device step of ~64 tokens has run 1.1 s")
    watch.finished(step, 64)


def test_a_cpu_step_that_computes_is_slow_not_stalled():
    """On a CPU device the process's CPU time shows a step progressing: one slowed 30x by a loaded
    host (a fifth of a core) is not stalled; one that computes nothing (deadlocked) is."""
    clock, cpu = Clock(), Clock()
    watch = StepWatch(multiple=10.0, min_s=1.0, clock=clock, progress=cpu, min_progress_share=0.1)
    for size in (64, 128):
        step = watch.started(size)
        clock.now += 0.05
        watch.finished(step, size)  # 50 ms expected: limit 1 s
    slow = watch.started(64)
    for _ in range(10):
        clock.now += 0.2
        cpu.now += 0.04  # a fifth of a core
        assert watch.stall() is None
    watch.finished(slow, 64)
    stuck = watch.started(128)
    for _ in range(6):
        clock.now += 0.2
        cpu.now += 0.001  # the event loop's own few milliseconds
    reason = watch.stall()
    assert reason is not None and "of CPU since" in reason
    watch.finished(stuck, 128)
