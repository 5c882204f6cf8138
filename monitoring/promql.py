"""PromQL that the dashboards and the alerts share: scoped selectors, the info joins that give a
series its model and revision, and quantiles over histograms.

A scrape through a PodMonitor or ServiceMonitor (the chart's for the operator, the operator's for the
gateway and workers) labels every series with the pod's `namespace` and `pod` (besides `job`,
`instance`, `container`, `endpoint`). What a pod serves is in its info metric:
`kembed_gateway_info{model}` and `kembed_worker_info{model, revision, dtype, attention_backend}`. So
`... * on (namespace, pod) group_left (model, revision) kembed_worker_info` gives any worker series its
model and revision, and a matcher on the info side keeps only the models and revisions asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# The routes that do work (embed, rerank, tokenize): probes, /info and /metrics are left out of
# latency and throughput, which they would only dilute.
WORK_ROUTES = ("/v1/embeddings", "/embed", "/rerank", "/v1/rerank", "/tokenize")
# The routes a latency SLO covers: the ones that reach the workers.
SLO_ROUTES = ("/v1/embeddings", "/embed", "/rerank", "/v1/rerank")


@dataclass(frozen=True)
class Scope:
    """What a query covers. Each matcher is PromQL label-matcher text (`namespace=~"$namespace"`) or
    empty for everything; `window` is the range of rate() and friends."""

    namespace: str = ""
    model: str = ""
    revision: str = ""
    window: str = "5m"


# Dashboards: Grafana's template variables (multi-valued, so regex matchers) and its rate interval.
DASHBOARD = Scope(
    namespace='namespace=~"$namespace"',
    model='model=~"$model"',
    revision='revision=~"$revision"',
    window="$__rate_interval",
)
# Alerts: every namespace, model and revision, each its own series.
ALERTS = Scope()


def routes(names: Sequence[str]) -> str:
    return f'route=~"{"|".join(names)}"'


def series(metric: str, scope: Scope, *matchers: str) -> str:
    """`metric` in the scope's namespaces (model and revision come from the info joins)."""
    parts = [m for m in (scope.namespace, *matchers) if m]
    return f"{metric}{{{', '.join(parts)}}}" if parts else metric


def rate(metric: str, scope: Scope, *matchers: str) -> str:
    return f"rate({series(metric, scope, *matchers)}[{scope.window}])"


def increase(metric: str, scope: Scope, *matchers: str, window: str | None = None) -> str:
    return f"increase({series(metric, scope, *matchers)}[{window or scope.window}])"


def of_workers(vector: str, scope: Scope) -> str:
    """`vector` (worker series, `namespace` and `pod` intact) with each pod's model and revision, kept
    to the scope's models and revisions."""
    info = series("kembed_worker_info", scope, scope.model, scope.revision)
    return f"({vector}) * on (namespace, pod) group_left (model, revision) {info}"


def of_gateways(vector: str, scope: Scope) -> str:
    """`vector` (gateway series) with each gateway pod's model, kept to the scope's models."""
    info = series("kembed_gateway_info", scope, scope.model)
    return f"({vector}) * on (namespace, pod) group_left (model) {info}"


def by(labels: Sequence[str]) -> str:
    return f"by ({', '.join(labels)})"


def quantile(q: float, buckets: str, labels: Sequence[str] = ()) -> str:
    """The q-quantile of `buckets` (rate()d `_bucket` series), one series per `labels` value set."""
    return f"histogram_quantile({q:g}, sum {by([*labels, 'le'])} ({buckets}))"


def ratio(part: str, whole: str) -> str:
    return f"({part}) / ({whole})"


# The signals both a dashboard panel and an alert show: one function each, so they cannot drift.


def gateway_latency(quantile_: float, scope: Scope, labels: Sequence[str], *matchers: str) -> str:
    """A quantile of the gateway's request time, per `labels` (route on a dashboard; namespace and
    model for the SLO alert)."""
    buckets = of_gateways(rate("kembed_gateway_request_duration_seconds_bucket", scope, *matchers), scope)
    return quantile(quantile_, buckets, labels)


def pinned_fraction(scope: Scope) -> str:
    """Pinned memory in use over its cap, per worker pod."""
    in_use = series("kembed_worker_pinned_memory_bytes", scope, 'state="in_use"')
    limit = series("kembed_worker_pinned_memory_limit_bytes", scope)
    return of_workers(f"max by (namespace, pod) ({in_use}) / max by (namespace, pod) ({limit})", scope)


def graph_steps(scope: Scope) -> tuple[str, str]:
    """(cold eager steps, cold steps plus graph replays) per second, per revision: the steps that
    could have used a graph, and those that found none: their bucket was cold (a worker that does
    not prewarm at start) or no captured bucket held them (`uncovered`, after prewarm)."""

    def steps(metric: str, *matchers: str) -> str:
        per_pod = of_workers(rate(metric, scope, *matchers), scope)
        return f"sum by (namespace, model, revision) ({per_pod})"

    cold = steps("kembed_worker_eager_steps_total", 'reason=~"cold|uncovered"')
    return cold, f"{cold} + {steps('kembed_worker_graph_replays_total')}"


def cold_fraction(scope: Scope) -> str:
    """The share of graph-eligible steps that ran cold, per revision (NaN where no step could use a
    graph, as on the CPU engine)."""
    return ratio(*graph_steps(scope))


def rollouts_blocked(window: str) -> str:
    """Rollouts the operator blocked within `window`, per operator pod."""
    blocked = increase("kembed_operator_rollouts_total", ALERTS, 'result="blocked"', window=window)
    return f"sum by (namespace, pod) ({blocked})"
