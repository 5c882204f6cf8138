"""The kembed alerts: one definition each, rendered two ways from it.

- `rule_groups(thresholds)`: Prometheus rule groups with numbers in place, what `promtool` checks and
  what the tests load into a real Prometheus;
- `chart_template()`: the chart's PrometheusRule (templates/prometheusrule.yaml, opt-in through
  `prometheusRule.enabled`), each threshold read from `prometheusRule.thresholds` in values.yaml.

An alert is a *signal* (the quantity, one series per thing it is about; the same PromQL as the
dashboard panel that shows it) compared with a threshold, optionally guarded (`and ...`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

import yaml

from kembed.monitoring import promql as q

# Cold hits on a pod that serves a step a minute are noise: the cold-hit alert needs at least this
# many graph-eligible steps per second (its 5-minute rate) before it speaks.
MIN_GRAPH_STEPS_PER_S = 0.1
# A near-idle gateway's ratio is all or nothing: a trickle of failures (one client's bad request
# retried every few minutes) holds it at 1 for as long as it lasts. The server-error alert needs
# about three failures in its 5-minute window; a quiet gateway's outage is KembedNoServingWorker's.
MIN_SERVER_ERRORS_PER_S = 0.01
GROUP = "kembed"


@dataclass(frozen=True)
class Thresholds:
    """The alerts' levels; the chart's `prometheusRule.thresholds` (camelCase) sets each one."""

    latency_p99_seconds: float = 0.5
    """Gateway p99 on the embedding and rerank routes, successful requests. Half a second leaves a
    sub-1B model on a GPU an order of magnitude of headroom; set it to your SLO."""

    pinned_memory_fraction: float = 0.9
    """Pinned memory in use over its cap (max_pinned_bytes), held 10 minutes: launches are about to
    wait for slots."""

    cold_hit_fraction: float = 0.2
    """Share of graph-eligible steps that found their bucket cold, held 10 minutes: the new
    revision's prewarm missed the buckets traffic hits."""

    server_error_fraction: float = 0.05
    """Share of answered requests on the routes that reach the workers that failed with a server
    error (5xx but 501), held 5 minutes. A pure outage is 1; 5 % is about what one replica of a few
    failing outright would leave after the gateway's retries. Set it from your error budget."""


DEFAULT_THRESHOLDS = Thresholds()


def values_key(field_name: str) -> str:
    head, *rest = field_name.split("_")
    return head + "".join(word.title() for word in rest)


@dataclass(frozen=True)
class Alert:
    """One alert: `signal op threshold` (and `guard`), held `for_` before it fires."""

    name: str
    signal: str
    threshold: str | None  # a Thresholds field, or None for the fixed `bound`
    for_: str
    severity: str
    summary: str
    description: str
    guard: str = ""
    op: str = ">"
    bound: str = "0"

    def expr(self, threshold: str) -> str:
        guard = f" and {self.guard}" if self.guard else ""
        return f"{self.signal} {self.op} {threshold}{guard}"

    def level(self, thresholds: Thresholds) -> str:
        return self.bound if self.threshold is None else f"{getattr(thresholds, self.threshold):g}"


def alerts() -> tuple[Alert, ...]:
    slo = (q.routes(q.SLO_ROUTES), 'code=~"2.."')
    _, graph_steps = q.graph_steps(q.ALERTS)
    per_model = ("namespace", "model")
    server_errors, _ = q.server_errors(q.ALERTS, per_model)
    return (
        Alert(
            name="KembedServerErrorsHigh",
            signal=q.server_error_fraction(q.ALERTS, per_model),
            threshold="server_error_fraction",
            for_="5m",
            severity="critical",
            summary="{{ $value | humanizePercentage }} of requests to {{ $labels.model }} in "
            "{{ $labels.namespace }} fail with a server error",
            description="The gateways have answered more than prometheusRule.thresholds.serverErrorFraction "
            "of the requests that reach the workers with a 5xx (501 aside; 504 included: the gateway's own "
            "deadline passed) for 5 minutes. 503 everywhere is no worker serving: see "
            "KembedNoServingWorker and the worker pods. The kembed / Throughput and errors dashboard "
            "splits errors by reason.",
            guard=f"on (namespace, model) ({server_errors}) > {MIN_SERVER_ERRORS_PER_S:g}",
        ),
        Alert(
            name="KembedNoServingWorker",
            signal=q.serving_workers(q.ALERTS, per_model),
            threshold=None,
            for_="5m",
            severity="critical",
            summary="No gateway of {{ $labels.model }} in {{ $labels.namespace }} has a worker to send to",
            description="Every gateway pod of the model has been up with no serving worker replica for 5 "
            "minutes: /ready answers 503 (the Service takes the gateways out of rotation, so requests may "
            "fail before they reach one) and every request that arrives is answered 503. Look at the worker "
            "pods (crash loops, NOT_SERVING after a stalled step, a model that does not load) and at the "
            "gateway's log for the addresses it probes.",
            op="==",
            bound="0",
        ),
        Alert(
            name="KembedLatencyP99AboveSLO",
            signal=q.gateway_latency(0.99, q.ALERTS, ("namespace", "model"), *slo),
            threshold="latency_p99_seconds",
            for_="10m",
            severity="warning",
            summary="p99 latency of {{ $labels.model }} in {{ $labels.namespace }} is "
            "{{ $value | humanizeDuration }}, above its SLO",
            description="The gateways' p99 request time on the embedding and rerank routes (successful "
            "requests, 5-minute rate) has been above prometheusRule.thresholds.latencyP99Seconds for 10 "
            "minutes. The kembed / Latency dashboard splits it by stage.",
        ),
        Alert(
            name="KembedPinnedMemoryNearCap",
            signal=q.pinned_fraction(q.ALERTS),
            threshold="pinned_memory_fraction",
            for_="10m",
            severity="warning",
            summary="Pinned memory of {{ $labels.pod }} is {{ $value | humanizePercentage }} of its cap",
            description="The worker's pinned result ring has been nearly all in flight for 10 minutes; when "
            "it is full the next batch waits. Raise max_pinned_bytes (or max_inflight_batches) or add "
            "replicas. The kembed / Pinned memory dashboard shows in use, reserved and limit per pod.",
        ),
        Alert(
            name="KembedColdHitRatioHigh",
            signal=q.cold_fraction(q.ALERTS),
            threshold="cold_hit_fraction",
            for_="10m",
            severity="warning",
            summary="{{ $value | humanizePercentage }} of graph-eligible steps of {{ $labels.model }} "
            "revision {{ $labels.revision }} ran cold",
            description="Steps are running eagerly because their CUDA graph bucket was never captured. "
            "Right after a rollout this means the prewarm missed the buckets traffic hits: list them in the "
            "spec's prewarm buckets. See the kembed / Graph cache dashboard.",
            guard=f"on (namespace, model, revision) ({graph_steps}) > {MIN_GRAPH_STEPS_PER_S:g}",
        ),
        Alert(
            name="KembedRolloutBlocked",
            signal=q.model_phase("Blocked"),
            threshold=None,
            for_="0m",
            severity="warning",
            summary="The rollout of EmbeddingModel {{ $labels.namespace }}/{{ $labels.model }} is blocked",
            description="Its new revision failed its prewarm or smoke test; the old revision keeps "
            "serving. `kubectl describe embeddingmodel -n {{ $labels.namespace }} {{ $labels.model }}` "
            "shows the RolloutBlocked condition and its reason. The alert stays while the model is "
            "Blocked: until a spec change retries the rollout or goes back to the serving revision.",
        ),
    )


def _rule(alert: Alert, threshold: str) -> dict[str, Any]:
    return {
        "alert": alert.name,
        "expr": alert.expr(threshold),
        "for": alert.for_,
        "labels": {"severity": alert.severity},
        "annotations": {"summary": alert.summary, "description": alert.description},
    }


def rule_groups(thresholds: Thresholds = DEFAULT_THRESHOLDS) -> list[dict[str, Any]]:
    """The alerts as Prometheus rule groups, thresholds in place."""
    rules = [_rule(a, a.level(thresholds)) for a in alerts()]
    return [{"name": GROUP, "rules": rules}]


HEADER = """\
{{- /*
Generated by `make dashboards` (python -P -m kembed.monitoring) from monitoring/alerts.py: edit that,
not this. The kembed alerts as a PrometheusRule for the Prometheus Operator, opt-in. Thresholds come
from prometheusRule.thresholds; the rollout alert needs the operator's metrics scraped
(metrics.enabled with metrics.serviceMonitor or metrics.podMonitor).
*/ -}}
{{- if .Values.prometheusRule.enabled }}
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: {{ include "kembed.fullname" . }}
  namespace: {{ default .Release.Namespace .Values.prometheusRule.namespace }}
  labels:
    {{- include "kembed.labels" . | nindent 4 }}
    {{- with .Values.prometheusRule.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
"""


def chart_template() -> str:
    """templates/prometheusrule.yaml: the rule groups with each threshold a values lookup, and the
    alerts' own `{{ $labels... }}` templates escaped from Helm."""
    rules = []
    for alert in alerts():
        if alert.threshold is None:
            threshold = alert.bound
        else:
            threshold = f"{{{{ .Values.prometheusRule.thresholds.{values_key(alert.threshold)} }}}}"
        rule = _rule(alert, threshold)
        rule["annotations"] = {key: _escape(text) for key, text in rule["annotations"].items()}
        rules.append(rule)
    body = yaml.safe_dump({"groups": [{"name": GROUP, "rules": rules}]}, sort_keys=False, width=1 << 16)
    indented = "".join(f"  {line}\n" for line in body.splitlines())
    return HEADER + indented + "{{- end }}\n"


def _escape(text: str) -> str:
    """Prometheus's `{{ ... }}` as Helm prints it verbatim: {{`{{ ... }}`}}."""
    return re.sub(r"\{\{(.*?)\}\}", lambda m: "{{`{{" + m.group(1) + "}}`}}", text)


def threshold_values() -> dict[str, float]:
    """values.yaml's prometheusRule.thresholds: the defaults, by camelCase key."""
    return {values_key(f.name): getattr(DEFAULT_THRESHOLDS, f.name) for f in fields(Thresholds)}
