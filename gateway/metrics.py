"""The gateway's Prometheus metrics, on a registry of its own per app, and the ASGI middleware that
times every request.

Names and labels are a contract with the dashboards and alerts (docs/metrics.md). Labels stay
bounded: `route` is one of the app's route paths (none has parameters) or `unmatched`; `code` is an
HTTP status; `reason` is an error class's snake-case name. A registry per app (not prometheus_client's
global one) lets several gateways live in one process, as the tests run them; several gateway
processes on one port (processes.py) report the sum of their values.

What every request records (its duration, tokenize time, inputs, tokens, class) is kept in plain lists
on the event loop and folded into the metrics in bulk (`Batched`, `fold`): at least every FOLD_S and
before every scrape this process answers. prometheus_client takes a lock per increment and scans a
histogram's 89 bounds in Python per observation, ~10-15 µs of a request's CPU for the four of them;
a fold buckets a whole batch with numpy.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Latency buckets a quarter octave apart: 2**(k/4) s from 2**-16 s (15 µs, a tokenize call of tens
# of microseconds) to 2**6 s (64 s, past the 60 s request timeout), 89 bounds. histogram_quantile
# interpolates linearly inside a bucket, so a quantile is off by less than one bucket's width, 19 %
# (2**(1/4) - 1), even for a point mass; for latencies spread like a lognormal of sigma >= 0.1 its
# p50, p90 and p99 are within 10 % (tests/monitoring/test_histogram_resolution.py). Doubling buckets
# read every value in (1.28, 2.56] ms back as p50 1.92 ms. Powers of two are bounds, so the default
# latency alert (p99 > 0.5 s) fires when more than 1 % of requests took longer, no interpolation in
# the way.
# The worker's DURATION_BUCKETS are the same (a test checks it): one rule for every latency panel.
DURATION_BUCKETS = tuple(2 ** (k / 4) for k in range(-64, 25))
# Counts per request: 1 to 4096 inputs (past the default client batch cap), 1 to 2**20 tokens.
INPUT_BUCKETS = tuple(float(2**i) for i in range(13))
TOKEN_BUCKETS = tuple(float(2**i) for i in range(21))

METRICS_PATH = "/metrics"
UNMATCHED = "unmatched"  # the route label of a path no route serves
FOLD_S = 1.0  # the most a recorded observation waits to reach the metrics (a scrape folds at once)


class Batched:
    """A histogram (or counter) child fed from the event loop: `observe` appends, `fold` hands the
    values to prometheus_client in bulk, as that many `observe` (`inc`) calls would record them (a
    test checks it for the pinned prometheus_client)."""

    __slots__ = ("_bounds", "_child", "pending")

    def __init__(self, child: Histogram | Counter) -> None:
        self._child: Any = child
        # a histogram's finite bounds: value v lands in the first bucket whose bound is >= v
        bounds = getattr(child, "_upper_bounds", None)
        self._bounds = None if bounds is None else np.asarray(bounds[:-1])
        self.pending: list[float] = []

    def observe(self, value: float) -> None:
        self.pending.append(value)

    inc = observe

    def fold(self) -> None:
        if not self.pending:
            return
        values, self.pending = np.asarray(self.pending, dtype=np.float64), []
        child = self._child
        if self._bounds is None:  # a counter
            child.inc(float(values.sum()))
            return
        counts = np.bincount(
            np.searchsorted(self._bounds, values, side="left"), minlength=len(self._bounds) + 1
        )
        child._sum.inc(float(values.sum()))  # prometheus_client's own fields
        for index in np.flatnonzero(counts).tolist():
            child._buckets[index].inc(int(counts[index]))


class GatewayMetrics:
    """Every gateway metric, registered on `registry` (a fresh one by default)."""

    def __init__(
        self, registry: CollectorRegistry | None = None, multiprocess_dir: Path | None = None
    ) -> None:
        self.registry = CollectorRegistry() if registry is None else registry
        # One of several gateway processes (processes.py): prometheus_client keeps every process's
        # values in files there, and a scrape of any process reports their sum.
        self._multiprocess_dir = multiprocess_dir
        self._collectors: list[Collector] = []  # registered on the scrape registry too
        r = self.registry
        self.request_duration = Histogram(
            "kembed_gateway_request_duration_seconds",
            "Time from a request's arrival to its response, by route template and HTTP status.",
            ["route", "code"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.tokenize_duration = Histogram(
            "kembed_gateway_tokenize_duration_seconds",
            "Time to tokenize one request's inputs (batch-encoded off the event loop).",
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.request_inputs = Histogram(
            "kembed_gateway_request_inputs",
            "Inputs (texts, token lists or rerank documents) per embedding or rerank request.",
            buckets=INPUT_BUCKETS,
            registry=r,
        )
        self.request_tokens = Histogram(
            "kembed_gateway_request_tokens",
            "Tokens sent to the workers per embedding or rerank request, after templates and truncation.",
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.upstream_retries = Counter(
            "kembed_gateway_upstream_retries",
            "Chunks sent again to another replica after one refused (full queue) or was down.",
            registry=r,
        )
        self.hedges = Counter(
            "kembed_gateway_hedges",
            "Chunks sent to a second replica because the first attempt ran past its hedge budget.",
            registry=r,
        )
        self.hedge_wins = Counter(
            "kembed_gateway_hedge_wins",
            "Hedged chunks whose second attempt answered first (the first was cancelled).",
            registry=r,
        )
        self.class_requests = Counter(
            "kembed_gateway_class_requests",
            "Requests admitted, by class (interactive: served first by the workers; bulk).",
            ["class"],
            registry=r,
        )
        self.class_tokens = Counter(
            "kembed_gateway_class_tokens",
            "Tokens of the requests admitted, by class.",
            ["class"],
            registry=r,
        )
        for klass in ("interactive", "bulk"):  # both series exist from the start (rate() needs a zero)
            self.class_requests.labels(klass)
            self.class_tokens.labels(klass)
        self.errors = Counter(
            "kembed_gateway_errors",
            "Requests answered with an error, by the error's kind.",
            ["reason"],
            registry=r,
        )
        self.inflight_requests = Gauge(
            "kembed_gateway_inflight_requests",
            "Requests received and not yet answered (scrapes of /metrics excluded).",
            registry=r,
            multiprocess_mode="livesum",  # several processes: the sum over those alive
        )
        self.open_connections = Gauge(
            "kembed_gateway_open_connections",
            "Client HTTP connections open now (bounded by max_connections per process).",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.held_requests = Gauge(
            "kembed_gateway_held_requests",
            "Requests held now because the model has no serving worker (scaled to zero, or every "
            "worker restarting): the demand that wakes a model at zero (hold.py).",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.holds = Counter(
            "kembed_gateway_holds",
            "Requests that found no serving worker and were held for one.",
            registry=r,
        )
        self.hold_refusals = Counter(
            "kembed_gateway_hold_refusals",
            "Requests answered 503 for want of a serving worker, by reason: full (the hold's count or "
            "bytes bound), expired (held past wake_timeout_s).",
            ["reason"],
            registry=r,
        )
        for reason in ("full", "expired"):
            self.hold_refusals.labels(reason)
        # per request, through Batched (module docstring)
        self.tokenize = Batched(self.tokenize_duration)
        self.inputs = Batched(self.request_inputs)
        self.tokens = Batched(self.request_tokens)
        self.class_requests_of = {k: Batched(self.class_requests.labels(k)) for k in ("interactive", "bulk")}
        self.class_tokens_of = {k: Batched(self.class_tokens.labels(k)) for k in ("interactive", "bulk")}
        self._durations: dict[tuple[str, int], Batched] = {}
        self._batched: list[Batched] = [
            self.tokenize,
            self.inputs,
            self.tokens,
            *self.class_requests_of.values(),
            *self.class_tokens_of.values(),
        ]
        self._fold_task: asyncio.Task[None] | None = None
        self.connections_closed = Counter(
            "kembed_gateway_connections_closed",
            "Client connections the gateway closed itself, by reason: idle_timeout, header_timeout, "
            "body_timeout, headers_too_large, body_too_large (a hot route's body over the cap: 413), "
            "evicted_idle (to make room), too_many_connections.",
            ["reason"],
            registry=r,
        )

    def duration(self, route: str, code: int) -> Batched:
        """The request-duration series of a route template and status."""
        batched = self._durations.get((route, code))
        if batched is None:
            batched = self._durations[route, code] = Batched(self.request_duration.labels(route, str(code)))
            self._batched.append(batched)
        return batched

    def fold(self) -> None:
        """What the requests recorded, into the metrics."""
        for batched in self._batched:
            batched.fold()

    def start_folding(self) -> None:
        """Fold every FOLD_S on the running loop (the app's lifespan), until `stop_folding`."""

        async def every_interval() -> None:
            while True:
                await asyncio.sleep(FOLD_S)
                self.fold()

        self._fold_task = asyncio.get_running_loop().create_task(every_interval(), name="kembed-metrics-fold")

    async def stop_folding(self) -> None:
        if self._fold_task is not None:
            self._fold_task.cancel()
            await asyncio.gather(self._fold_task, return_exceptions=True)
        self.fold()

    def watch(self, served_name: Callable[[], str]) -> None:
        """Report `kembed_gateway_info{model}` at each scrape: the name this gateway serves (its
        workers' model unless configured), which dashboards and alerts join on (namespace, pod)."""
        collector = InfoCollector(served_name)
        self.registry.register(collector)
        self._collectors.append(collector)

    def watch_workers(self, num_serving: Callable[[], int], num_refused: Callable[[], int]) -> None:
        """Report `kembed_gateway_serving_workers` at each scrape: the worker replicas this process
        would send a chunk to now (what /ready counts). 0 while the gateway is up is an outage even
        when no request arrives to fail. And `kembed_gateway_refused_workers`: those refused for
        serving another model than the gateway's (model_check.py)."""
        collector = ServingCollector(num_serving, num_refused)
        self.registry.register(collector)
        self._collectors.append(collector)

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        self.fold()
        if self._multiprocess_dir is None:
            return generate_latest(self.registry), CONTENT_TYPE_LATEST
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(self._multiprocess_dir))
        for collector in self._collectors:
            registry.register(collector)
        return generate_latest(registry), CONTENT_TYPE_LATEST


# What an endpoint of several models records once, for all of them (the HTTP edge); every other
# family is a model's own, labelled `model` (render_models).
ENDPOINT_FAMILIES = frozenset(
    {
        "kembed_gateway_request_duration_seconds",
        "kembed_gateway_errors",
        "kembed_gateway_inflight_requests",
        "kembed_gateway_open_connections",
        "kembed_gateway_connections_closed",
    }
)


def render_models(endpoint: GatewayMetrics, models: Mapping[str, GatewayMetrics]) -> tuple[bytes, str]:
    """The exposition of an endpoint of several models: the edge's families from `endpoint`, and
    each model's own families from its metrics with a `model` label, one family a name."""
    families: dict[str, Metric] = {}
    endpoint.fold()
    for family in endpoint.registry.collect():
        if family.name in ENDPOINT_FAMILIES:
            families[family.name] = family
    for name, metrics in models.items():
        metrics.fold()
        for family in metrics.registry.collect():
            if family.name in ENDPOINT_FAMILIES:
                continue
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(family.name, family.documentation, family.type)
            merged.samples.extend(s._replace(labels={"model": name, **s.labels}) for s in family.samples)
    registry = CollectorRegistry()
    registry.register(_Families(list(families.values())))
    return generate_latest(registry), CONTENT_TYPE_LATEST


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        yield from self._families


class InfoCollector(Collector):
    """`kembed_gateway_info{model} 1`, the model read when Prometheus scrapes: it is known only once a
    worker has answered Info."""

    def __init__(self, served_name: Callable[[], str]) -> None:
        self._served_name = served_name

    def describe(self) -> Iterator[GaugeMetricFamily]:
        # Registration calls describe() instead of collect(): no model name is needed yet.
        yield GaugeMetricFamily("kembed_gateway_info", "", labels=["model"])

    def collect(self) -> Iterator[GaugeMetricFamily]:
        info = GaugeMetricFamily(
            "kembed_gateway_info", "What this gateway serves (always 1).", labels=["model"]
        )
        info.add_metric([self._served_name()], 1)
        yield info


class ServingCollector(Collector):
    """`kembed_gateway_serving_workers` and `kembed_gateway_refused_workers`, read from the worker
    pool when Prometheus scrapes. Each gateway process keeps its own pool, so the process that answers
    the scrape reports its own count (one of several processes: not summed, unlike the multiprocess
    gauges)."""

    def __init__(self, num_serving: Callable[[], int], num_refused: Callable[[], int]) -> None:
        self._num_serving = num_serving
        self._num_refused = num_refused

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("kembed_gateway_serving_workers", "")
        yield GaugeMetricFamily("kembed_gateway_refused_workers", "")

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "kembed_gateway_serving_workers",
            "Worker replicas serving now: healthy, not leaving, answered a health probe recently.",
            value=self._num_serving(),
        )
        yield GaugeMetricFamily(
            "kembed_gateway_refused_workers",
            "Worker replicas refused for serving another model than the one this gateway tokenizes for.",
            value=self._num_refused(),
        )


class RequestMetrics:
    """ASGI middleware, outermost: counts a request in flight and times it to its response's status,
    labelled by route. Requests refused by the API key check inside it are counted too."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics, routes: Collection[str]) -> None:
        self.app = app
        self._metrics = metrics
        self._routes = frozenset(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == METRICS_PATH:
            await self.app(scope, receive, send)
            return
        route = scope["path"] if scope["path"] in self._routes else UNMATCHED
        code = 500  # if the app fails before it starts a response
        started = time.perf_counter()

        async def send_status(message: Message) -> None:
            nonlocal code
            if message["type"] == "http.response.start":
                code = message["status"]
            await send(message)

        inflight = self._metrics.inflight_requests
        inflight.inc()
        try:
            await self.app(scope, receive, send_status)
        finally:
            inflight.dec()
            self._metrics.duration(route, code).observe(time.perf_counter() - started)
