"""The worker's /metrics: contracted names and labels, moving with Embed traffic through a real
in-process gRPC server on the CPU engine, split by class (interactive, bulk) where the scheduler says
it; served over HTTP on the metrics port."""

import asyncio
import urllib.request

import grpc
import numpy as np
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kembed.proto import embedder_pb2 as pb
from kembed.proto import embedder_pb2_grpc as pb_grpc
from kembed.worker.config import WorkerConfig, bundled_model_dir
from kembed.worker.edge.server import EmbedderService, build_server
from kembed.worker.engine import load_engine
from kembed.worker.errors import Unavailable
from kembed.worker.metrics import WorkerMetrics, serve_metrics
from kembed.worker.scheduling.queues import Priority
from kembed.worker.scheduling.scheduler import Scheduler

MAX_PINNED_BYTES = 1 << 20
CONTRACT = {  # family name -> label names of its samples (histogram `le` aside)
    "kembed_worker_queue_wait_seconds": {"class"},
    "kembed_worker_batch_duration_seconds": set(),
    "kembed_worker_batch_stage_seconds": {"stage"},
    "kembed_worker_request_duration_seconds": {"class"},
    "kembed_worker_batch_class_tokens": {"class"},
    "kembed_worker_batch_tokens": set(),
    "kembed_worker_batch_sequences": set(),
    "kembed_worker_queued_tokens": {"class"},
    "kembed_worker_max_queued_tokens": set(),
    "kembed_worker_lane_batches": set(),
    "kembed_worker_admitted_requests": set(),
    "kembed_worker_admitted_groups": set(),
    "kembed_worker_max_batch_tokens": set(),
    "kembed_worker_max_batch_sequences": set(),
    "kembed_worker_pinned_memory_bytes": {"state"},
    "kembed_worker_pinned_memory_limit_bytes": set(),
    "kembed_worker_graph_captures": set(),
    "kembed_worker_graph_capture_duration_seconds": set(),
    "kembed_worker_graph_replays": set(),
    "kembed_worker_eager_steps": {"reason"},
    "kembed_worker_graphs_resident": set(),
    "kembed_worker_gpu_memory_bytes": set(),
    "kembed_worker_bucket_hits": {"bucket"},
    "kembed_worker_info": {"model", "dtype", "attention_backend", "revision"},
}
CLASSES = {"interactive", "bulk"}
INTERACTIVE, BULK = 'class="interactive"', 'class="bulk"'


@pytest.fixture(scope="module")
def engine():
    return load_engine(WorkerConfig(model=bundled_model_dir(), device="cpu"))


@pytest.fixture
async def served(engine):
    """(stub, metrics) of a worker wired as `__main__` wires it."""
    metrics = WorkerMetrics(engine.info, revision="r1")
    scheduler = Scheduler(engine, max_batch_tokens=512, max_queued_tokens=4096, hooks=metrics.hooks())
    metrics.watch(engine.stats, scheduler, MAX_PINNED_BYTES)
    service = EmbedderService(engine, scheduler, scheduler.max_batch_tokens, revision="r1")
    server, port = build_server(service, "127.0.0.1", 0)
    scheduler.start()
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    yield pb_grpc.EmbedderStub(channel), metrics
    await channel.close()
    await server.stop(None)
    await scheduler.close()


def samples(metrics: WorkerMetrics) -> dict[str, float]:
    """Every sample as `name{label="value",...}` -> value, labels sorted."""
    out = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}"] = sample.value
    return out


def embed_request(*sequences: list[int]) -> pb.EmbedRequest:
    ids = np.concatenate([np.array(s, "<i4") for s in sequences])
    return pb.EmbedRequest(batch=pb.TokenBatch(token_ids=ids.tobytes(), lengths=[len(s) for s in sequences]))


async def test_metrics_parse_with_the_contracted_names_and_labels(served):
    stub, metrics = served
    await stub.Embed(embed_request([101, 7592, 102]))
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())}
    assert set(CONTRACT) <= set(families)
    for name, labels in CONTRACT.items():
        assert families[name].samples, name
        for sample in families[name].samples:
            assert set(sample.labels) - {"le"} == labels, sample
    for name, labels in CONTRACT.items():
        if "class" in labels:  # both classes from the start, and nothing else
            assert {s.labels["class"] for s in families[name].samples} == CLASSES, name
    states = {s.labels["state"] for s in families["kembed_worker_pinned_memory_bytes"].samples}
    reasons = {s.labels["reason"] for s in families["kembed_worker_eager_steps"].samples}
    assert states == {"in_use", "reserved"}
    assert reasons == {"cold", "uncapturable", "disabled", "full", "uncovered"}


async def test_an_embed_moves_the_batch_and_request_histograms(served):
    stub, metrics = served
    before = samples(metrics)
    await stub.Embed(embed_request([101, 7592, 2088, 102], [101, 102]))
    after = samples(metrics)
    assert after["kembed_worker_batch_tokens_count{}"] == before["kembed_worker_batch_tokens_count{}"] + 1
    assert after["kembed_worker_batch_tokens_sum{}"] == before["kembed_worker_batch_tokens_sum{}"] + 6
    assert after["kembed_worker_batch_sequences_sum{}"] == before["kembed_worker_batch_sequences_sum{}"] + 2
    for key in (
        f"kembed_worker_queue_wait_seconds_count{{{INTERACTIVE}}}",  # 2 sequences: interactive by size
        "kembed_worker_batch_duration_seconds_count{}",
        f"kembed_worker_request_duration_seconds_count{{{INTERACTIVE}}}",
    ):
        assert after[key] == before[key] + 1, key
    stage_sums = 0.0
    for stage in ("pack", "launch", "device", "resume"):
        key = f'kembed_worker_batch_stage_seconds_count{{stage="{stage}"}}'
        assert after[key] == before[key] + 1, stage
        key = f'kembed_worker_batch_stage_seconds_sum{{stage="{stage}"}}'
        stage_sums += after[key] - before[key]
    batch = "kembed_worker_batch_duration_seconds_sum{}"
    assert stage_sums == pytest.approx(after[batch] - before[batch], abs=1e-6)  # the stages split it
    assert after[f"kembed_worker_queued_tokens{{{INTERACTIVE}}}"] == 0
    assert after[f"kembed_worker_queued_tokens{{{BULK}}}"] == 0


@pytest.fixture
async def scheduled(engine):
    """(scheduler, metrics): the scheduler wired to its metrics as `__main__` wires it, no server."""
    metrics = WorkerMetrics(engine.info, revision="r1")
    scheduler = Scheduler(engine, max_batch_tokens=512, max_queued_tokens=4096, hooks=metrics.hooks())
    metrics.watch(engine.stats, scheduler, MAX_PINNED_BYTES)
    scheduler.start()
    yield scheduler, metrics
    await scheduler.close()


def batch(*lengths: int) -> tuple[np.ndarray, np.ndarray]:
    """(token ids, lengths) of sequences of these lengths: [CLS] word... [SEP]."""
    ids = np.concatenate([np.array([101, *[7592] * (n - 2), 102], "<i4") for n in lengths])
    return ids, np.array(lengths, "<i4")


async def test_an_interactive_and_a_bulk_request_are_counted_in_their_own_class(scheduled):
    scheduler, metrics = scheduled
    before = samples(metrics)
    await scheduler.submit(*batch(4, 2), priority=Priority.INTERACTIVE)
    await scheduler.submit(*batch(5, 3, 3), priority=Priority.BULK)
    after = samples(metrics)

    def moved(key: str) -> float:
        return after[key] - before[key]

    for klass in (INTERACTIVE, BULK):
        assert moved(f"kembed_worker_queue_wait_seconds_count{{{klass}}}") == 1, klass
        assert moved(f"kembed_worker_request_duration_seconds_count{{{klass}}}") == 1, klass
        assert after[f"kembed_worker_queued_tokens{{{klass}}}"] == 0, klass
    assert moved(f"kembed_worker_batch_class_tokens_total{{{INTERACTIVE}}}") == 6
    assert moved(f"kembed_worker_batch_class_tokens_total{{{BULK}}}") == 11
    assert moved("kembed_worker_batch_tokens_sum{}") == 17  # the classes split the batches' tokens


async def test_queued_tokens_are_reported_per_class_while_they_wait(engine):
    metrics = WorkerMetrics(engine.info, revision="r1")
    scheduler = Scheduler(engine, max_batch_tokens=512, max_queued_tokens=4096, hooks=metrics.hooks())
    metrics.watch(engine.stats, scheduler, MAX_PINNED_BYTES)  # never started: requests stay queued
    waiting = [
        asyncio.create_task(scheduler.submit(*batch(4, 2), priority=Priority.INTERACTIVE)),
        asyncio.create_task(scheduler.submit(*batch(5, 3, 3), priority=Priority.BULK)),
        asyncio.create_task(scheduler.submit(*batch(7))),  # unspecified: interactive by its size
    ]
    await asyncio.sleep(0)
    queued = samples(metrics)
    await scheduler.close()
    results = await asyncio.gather(*waiting, return_exceptions=True)
    assert all(isinstance(result, Unavailable) for result in results), results
    assert queued[f"kembed_worker_queued_tokens{{{INTERACTIVE}}}"] == 13
    assert queued[f"kembed_worker_queued_tokens{{{BULK}}}"] == 11
    assert samples(metrics)[f"kembed_worker_queued_tokens{{{INTERACTIVE}}}"] == 0


async def test_the_budgets_the_scheduler_enforces_are_exported(served):
    _, metrics = served
    after = samples(metrics)
    assert after["kembed_worker_max_batch_tokens{}"] == 512
    assert after["kembed_worker_max_batch_sequences{}"] == 256
    assert after["kembed_worker_max_queued_tokens{}"] == 4096


async def test_the_cpu_engine_counts_eager_steps_as_disabled_and_reports_no_graphs(served, engine):
    stub, metrics = served
    disabled = 'kembed_worker_eager_steps_total{reason="disabled"}'
    before = samples(metrics)
    await stub.Embed(embed_request([101, 102]))
    after = samples(metrics)
    assert after[disabled] == before[disabled] + 1
    assert after['kembed_worker_eager_steps_total{reason="cold"}'] == 0
    assert after["kembed_worker_graph_captures_total{}"] == 0
    assert after["kembed_worker_graph_replays_total{}"] == 0
    assert after["kembed_worker_graphs_resident{}"] == 0
    assert after["kembed_worker_gpu_memory_bytes{}"] == 0
    assert after['kembed_worker_pinned_memory_bytes{state="in_use"}'] == 0
    assert after['kembed_worker_pinned_memory_bytes{state="reserved"}'] == 0
    assert after["kembed_worker_pinned_memory_limit_bytes{}"] == MAX_PINNED_BYTES
    assert after["kembed_worker_graph_capture_duration_seconds_count{}"] == 0
    name = engine.info.model_name
    info = f'kembed_worker_info{{attention_backend="sdpa",dtype="float32",model="{name}",revision="r1"}}'
    assert after.get(info) == 1, [k for k in after if k.startswith("kembed_worker_info")]


def test_metrics_are_served_over_http(engine):
    metrics = WorkerMetrics(engine.info, revision="r1")
    scheduler = Scheduler(engine, max_batch_tokens=512, max_queued_tokens=4096)  # never started
    metrics.watch(engine.stats, scheduler, MAX_PINNED_BYTES)
    server, port = serve_metrics(metrics.registry, "127.0.0.1", 0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    names = {family.name for family in text_string_to_metric_families(text)}
    assert set(CONTRACT) <= names


async def test_bucket_hits_count_batches_by_their_own_bucket(served):
    stub, metrics = served
    key = 'kembed_worker_bucket_hits_total{bucket="2x64"}'  # 2 sequences, 6 tokens: bucket 2x64
    before = samples(metrics).get(key, 0.0)
    for _ in range(3):
        await stub.Embed(embed_request([101, 7592, 2088, 102], [101, 102]))
    after = samples(metrics)
    assert after[key] == before + 3
    assert all(value > 0 for name, value in after.items() if name.startswith("kembed_worker_bucket_hits"))


def test_observing_many_at_once_exposes_what_observing_each_would():
    """observe_many (a group's requests share one duration) goes through prometheus_client's own
    histogram fields: the exposition must equal `count` calls of observe (this fails first if
    prometheus_client changes them)."""
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from kembed.worker.metrics import DURATION_BUCKETS, observe_many

    cases = [(3e-4, 7), (2.5e-3, 1), (DURATION_BUCKETS[20], 3), (0.0, 2), (1e9, 4)]
    exposed = []
    for at_once in (False, True):
        registry = CollectorRegistry()
        histogram = Histogram("h", "h", buckets=DURATION_BUCKETS, registry=registry)
        for value, count in cases:
            if at_once:
                observe_many(histogram, value, count)
            else:
                for _ in range(count):
                    histogram.observe(value)
        exposed.append(
            [line for line in generate_latest(registry).decode().splitlines() if "created" not in line]
        )
    assert exposed[0] == exposed[1]
