"""The gateway's Prometheus metrics, on a registry of its own per app, and the ASGI middleware that
times every request.

Names and labels are a contract with the dashboards and alerts (docs/metrics.md). Labels stay
bounded: `route` is one of the app's route paths (none has parameters) or `unmatched`; `code` is an
HTTP status; `reason` is an error class's snake-case name. A registry per app (not prometheus_client's
global one) lets several gateways live in one process, as the tests run them; several gateway
processes on one port (processes.py) report the sum of their values.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
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
        self.connections_closed = Counter(
            "kembed_gateway_connections_closed",
            "Client connections the gateway closed itself, by reason: idle_timeout, header_timeout, "
            "body_timeout, headers_too_large, evicted_idle (to make room), too_many_connections.",
            ["reason"],
            registry=r,
        )

    def watch(self, served_name: Callable[[], str]) -> None:
        """Report `kembed_gateway_info{model}` at each scrape: the name this gateway serves (its
        workers' model unless configured), which dashboards and alerts join on (namespace, pod)."""
        collector = InfoCollector(served_name)
        self.registry.register(collector)
        self._collectors.append(collector)

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        if self._multiprocess_dir is None:
            return generate_latest(self.registry), CONTENT_TYPE_LATEST
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(self._multiprocess_dir))
        for collector in self._collectors:
            registry.register(collector)
        return generate_latest(registry), CONTENT_TYPE_LATEST


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
            self._metrics.request_duration.labels(route, str(code)).observe(time.perf_counter() - started)
