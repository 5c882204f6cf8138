"""PromQL targets as dashboard panels want them: quantiles of a gateway or worker histogram with their
legends, per-second rates of gateway and worker series, worker gauges, all in the dashboards' scope
(promql.DASHBOARD).

A quantile or rate sums over the labels it does not keep, the worker's `class` among them; a gauge
with a `class` label is summed over it where a panel shows one series per pod (`worker_gauge_per_pod`).
"""

from __future__ import annotations

from kembed.monitoring import promql as q
from kembed.monitoring.panels import Query

S = q.DASHBOARD
QUANTILES = (0.5, 0.95, 0.99)


def legend(p: float, labels: tuple[str, ...]) -> str:
    return " ".join([f"p{p * 100:g}", *(f"{{{{{label}}}}}" for label in labels)])


def gateway_quantiles(
    metric: str, quantiles: tuple[float, ...], labels: tuple[str, ...] = (), *matchers: str
) -> list[Query]:
    buckets = q.of_gateways(q.rate(f"{metric}_bucket", S, *matchers), S)
    return [Query(q.quantile(p, buckets, labels), legend(p, labels)) for p in quantiles]


def request_latency(quantiles: tuple[float, ...], labels: tuple[str, ...]) -> list[Query]:
    """The gateway's request time on the routes that do work: the SLO alert's signal, by route."""
    work = q.routes(q.WORK_ROUTES)
    return [Query(q.gateway_latency(p, S, labels, work), legend(p, labels)) for p in quantiles]


def worker_quantiles(
    metric: str, quantiles: tuple[float, ...] = (0.5, 0.99), labels: tuple[str, ...] = ("revision",)
) -> list[Query]:
    buckets = q.of_workers(q.rate(f"{metric}_bucket", S), S)
    return [Query(q.quantile(p, buckets, labels), legend(p, labels)) for p in quantiles]


def gateway_rate(metric: str, labels: tuple[str, ...], *matchers: str) -> str:
    return f"sum {q.by(labels)} ({q.of_gateways(q.rate(metric, S, *matchers), S)})"


def worker_rate(metric: str, labels: tuple[str, ...], *matchers: str) -> str:
    return f"sum {q.by(labels)} ({q.of_workers(q.rate(metric, S, *matchers), S)})"


def worker_gauge(metric: str, *matchers: str) -> str:
    return q.of_workers(q.series(metric, S, *matchers), S)


def worker_gauge_per_pod(metric: str) -> str:
    """A worker gauge split by `class` (queued tokens), summed to one series per pod."""
    return q.of_workers(f"sum without (class) ({q.series(metric, S)})", S)
