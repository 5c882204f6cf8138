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

# The routes a latency SLO and the availability alert cover: the ones that reach the workers (OpenAI,
# TEI, Cohere v2 and Perplexity shapes). TEI's `POST /` is left out: its route label `/` is also
# `GET /`'s (info), which needs no worker.
SLO_ROUTES = (
    "/v1/embeddings",
    "/embed",
    "/rerank",
    "/v1/rerank",
    "/v2/embed",
    "/v2/rerank",
    "/v1/contextualizedembeddings",
    "/similarity",
    "/v1/embed",
    "/embed_sparse",
    "/embed_all",
)
# The routes that do work (those and tokenize): probes, /info and /metrics are left out of latency
# and throughput, which they would only dilute.
WORK_ROUTES = (*SLO_ROUTES, "/tokenize")
# Server errors an outage answers: 5xx but 501 (the model does not do what the route asks, e.g. a
# rerank of an embedding model: the client's mistake, answered the same way every time). 504 counts:
# it is the gateway's own deadline (request_timeout_s) passing, workers too slow or stuck.
SERVER_ERRORS = ('code=~"5.."', 'code!="501"')
# Requests the gateway answered: 499 is a client that left first (its work was cancelled), no answer.
ANSWERED = 'code!="499"'


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


def gateway_requests(scope: Scope, labels: Sequence[str], *matchers: str) -> str:
    """Requests per second on the routes that reach the workers, per `labels` (of the gateway pods and
    their model)."""
    counts = rate("kembed_gateway_request_duration_seconds_count", scope, routes(SLO_ROUTES), *matchers)
    return f"sum {by(labels)} ({of_gateways(counts, scope)})"


def server_errors(scope: Scope, labels: Sequence[str]) -> tuple[str, str]:
    """(server errors, requests answered) per second, per `labels`: what an outage looks like from
    the gateway (a gateway whose workers are all gone answers every request 503)."""
    return gateway_requests(scope, labels, *SERVER_ERRORS), gateway_requests(scope, labels, ANSWERED)


def server_error_fraction(scope: Scope, labels: Sequence[str]) -> str:
    """The share of answered requests that failed with a server error, per `labels`: 0 where none
    failed (a gateway that never answered a 5xx has no such series), NaN without traffic (a gateway
    nobody calls, or that its Service took out of rotation for its failed readiness probe, says
    nothing here; its serving workers do)."""
    failed, answered = server_errors(scope, labels)
    return ratio(f"{failed} or {answered} * 0", answered)


def serving_workers(scope: Scope, labels: Sequence[str]) -> str:
    """Worker replicas the best-placed gateway pod can send to, per `labels`: 0 is no gateway able to
    answer, traffic or not."""
    return f"max {by(labels)} ({of_gateways(series('kembed_gateway_serving_workers', scope), scope)})"


def model_phase(phase: str) -> str:
    """1 per EmbeddingModel in `phase` (0 in another), with the model's namespace as `namespace` (the
    operator exports it as `model_namespace`: a scrape's `namespace` is the operator pod's) and the
    operator pod dropped, so that an operator restart does not make a new series."""
    phases = series("kembed_operator_model_phase", ALERTS, f'phase="{phase}"')
    moved = f'label_replace({phases}, "namespace", "$1", "model_namespace", "(.*)")'
    return f"max by (namespace, model) ({moved})"
