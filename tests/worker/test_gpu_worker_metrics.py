"""The worker's Prometheus exposition on the CUDA engine under load (`pytest -m gpu`): the metrics
that only move on a GPU (pinned memory in use, captures, replays, resident graphs, GPU memory), read
through the same registry and collector `/metrics` serves, while batches are in flight and after."""

import asyncio
import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from st_pipeline import write_random_minilm

from kembed.worker.config import WorkerConfig
from kembed.worker.engine import load_engine
from kembed.worker.metrics import WorkerMetrics
from kembed.worker.scheduling.scheduler import Scheduler

pytestmark = pytest.mark.gpu
MAX_PINNED_BYTES = 64 << 20


def scrape(metrics: WorkerMetrics) -> dict[tuple[str, tuple], float]:
    samples = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("bert")
    write_random_minilm(path)
    return path


async def test_pinned_memory_moves_with_load_and_returns_to_idle(model_dir):
    config = WorkerConfig(model=model_dir, device="cuda", dtype="bfloat16", max_pinned_bytes=MAX_PINNED_BYTES)
    engine = load_engine(config)
    metrics = WorkerMetrics(engine.info, revision="gpu")
    scheduler = Scheduler(engine, max_batch_tokens=2048, max_queued_tokens=1 << 20, hooks=metrics.hooks())
    metrics.watch(engine.stats, scheduler, MAX_PINNED_BYTES)
    in_use = ("kembed_worker_pinned_memory_bytes", (("state", "in_use"),))
    reserved = ("kembed_worker_pinned_memory_bytes", (("state", "reserved"),))
    idle = scrape(metrics)
    assert idle[in_use] == 0
    assert idle[("kembed_worker_pinned_memory_limit_bytes", ())] == MAX_PINNED_BYTES
    assert 0 < idle[reserved] <= MAX_PINNED_BYTES

    peak, stop, trace, began = [0.0], threading.Event(), [], time.perf_counter()
    queued = [("kembed_worker_queued_tokens", (("class", klass),)) for klass in ("interactive", "bulk")]

    def sample() -> None:  # a scraper polling while batches are in flight
        while not stop.is_set():
            now = scrape(metrics)
            peak[0] = max(peak[0], now[in_use])
            trace.append(
                (time.perf_counter() - began, now[in_use], now[reserved], sum(now[k] for k in queued))
            )
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    rng = np.random.default_rng(0)
    scheduler.start()
    sampler.start()
    try:

        async def client() -> None:
            for _ in range(30):
                lengths = rng.integers(8, 200, 24).astype(np.int32)
                ids = rng.integers(5, 30000, int(lengths.sum())).astype(np.int32)
                rows = await scheduler.submit(ids, lengths)
                assert rows.shape == (24, 384) and np.isfinite(rows).all()

        await asyncio.gather(*(client() for _ in range(6)))
        await asyncio.sleep(0.3)  # idle, still scraped
    finally:
        stop.set()
        sampler.join()
        await scheduler.close()
    after = scrape(metrics)
    trace.append((time.perf_counter() - began, after[in_use], after[reserved], sum(after[k] for k in queued)))
    if path := os.environ.get("KEMBED_PINNED_TRACE"):  # docs/metrics-pinned-memory-gpu.png's data
        record = {"limit": MAX_PINNED_BYTES, "samples": trace, "device": engine.info.device}
        await asyncio.to_thread(Path(path).write_text, json.dumps(record))
    assert 0 < peak[0] <= after[reserved]  # slots held while their batch was in flight
    assert after[in_use] == 0  # every slot given back
    assert after[("kembed_worker_graph_captures_total", ())] > 0
    assert after[("kembed_worker_graph_replays_total", ())] > 0
    assert after[("kembed_worker_graphs_resident", ())] == after[("kembed_worker_graph_captures_total", ())]
    assert after[("kembed_worker_eager_steps_total", (("reason", "cold"),))] > 0
    assert after[("kembed_worker_gpu_memory_bytes", ())] > 0
    assert after[("kembed_worker_graph_capture_duration_seconds_count", ())] > 0
