"""The worker's Prometheus metrics: what the scheduler reports through its hooks, and what the engine
holds, read when Prometheus scrapes. Torch-free: the engine is reached only through a `stats()`
callable returning a plain `EngineStats`.

Names and labels are a contract with the dashboards and alerts (docs/metrics.md). Each worker gets a
registry of its own (not prometheus_client's global one), so tests can run several in one process.
Served by prometheus_client's HTTP server on `metrics_port` (started in `__main__`).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Protocol
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from kembed.worker.hooks import SchedulerHooks
from kembed.worker.info import EAGER_REASONS, EngineStats, ModelInfo

# Latency buckets a quarter octave apart: 2**(k/4) s from 2**-16 s (15 µs: a pack or hand-off stage)
# to 2**6 s (64 s: a long capture or a CPU batch), 89 bounds. histogram_quantile interpolates linearly
# inside a bucket, so a quantile is off by less than one bucket's width, 19 % (2**(1/4) - 1), even
# for a point mass; for latencies spread like a lognormal of sigma >= 0.1 its p50, p90 and p99 are
# within 10 % (tests/monitoring/test_histogram_resolution.py). Doubling buckets could not tell a
# 1.3 ms batch from a 2.5 ms one. The gateway's DURATION_BUCKETS are the same (a test checks it).
DURATION_BUCKETS = tuple(2 ** (k / 4) for k in range(-64, 25))
# Tokens per batch 1 .. 2**17 and sequences per batch 1 .. 1024 (past the budgets' defaults).
TOKEN_BUCKETS = tuple(float(2**i) for i in range(18))
SEQUENCE_BUCKETS = tuple(float(2**i) for i in range(11))
BATCH_STAGES = ("pack", "launch", "device", "resume")  # in SchedulerHooks.batch_stages' order
# The `class` label's values, as Priority.label names them (worker/scheduling/queues.py): two, whatever
# clients send.
CLASSES = ("interactive", "bulk")


class QueueState(Protocol):
    """What the collector reads from the scheduler at each scrape: its backlog per class and the
    budgets it enforces (the dashboards draw batch fill and queue depth against these)."""

    @property
    def queued_tokens_by_class(self) -> Mapping[str, int]: ...

    max_batch_tokens: int
    max_batch_sequences: int
    max_queued_tokens: int

    num_groups: int  # request groups admitted since start
    num_requests: int  # requests admitted since start

    @property
    def num_lane_batches(self) -> int:
        """Batches run on the interactive lane since start (0 without one)."""


class WorkerMetrics:
    """The metrics the scheduler pushes (histograms, tokens per class) plus a collector for engine and
    queue state."""

    def __init__(self, info: ModelInfo, *, revision: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = CollectorRegistry() if registry is None else registry
        r = self.registry

        def histogram(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(name, doc, buckets=buckets, registry=r)

        self.queue_wait = Histogram(
            "kembed_worker_queue_wait_seconds",
            "Per request: time from admission until its first sequence's batch is launched, by class.",
            ["class"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.batch_duration = histogram(
            "kembed_worker_batch_duration_seconds",
            "Per batch: time from its launch (packing included) until its rows are on the host.",
            DURATION_BUCKETS,
        )
        self.batch_stage = Histogram(
            "kembed_worker_batch_stage_seconds",
            "Per batch, its duration split by stage: pack (on the event loop), launch (the step's CPU "
            "work, after a hand-off to the launcher thread unless an idle worker launched it from the "
            "loop), device (device time and the copy of the rows), resume (the waiter's hand-off back "
            "to the event loop).",
            ["stage"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self._stages = tuple(self.batch_stage.labels(stage) for stage in BATCH_STAGES)
        self.request_duration = Histogram(
            "kembed_worker_request_duration_seconds",
            "Per Embed/Score request: time from admission until its answer (or failure), by class.",
            ["class"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.batch_class_tokens = Counter(
            "kembed_worker_batch_class_tokens",
            "Real (unpadded) tokens of the launched batches, by the class of their request.",
            ["class"],
            registry=r,
        )
        # Children bound once, so that both classes' series exist from the start (rate() needs the
        # zero) and a hook looks its class up in a dict instead of calling labels().
        self._queue_wait = {klass: self.queue_wait.labels(klass) for klass in CLASSES}
        self._request_duration = {klass: self.request_duration.labels(klass) for klass in CLASSES}
        self._interactive_tokens, self._bulk_tokens = (self.batch_class_tokens.labels(k) for k in CLASSES)
        self.batch_tokens = histogram(
            "kembed_worker_batch_tokens", "Real (unpadded) tokens per launched batch.", TOKEN_BUCKETS
        )
        self.batch_sequences = histogram(
            "kembed_worker_batch_sequences", "Sequences per launched batch.", SEQUENCE_BUCKETS
        )
        info_gauge = Gauge(
            "kembed_worker_info",
            "What this worker serves (always 1).",
            ["model", "dtype", "attention_backend", "revision"],
            registry=r,
        )
        info_gauge.labels(info.model_name, info.dtype, info.attention_backend, revision).set(1)

    def watch(
        self, engine_stats: Callable[[], EngineStats], queue: QueueState, max_pinned_bytes: int
    ) -> None:
        """Read engine and queue state at each scrape (once the scheduler, built with `hooks()`, exists)."""
        self.registry.register(EngineCollector(engine_stats, queue, max_pinned_bytes))

    def hooks(self) -> SchedulerHooks:
        """The scheduler's callbacks, bound to these metrics."""

        def batch_launched(num_seqs: int, num_tokens: int, num_bulk_tokens: int) -> None:
            self.batch_sequences.observe(num_seqs)
            self.batch_tokens.observe(num_tokens)
            self._interactive_tokens.inc(num_tokens - num_bulk_tokens)
            self._bulk_tokens.inc(num_bulk_tokens)

        def batch_stages(*seconds: float) -> None:
            for stage, value in zip(self._stages, seconds, strict=True):
                stage.observe(value)

        return SchedulerHooks(
            batch_stages=batch_stages,
            batch_launched=batch_launched,
            queue_waited=lambda seconds, klass, count: observe_many(self._queue_wait[klass], seconds, count),
            batch_finished=self.batch_duration.observe,
            request_finished=lambda seconds, klass, count: observe_many(
                self._request_duration[klass], seconds, count
            ),
        )


def observe_many(histogram: Histogram, value: float, count: int) -> None:
    """`count` observations of `value` at once, as `count` calls of `histogram.observe(value)` would
    record them: the requests of a group share their admission time, so a batch answers tens of
    requests with one duration. prometheus_client observes one value at a time, scanning its 89
    bounds in Python (~2-3 µs a call); this finds the bucket once (a test checks it agrees with
    `observe` for the pinned prometheus_client)."""
    if count == 1:
        histogram.observe(value)
        return
    histogram._sum.inc(value * count)  # prometheus_client's own fields
    histogram._buckets[bisect.bisect_left(histogram._upper_bounds, value)].inc(count)


class EngineCollector(Collector):
    """Engine and queue state, read at scrape time rather than pushed from the hot path."""

    def __init__(
        self, engine_stats: Callable[[], EngineStats], queue: QueueState, max_pinned_bytes: int
    ) -> None:
        self._engine_stats = engine_stats
        self._queue = queue
        self._max_pinned_bytes = max_pinned_bytes

    def collect(self) -> Iterator[Metric]:
        stats = self._engine_stats()
        queue = self._queue
        queued = GaugeMetricFamily(
            "kembed_worker_queued_tokens",
            "Tokens admitted and not yet answered, by class (the admission cap counts their sum).",
            labels=["class"],
        )
        by_class = queue.queued_tokens_by_class
        for klass in CLASSES:
            queued.add_metric([klass], by_class.get(klass, 0))
        yield queued
        yield CounterMetricFamily(
            "kembed_worker_lane_batches",
            "Batches run on the interactive lane (CUDA workers: queries on a stream of their own, beside "
            "the bulk steps), since start; 0 without a lane. All batches: kembed_worker_batch_tokens_count.",
            value=queue.num_lane_batches,
        )
        yield CounterMetricFamily(
            "kembed_worker_admitted_requests",
            "Requests admitted into the queue, since start (refused ones not counted).",
            value=queue.num_requests,
        )
        yield CounterMetricFamily(
            "kembed_worker_admitted_groups",
            "Groups of requests admitted together, since start: a data-port frame's requests of one class, "
            "or one unary call. Requests over groups is how many a gateway's frame carried.",
            value=queue.num_groups,
        )
        yield GaugeMetricFamily(
            "kembed_worker_max_queued_tokens",
            "The admission cap: past this many queued tokens a request is refused (max_queued_tokens).",
            value=queue.max_queued_tokens,
        )
        yield GaugeMetricFamily(
            "kembed_worker_max_batch_tokens",
            "The token budget of one batch (max_batch_tokens).",
            value=queue.max_batch_tokens,
        )
        yield GaugeMetricFamily(
            "kembed_worker_max_batch_sequences",
            "The most sequences in one batch (max_batch_sequences).",
            value=queue.max_batch_sequences,
        )
        pinned = GaugeMetricFamily(
            "kembed_worker_pinned_memory_bytes",
            "Pinned host memory of the result ring: in_use holds batches in flight, reserved is allocated.",
            labels=["state"],
        )
        pinned.add_metric(["in_use"], stats.pinned_in_use_bytes)
        pinned.add_metric(["reserved"], stats.pinned_reserved_bytes)
        yield pinned
        yield GaugeMetricFamily(
            "kembed_worker_pinned_memory_limit_bytes",
            "The hard cap on pinned host memory (max_pinned_bytes).",
            value=self._max_pinned_bytes,
        )
        yield CounterMetricFamily(
            "kembed_worker_graph_captures", "CUDA graphs captured (lazily or by prewarm).", stats.num_captures
        )
        yield _histogram(
            "kembed_worker_graph_capture_duration_seconds",
            "Time to capture one CUDA graph (warm-up run included).",
            stats.capture_seconds,
        )
        yield CounterMetricFamily(
            "kembed_worker_graph_replays", "Steps that replayed a captured CUDA graph.", stats.num_replays
        )
        eager = CounterMetricFamily(
            "kembed_worker_eager_steps",
            "Steps run eagerly, by reason: cold (first hit, without start-up prewarm), uncapturable "
            "(fits no bucket), disabled (no graphs on this engine), full (graph cap reached), "
            "uncovered (after prewarm, no captured bucket holds the batch).",
            labels=["reason"],
        )
        for reason in EAGER_REASONS:
            eager.add_metric([reason], stats.eager_steps.get(reason, 0))
        yield eager
        yield GaugeMetricFamily(
            "kembed_worker_graphs_resident", "CUDA graphs held now.", value=stats.num_graphs_resident
        )
        hits = CounterMetricFamily(
            "kembed_worker_bucket_hits",
            "Batches by their bucket (SEQUENCESxTOKENS, the smallest that holds the batch), since start; "
            "only buckets hit at least once. The operator reads the hottest to prewarm new pods.",
            labels=["bucket"],
        )
        for bucket, count in sorted(stats.bucket_hits.items()):
            hits.add_metric([bucket], count)
        yield hits
        yield GaugeMetricFamily(
            "kembed_worker_gpu_memory_bytes",
            "Device memory held by torch's caching allocator (graph pool included); 0 on the CPU.",
            value=stats.gpu_memory_bytes,
        )


def _histogram(name: str, doc: str, observations: Sequence[float]) -> HistogramMetricFamily:
    """A histogram family built from every observation so far (captures: at most a few hundred)."""
    counts = [0] * (len(DURATION_BUCKETS) + 1)
    for seconds in observations:
        counts[bisect.bisect_left(DURATION_BUCKETS, seconds)] += 1
    cumulative, buckets = 0, []
    for bound, count in zip((*DURATION_BUCKETS, float("inf")), counts, strict=True):
        cumulative += count
        buckets.append((floatToGoString(bound), cumulative))
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=sum(observations))


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> tuple[WSGIServer, int]:
    """prometheus_client's HTTP server for `registry` on a daemon thread; (server, bound port)."""
    server, _ = start_http_server(port, addr=host, registry=registry)
    return server, server.server_port
